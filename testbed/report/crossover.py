"""Where SLED wins, read off a run that sweeps `mode` over sled and centralized and the device
count: per setting of the other swept keys (RTT, target, draft hardware, answer length, ...),
each mode's system verified throughput over device count, the crossover (the smallest count
from which SLED's is at least the centralized server's at every larger count) and each mode's
capacity at CROSSOVER_RATE verified tok/s a device (`testbed.metrics.capacity.swept_capacity`).
Repetitions are averaged per count. The report's figure, its table and the dashboard's read
these; nothing else defines them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from testbed.metrics.capacity import swept_capacity

# the per-device rate the capacities are read at: the SLED paper's (and the seed capacity
# playbooks') 15 verified tok/s a device
CROSSOVER_RATE = 15.0
MODES = ("sled", "centralized")
LEFT_OUT = ("sweep.mode", "sweep.lab.devices", "sweep.repetition")
NEEDED = {"mode", "devices", "system_verified_tok_s", "device_verified_tok_s_min"}


@dataclass(frozen=True)
class Crossover:
    """One setting's two curves, where SLED overtakes, and each mode's capacity."""

    setting: str  # "key=value, ..." of the other swept keys ("" when there are none)
    curves: dict[str, pd.Series]  # mode -> mean system verified tok/s, indexed by devices
    capacity: dict[str, int]  # mode -> devices keeping CROSSOVER_RATE each

    @property
    def both(self) -> pd.Index:
        """The device counts both modes ran."""
        return self.curves["sled"].index.intersection(self.curves["centralized"].index)

    @property
    def wins_from(self) -> float | None:
        """The crossover (None: SLED does not stay ahead from any count both modes ran)."""
        sled, central = self.curves["sled"], self.curves["centralized"]
        return crossover([float(n) for n in self.both], list(sled[self.both]),
                         list(central[self.both]))  # fmt: skip

    @property
    def ahead_at(self) -> list[int]:
        """The counts at which SLED's verified throughput is at least the centralized one's."""
        sled, central = self.curves["sled"], self.curves["centralized"]
        return [int(n) for n in self.both if sled[n] >= central[n]]

    @property
    def ratio_at_most(self) -> float | None:
        """SLED over centralized at the largest count both ran."""
        if self.both.empty or not self.curves["centralized"][self.both.max()]:
            return None
        most = self.both.max()
        return float(self.curves["sled"][most] / self.curves["centralized"][most])


def crossover(devices: list[float], sled: list[float], central: list[float]) -> float | None:
    """The smallest device count from which SLED's verified throughput is at least the
    centralized server's at every larger count (None: nowhere)."""
    wins = [s >= c for s, c in zip(sled, central)]
    for i in range(len(devices)):
        if all(wins[i:]):
            return devices[i]
    return None


def crossovers(done: pd.DataFrame) -> list[Crossover]:
    """Per setting with both modes done: its curves, crossover and capacities. `done`: the
    run's finished conditions with their `devices` (testbed.report.data.RunData.done); none
    unless the run sweeps the device count and both modes."""
    if not set(done.columns) >= NEEDED or done["devices"].dropna().nunique() < 2:
        return []
    other = [c for c in done.columns if c.startswith("sweep.") and c not in LEFT_OUT]
    out = []
    for values, part in done.groupby(other, sort=False) if other else [((), done)]:
        keyed = zip(other, values if isinstance(values, tuple) else (values,))
        setting = ", ".join(f"{k.removeprefix('sweep.')}={v}" for k, v in keyed)
        curves, capacity = {}, {}
        for mode, rows in part.groupby("mode"):
            by_count = rows.groupby("devices")
            curves[str(mode)] = by_count["system_verified_tok_s"].mean()
            slowest = by_count["device_verified_tok_s_min"].mean()
            capacity[str(mode)] = swept_capacity(
                {int(n): None if pd.isna(v) else float(v) for n, v in slowest.items()},
                CROSSOVER_RATE,
            )
        if set(MODES) <= set(curves):
            out.append(Crossover(setting, curves, capacity))
    return out


def crossover_rows(points: list[Crossover]) -> tuple[list[str], list[list[str]]]:
    """The table of the report and the dashboard: one row per setting."""
    headers = ["setting", "SLED wins from", "SLED ahead at",
               f"capacity at {CROSSOVER_RATE:g} tok/s: SLED", "centralized",
               "SLED / centralized at the most devices"]  # fmt: skip
    cells = []
    for p in points:
        ratio = p.ratio_at_most
        cells.append([
            p.setting or "all",
            "never" if p.wins_from is None else f"{p.wins_from:g} devices",
            ", ".join(map(str, p.ahead_at)) or "-",
            str(p.capacity["sled"]),
            str(p.capacity["centralized"]),
            "-" if ratio is None else f"{ratio:.2f}",
        ])  # fmt: skip
    return headers, cells


CROSSOVER_NOTE = (
    "SLED wins from: the smallest device count from which SLED's system verified tok/s is at "
    "least the centralized server's at every larger swept count; SLED ahead at: every swept "
    "count where it is at least the centralized one's; capacity: the largest swept "
    f"count at which the slowest device keeps {CROSSOVER_RATE:g} verified tok/s (every smaller "
    "swept count keeping it too); repetitions averaged per count"
)
