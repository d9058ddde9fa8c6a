"""When each request of a device arrives: the workload's arrival process.

- closed loop: a request arrives when the previous answer is complete (no offsets);
- Poisson at rate r per second: inter-arrival gaps are exponential with mean 1/r, drawn from
  `numpy.random.default_rng(seed)`, so a seed gives the same schedule on every machine.

Offsets are seconds from the device agent's start (after its handshake), on its own clock.
A request that arrives while the device is still answering waits; its latency counts from
its arrival.
"""

from __future__ import annotations

import numpy as np


def poisson_offsets(n: int, rate_per_s: float, seed: int) -> list[float]:
    """Arrival offsets of n requests of a Poisson process of rate_per_s (first gap included)."""
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=n)
    return np.cumsum(gaps).tolist()
