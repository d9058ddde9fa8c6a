"""Capacity at a target rate, defined once, and the bisection that finds it over real runs.

capacity(R) = the largest device count n at which every device keeps at least R verified
tokens per second (`ConditionStats.device_verified_tok_s_min >= R`). Verified tokens are
the ones the target vouched for, so a device that falls back to its own drafts does not count
as served. The search assumes the per-device rate does not rise with more devices (the server
is shared), and bisects between a count that keeps R and one that does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CapacityResult:
    rate: float  # R, verified tokens/s per device
    capacity: int  # largest n measured to keep R (0: not even `low` does)
    measured: dict[int, float | None] = field(default_factory=dict)  # n -> min device rate

    def keeps(self, n: int) -> bool:
        value = self.measured.get(n)
        return value is not None and value >= self.rate


def capacity_search(
    measure: Callable[[int], float | None], rate: float, low: int = 1, high: int = 64
) -> CapacityResult:
    """Largest n in [low, high] with measure(n) >= rate, by bisection (each measure a run)."""
    if not 1 <= low <= high:
        raise ValueError(f"need 1 <= low <= high, got {low}, {high}")
    result = CapacityResult(rate, 0)

    def keeps(n: int) -> bool:
        if n not in result.measured:
            result.measured[n] = measure(n)
        return result.keeps(n)

    if not keeps(low):
        return result
    if keeps(high):
        result.capacity = high
        return result
    good, bad = low, high  # invariant: good keeps R, bad does not
    while bad - good > 1:
        mid = (good + bad) // 2
        if keeps(mid):
            good = mid
        else:
            bad = mid
    result.capacity = good
    return result


def swept_capacity(measured: dict[int, float | None], rate: float) -> int:
    """capacity(R) read off a sweep of device counts (no bisection): the largest swept count
    that keeps R with every smaller swept count keeping it too (0: the smallest does not)."""
    result = CapacityResult(rate, 0, measured)
    for n in sorted(measured):
        if not result.keeps(n):
            break
        result.capacity = n
    return result.capacity


def deciding_counts(capacity: int, probed: list[int]) -> list[int]:
    """The probed device counts whose verdicts fix the capacity, given that the per-device
    rate does not rise with more devices: the capacity and the count above it (the smallest
    probed count when none kept the rate, the largest when it did)."""
    if capacity == 0:
        return [min(probed)]
    if capacity == max(probed):
        return [capacity]
    return [capacity, capacity + 1]


def probes_faithful(probes: list[dict[str, Any]], capacity: int) -> bool:
    """Whether the probes that decide `capacity` all ran faithful (see `deciding_counts`)."""
    by_n = {p["devices"]: p for p in probes}
    return all(by_n[n]["faithful"] for n in deciding_counts(capacity, list(by_n)))
