"""Clock offsets between the controller and each lab host, and the times of several hosts put
on one clock: the controller's.

Every duration in `testbed.metrics` is taken on one host's clock. Where a time of one host is
set against another's (a link change stamped where the link is impaired against a device's
rounds, a cut against the monitor's failover, the controller's start time against a device's
clock), each time is first moved onto the controller's clock with its host's offset,
measured as NTP does over one request/response: the controller reads its clock (t0), asks the
host for its clock (th), and reads its own again (t1); then

    offset = th - (t0 + t1) / 2        (host clock minus controller clock)
    error  = (t1 - t0) / 2             (the offset is within +- error)

The best (smallest-error) of several probes is kept. A host time t_host maps onto the
controller clock as t_host - offset (`ClockOffset.to_controller`, the one definition), and a
controller time onto the host's as t + offset (`to_host`). A difference of two hosts' times so
mapped is within +- (error_a + error_b) of the truth; the condition rows carry the largest
offset and error bound of the clocks they used (`clock_figures`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pandas as pd

Times = TypeVar("Times", float, np.ndarray)  # one time, or an array of them


@dataclass(frozen=True)
class ClockOffset:
    offset_s: float  # host clock minus controller clock
    error_s: float  # half the probe's round trip: |true offset - offset_s| <= error_s

    def to_controller(self, t_host: Times) -> Times:
        """A host time (or times) on the controller's clock."""
        return t_host - self.offset_s

    def to_host(self, t_controller: Times) -> Times:
        """A controller time on the host's clock (the inverse of `to_controller`)."""
        return t_controller + self.offset_s

    def columns(self) -> dict[str, float]:
        """The offset as the records carry it (`clock_offset_s`, `clock_offset_err_s`)."""
        return {"clock_offset_s": self.offset_s, "clock_offset_err_s": self.error_s}


CONTROLLER = ClockOffset(0.0, 0.0)
"""The controller's own clock, and that of any host that shares its kernel (a namespace host)."""


def offset_from_probe(t0: float, t_host: float, t1: float) -> ClockOffset:
    """The offset and its error bound from one probe (see the module docstring)."""
    return ClockOffset(t_host - (t0 + t1) / 2, (t1 - t0) / 2)


def measure_offset(
    remote_time: Callable[[], float],
    probes: int = 5,
    clock: Callable[[], float] = time.time,
) -> ClockOffset:
    """The smallest-error offset over `probes` calls of `remote_time` (the host's clock)."""
    best: ClockOffset | None = None
    for _ in range(probes):
        t0 = clock()
        t_host = remote_time()
        t1 = clock()
        probe = offset_from_probe(t0, t_host, t1)
        if best is None or probe.error_s < best.error_s:
            best = probe
    assert best is not None
    return best


def offsets_by_host(table: pd.DataFrame, key: str = "dev") -> dict[str, ClockOffset]:
    """host -> the offset its row carries (`clock_offset_s`, `clock_offset_err_s`), from a
    table keyed by host (the hosts table); a host whose clock was not measured is left out."""
    if table.empty or not {key, "clock_offset_s", "clock_offset_err_s"} <= set(table.columns):
        return {}
    rows = table.dropna(subset=["clock_offset_s", "clock_offset_err_s"])
    return {
        str(host): ClockOffset(float(offset), float(error))
        for host, offset, error in zip(
            rows[key], rows["clock_offset_s"], rows["clock_offset_err_s"]
        )
    }


def clock_figures(offsets: Iterable[ClockOffset]) -> dict[str, float | None]:
    """The clocks a condition's cross-host figures used, for its row: the largest |offset|
    applied (`clock_offset_max_s`) and the largest error bound (`clock_error_max_s`; a time
    between two hosts is within +- twice it). None where no clock was measured."""
    used = list(offsets)
    return {
        "clock_offset_max_s": max((abs(o.offset_s) for o in used), default=None),
        "clock_error_max_s": max((o.error_s for o in used), default=None),
    }
