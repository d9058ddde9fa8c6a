"""The one statistics module: percentiles, binomial and Wilson intervals of a proportion,
t-intervals of a mean, loss runs (numpy, scipy). Metrics, link probes and calibration, and
reports all use these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """Linear-interpolated percentile, `q` in [0, 100]; None for no values."""
    return float(np.percentile(values, q)) if len(values) else None


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial proportion; None for n = 0."""
    if n == 0:
        return None
    ci = sps.binomtest(successes, n).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class MeanCI:
    """mean of n values with its two-sided t-interval: mean +- t(level, n-1) * sd / sqrt(n).
    With one value the interval is that value; with none, everything is None."""

    mean: float | None
    low: float | None
    high: float | None
    n: int


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> MeanCI:
    """The mean of the finite values and its t-interval (MeanCI)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if len(v) == 0:
        return MeanCI(None, None, None, 0)
    m = float(v.mean())
    if len(v) == 1:
        return MeanCI(m, m, m, 1)
    half = float(sps.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return MeanCI(m, m - half, m + half, len(v))


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
