"""Small statistics for link probes: percentiles, binomial intervals, loss runs (scipy)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, `q` in [0, 100]; NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def binomial_interval(n: int, p: float, level: float = 0.95) -> tuple[int, int]:
    """Central interval [k_lo, k_hi] of Binomial(n, p) lost counts holding `level` of them.

    A measured count outside it is evidence (at 1 - level) that the true rate is not `p`.
    p = 0 gives (0, 0) and p = 1 gives (n, n): a single stray packet is then a failure.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if n <= 0:
        return (0, 0)
    lo, hi = sps.binom.interval(level, n, p)
    return (int(lo), int(hi))


def rate_interval(lost: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson (exact) interval of the loss rate measured as `lost` of `n`."""
    if n <= 0:
        return (0.0, 1.0)
    ci = sps.binomtest(lost, n).proportion_ci(level, method="exact")
    return (float(ci.low), float(ci.high))


def loss_within(lost: int, n: int, p: float, level: float = 0.95) -> bool:
    """True if `lost` of `n` packets is inside the binomial interval of rate `p` (n=0: True)."""
    if n == 0:
        return True
    lo, hi = binomial_interval(n, p, level)
    return lo <= lost <= hi


def loss_runs(lost: Sequence[bool]) -> list[int]:
    """Lengths of the runs of consecutive losses in a packet sequence."""
    runs, n = [], 0
    for x in [*lost, False]:
        if x:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs
