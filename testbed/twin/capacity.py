"""`testbed capacity --twin`: the capacity searched on the twin, then confirmed on the lab.

The bisection probes the twin (each probe one simulated condition at the probed device count,
its figure the same `device_verified_tok_s_min` a lab probe reads); the count it finds is then
run on the lab, at it and one device above (`testbed.runner.capacity.lab_probe`; the lowest
count alone when the twin found none keeping the rate, the highest when all did). The lab
confirms the twin when it keeps the rate exactly where the twin did; otherwise it says which
way the lab's capacity lies. `capacity.json` keeps the twin's probes (`twin_probes`)
beside the lab's (`probes`, which the report and dashboard read as any search's); its
`capacity` is the twin's, with `confirmed` and the lab's `verdict`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.config.playbook import Condition, expand
from testbed.metrics.capacity import CapacityResult, capacity_search
from testbed.runner.capacity import capacity_playbook, lab_probe, write_search
from testbed.twin.inputs import twin_condition
from testbed.twin.measured import MeasuredAcceptance, acceptance_record
from testbed.twin.run import simulated_figures


def confirming_counts(capacity: int, low: int, high: int) -> list[int]:
    """The lab probes that confirm a capacity the twin found in [low, high]: it and one device
    above; the lowest count alone when none kept the rate, the highest when all did."""
    if capacity == 0:
        return [low]
    if capacity == high:
        return [high]
    return [capacity, capacity + 1]


@dataclass
class TwinCapacity:
    """The twin's search and the lab's confirmation of what it found."""

    twin: CapacityResult
    lab: dict[int, float | None]  # device count -> the lab's figure
    rate: float

    def lab_keeps(self, devices: int) -> bool:
        figure = self.lab.get(devices)
        return figure is not None and figure >= self.rate

    @property
    def confirmed(self) -> bool:
        """The lab keeps the rate at every confirming count the twin kept it at, and misses
        it at the others."""
        n = self.twin.capacity
        return bool(self.lab) and all(self.lab_keeps(k) == (k <= n) for k in self.lab)

    @property
    def verdict(self) -> str:
        """The confirmation in words."""
        n = self.twin.capacity
        if self.confirmed:
            return f"the lab confirms {n} devices"
        above = [k for k in self.lab if k > n and self.lab_keeps(k)]
        if above:
            return f"the lab keeps the rate at {max(above)}: its capacity is above the twin's {n}"
        return f"the lab misses the rate at {n}: its capacity is below the twin's {n}"


def twin_probe(
    cond: Condition, source: str, devices: int, acceptance: float | MeasuredAcceptance | None
) -> dict[str, Any]:
    """One probe on the twin: the condition at `devices`, simulated."""
    figures = simulated_figures(cond, twin_condition(cond, source, acceptance, devices))
    return {"devices": devices, "figure": figures.get("device_verified_tok_s_min"),
            "status": "simulated"}  # fmt: skip


def twin_capacity(
    playbook: Path,
    rate: float,
    out: Path,
    low: int = 1,
    high: int = 64,
    say: Callable[[str], None] = print,
    mode: str | None = None,
    acceptance: float | MeasuredAcceptance | None = None,
) -> TwinCapacity:
    """Bisect on the twin, then run the lab at the capacity found and one device above."""
    pb = capacity_playbook(playbook, mode)
    (cond,) = expand(pb, str(playbook))
    out.mkdir(parents=True, exist_ok=True)
    twin_probes: list[dict[str, Any]] = []

    def on_twin(devices: int) -> float | None:
        twin_probes.append(twin_probe(cond, str(playbook), devices, acceptance))
        figure = twin_probes[-1]["figure"]
        say(f"twin probe: {devices} devices -> min verified {figure} tok/s per device")
        return figure

    found = capacity_search(on_twin, rate, low, high)
    confirm = confirming_counts(found.capacity, low, high)
    say(f"twin: capacity {found.capacity}; confirming on the lab at {confirm} devices")
    probes = [lab_probe(pb, n, out, say) for n in confirm]
    result = TwinCapacity(found, {p["devices"]: p["figure"] for p in probes}, rate)
    write_search(out, playbook, pb, rate, found.capacity, result.lab, probes,
                 searched_on="twin", confirmed=result.confirmed, verdict=result.verdict,
                 acceptance=acceptance_record(acceptance), twin_probes=twin_probes)  # fmt: skip
    return result
