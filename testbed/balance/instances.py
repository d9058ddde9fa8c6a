"""Random problem instances for the benchmark and the tests.

Demands follow the cost model's shape: a user's AD compute is its output over its deadline
(times a per-token cost), SD needs a fraction of that compute but more memory (both caches);
memory is the prompt plus output length. Capacities are drawn so that about a third to all of
the users could fit, and memory is tight in some instances and loose in others.
"""

from __future__ import annotations

import numpy as np

from agents.balance.problem import Instance


def random_instance(rng: np.random.Generator, n: int) -> Instance:
    prompt = rng.integers(16, 512, n)
    output = rng.integers(16, 512, n)
    deadline = rng.uniform(0.5, 8.0, n)
    ad_compute = output / deadline
    sd_speedup = rng.uniform(1.1, 3.0)  # per-token server time, AD over SD
    sd_compute = ad_compute / sd_speedup * rng.uniform(0.9, 1.1, n)  # acceptance varies
    kv_ratio = rng.uniform(1.05, 1.6)  # SD caches both models
    tokens = (prompt + output).astype(float)
    compute = np.stack([ad_compute, sd_compute], axis=1)
    memory = np.stack([tokens, kv_ratio * (tokens + 4)], axis=1)
    load = rng.uniform(0.8, 3.0)  # AD compute of everyone over the capacity
    mem_load = rng.uniform(0.3, 2.5)  # AD memory of everyone over the capacity
    setup = rng.uniform(0.0, 0.2) * mem_load
    return Instance(
        compute=compute / (ad_compute.sum() / load),
        memory=memory / (tokens.sum() / mem_load),
        compute_capacity=1.0,
        memory_capacity=1.0,
        setup_compute=np.zeros(2),
        setup_memory=np.array([0.0, setup]),
    )
