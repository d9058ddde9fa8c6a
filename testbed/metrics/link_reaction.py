"""How the devices met their links' changes: figures that set a time of one host against a
time of another, each moved onto the controller's clock first (`testbed.metrics.clocks`).

The `link_changes` table holds, on the controller's clock, each profile phase the packet
holder applied to a device's link (`kind` "change": a schedule step, a trace row, a cut, a
heal) and each failover of the backup path's monitor (`kind` "failover"). A device's rounds are
on its own clock; its offset (from the hosts table) moves them onto the controller's.

- reaction_s, per change or failover of a device's link at t: from t to the end of the
  device's first round begun at or after t (on the controller's clock): how long until the
  device had a round wholly under the new link (after a cut, the round that fell back after
  its timeout; after a failover, the first round verified over the backup). None for a change
  before the device's first round or after its last one, or on a device whose clock was not
  measured.
- failover_s, per failover of a device at t: from the last change of the device's primary
  link at or before t (phase 1 or later: the cut, usually) to t.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from testbed.metrics.clocks import ClockOffset


def device_of(link: str) -> str:
    """The device of a link label (`dev1`, `dev1/backup`: testbed.links.nfqueue.link_label)."""
    return str(link).split("/", 1)[0]


def _is_event(changes: pd.DataFrame) -> pd.Series:
    """Rows a device can react to: a phase after the first (the first is the profile being
    applied, before the agents start) or a failover."""
    stepped = pd.to_numeric(changes["phase"], errors="coerce").fillna(0) >= 1
    return (changes["kind"] == "failover") | ((changes["kind"] == "change") & stepped)


def reactions_s(
    changes: pd.DataFrame, rounds: pd.DataFrame, clocks: Mapping[str, ClockOffset]
) -> list[float | None]:
    """reaction_s of each row of `changes` (module docstring), aligned with its rows; `clocks`:
    device -> its offset (a device missing gets None)."""
    if changes.empty:
        return []
    runs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for dev, part in rounds.groupby("dev") if not rounds.empty else ():
        clock = clocks.get(str(dev))
        if clock is None:
            continue
        part = part.sort_values("t_start")
        runs[str(dev)] = (
            clock.to_controller(part["t_start"].to_numpy(dtype=float)),
            clock.to_controller(part["t_end"].to_numpy(dtype=float)),
        )
    out: list[float | None] = []
    for link, t, event in zip(changes["dev"], changes["t"], _is_event(changes)):
        starts, ends = runs.get(device_of(link), (np.zeros(0), np.zeros(0)))
        if not event or len(starts) == 0 or pd.isna(t) or t < starts[0]:
            out.append(None)
            continue
        i = int(np.searchsorted(starts, float(t), side="left"))
        out.append(float(ends[i] - t) if i < len(starts) else None)
    return out


def failovers_s(changes: pd.DataFrame) -> np.ndarray:
    """failover_s of each failover in `changes` (module docstring) that follows a change of
    its device's primary link."""
    if changes.empty:
        return np.zeros(0)
    steps = changes[_is_event(changes) & (changes["kind"] == "change")]
    out = []
    for dev, t in changes.loc[changes["kind"] == "failover", ["dev", "t"]].itertuples(index=False):
        before = steps.loc[(steps["dev"] == dev) & (steps["t"] <= t), "t"]
        if len(before):
            out.append(float(t - before.max()))
    return np.asarray(out, dtype=float)
