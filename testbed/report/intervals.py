"""The confidence interval of a mean, used for the figures' bands and compare's noisy metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MeanCI:
    """mean of n values with its two-sided t-interval: mean +- t(level, n-1) * sd / sqrt(n).
    With one value the interval is that value; with none, everything is None."""

    mean: float | None
    low: float | None
    high: float | None
    n: int


def mean_ci(values: list[float], level: float = 0.95) -> MeanCI:
    from scipy.stats import t

    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if len(v) == 0:
        return MeanCI(None, None, None, 0)
    m = float(v.mean())
    if len(v) == 1:
        return MeanCI(m, m, m, 1)
    half = float(t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return MeanCI(m, m - half, m + half, len(v))
