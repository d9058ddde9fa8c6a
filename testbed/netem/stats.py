"""Small statistics for link probes: percentiles and the binomial acceptance interval."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, `q` in [0, 100]; NaN for no values."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def binomial_interval(n: int, p: float, level: float = 0.95) -> tuple[int, int]:
    """Central interval [k_lo, k_hi] holding at least `level` of Binomial(n, p) counts.

    A measured count outside it is evidence (at 1 - level) that the true rate is not `p`.
    p = 0 gives (0, 0) and p = 1 gives (n, n): a single stray packet is then a failure.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if n <= 0:
        return (0, 0)
    if p == 0:
        return (0, 0)
    if p == 1:
        return (n, n)
    tail = (1 - level) / 2
    lp, lq = math.log(p), math.log1p(-p)
    cdf = 0.0
    k_lo = k_hi = None
    for k in range(n + 1):
        cdf += math.exp(
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq
        )
        if k_lo is None and cdf > tail:
            k_lo = k
        if cdf >= 1 - tail:
            k_hi = k
            break
    return (k_lo if k_lo is not None else 0, k_hi if k_hi is not None else n)


def loss_within(lost: int, n: int, p: float, level: float = 0.95) -> bool:
    """True if `lost` of `n` packets is inside the binomial interval of rate `p` (n=0: True)."""
    if n == 0:
        return True
    lo, hi = binomial_interval(n, p, level)
    return lo <= lost <= hi
