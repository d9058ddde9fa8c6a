"""Clock offsets between the controller and each lab host, for the few cross-host times.

Every duration in `testbed.metrics` is taken on one host's clock. Where a time of one host
must be set against another's (a link change made by the controller against a device's
rounds), the host's clock offset is recorded beside the records, measured as NTP does over
one request/response: the controller reads its clock (t0), asks the host for its clock (th),
and reads its own again (t1); then

    offset = th - (t0 + t1) / 2        (host clock minus controller clock)
    error  = (t1 - t0) / 2             (the offset is within +- error)

The best (smallest-error) of several probes is kept. A host time t_host maps onto the
controller clock as t_host - offset.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockOffset:
    offset_s: float  # host clock minus controller clock
    error_s: float  # half the probe's round trip: |true offset - offset_s| <= error_s

    def to_controller(self, t_host: float) -> float:
        """A host time on the controller's clock."""
        return t_host - self.offset_s


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
