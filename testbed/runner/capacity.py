"""`testbed capacity`: the largest device count that keeps a rate, by bisection over real runs.

Each probe is a whole run of the playbook (which must name one condition) with `lab.devices`
set to the probed count, written under one capacity folder; its figure is the condition's
`device_verified_tok_s_min` (see `testbed.metrics.capacity` for the definition).
`capacity.json` keeps every probe with its run, its time dilation and whether its compute was
faithful; the capacity is faithful when the probes that decide it (`deciding_counts`) were.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testbed.config.playbook import Playbook, expand, load_playbook
from testbed.core.errors import BadInputError
from testbed.core.files import atomic_write_json, atomic_write_text
from testbed.core.loading import validate
from testbed.metrics.capacity import CapacityResult, capacity_search, probes_faithful
from testbed.results.store import RunStore
from testbed.runner.run import execute


def capacity_playbook(playbook: Path, mode: str | None = None) -> Playbook:
    """The playbook a search probes (in `mode`, else its own); it must name one condition."""
    pb = load_playbook(playbook)
    if mode is not None:
        data = pb.model_dump(mode="json")
        data["mode"] = mode
        pb = validate(Playbook, data, f"{playbook} (--mode)")
    conditions = len(expand(pb, str(playbook)))
    if conditions != 1:
        raise BadInputError(
            f"{playbook}: sweep: capacity probes one condition per device count; "
            f"remove the sweep (it has {conditions} conditions)"
        )
    return pb


def lab_probe(pb: Playbook, devices: int, out: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """One probe: a whole run of the playbook at `devices`, under `out`; its figure is the
    condition's device_verified_tok_s_min (None for a faulted probe)."""
    data = copy.deepcopy(pb.model_dump(mode="json"))
    data["name"] = f"{pb.name}-n{devices}"
    data["lab"]["devices"] = devices
    path = out / "playbooks" / f"n{devices}.yaml"
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
    say(f"capacity probe: {devices} devices")
    outcome = execute(path, out=out / "runs", say=say)
    entries = RunStore(outcome.store.root).journal() if outcome.store else []
    entry = entries[0] if entries else {}
    metrics = entry.get("metrics") or {}
    # a faulted probe (an agent stopped early) measured no capacity: it gives no figure
    faulted = entry.get("status") == "faulted"
    figure = None if faulted else metrics.get("device_verified_tok_s_min")
    probe = {
        "devices": devices, "figure": figure, "status": entry.get("status"),
        "faithful": metrics.get("compute_faithful", True) is not False,
        "behind_share": metrics.get("behind_share"),
        "time_dilation": (entry.get("link") or {}).get("time_dilation"),
        "run": str(outcome.store.root.relative_to(out)) if outcome.store else None,
    }  # fmt: skip
    note = "" if probe["faithful"] else " (unfaithful: forwards behind their hardware)"
    note += f" (faulted: {entry.get('reason')})" if faulted else ""
    say(f"capacity probe: {devices} devices -> min verified {figure} tok/s per device{note}")
    return probe


def run_capacity(
    playbook: Path,
    rate: float,
    out: Path,
    low: int = 1,
    high: int = 64,
    say: Callable[[str], None] = print,
    mode: str | None = None,
) -> CapacityResult:
    """Bisect the device count of `playbook` for `rate` (in `mode`, else the playbook's);
    every probe's run lands in `out`."""
    pb = capacity_playbook(playbook, mode)
    out.mkdir(parents=True, exist_ok=True)
    probes: list[dict[str, Any]] = []

    def measure(devices: int) -> float | None:
        probes.append(lab_probe(pb, devices, out, say))
        return probes[-1]["figure"]

    result = capacity_search(measure, rate, low, high)
    write_search(out, playbook, pb, rate, result.capacity, result.measured, probes)
    return result


def write_search(
    out: Path, playbook: Path, pb: Playbook, rate: float, capacity: int,
    measured: dict[int, float | None], probes: list[dict[str, Any]], **extra: Any,
) -> None:  # fmt: skip
    """The search's `capacity.json`: the capacity, the lab's probes and `extra` keys."""
    atomic_write_json(
        out / "capacity.json",
        {"playbook": str(playbook), "rate": rate, "capacity": capacity, "measured": measured,
         "figure": "device_verified_tok_s_min", "mode": pb.mode, "paper": paper_capacity(pb),
         "faithful": probes_faithful(probes, capacity), "probes": probes, **extra},
    )  # fmt: skip


def paper_capacity(pb: Playbook) -> dict[str, object] | None:
    """The playbook's published capacity figure for its mode (`paper` section), if any."""
    for fig in pb.paper.figures if pb.paper else []:
        where = fig.where or {}
        if fig.metric == "capacity" and where.get("mode", pb.mode) == pb.mode:
            return {"label": fig.label, "value": fig.value, "why": fig.why,
                    "source": pb.paper.source}  # fmt: skip
    return None
