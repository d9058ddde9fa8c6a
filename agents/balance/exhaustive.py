"""Exhaustive search for small instances: every assignment of users to modes, the best
feasible one (the scheduler's exact fallback for a handful of users, and the independent
check of the integer program)."""

from __future__ import annotations

import itertools

import numpy as np

from agents.balance.problem import AD, SD, UNSERVED, Instance, Schedule, is_feasible, schedule_of

EXHAUSTIVE_LIMIT = 12  # 3^12 = 531,441 assignments


def solve_exhaustive(inst: Instance, allowed: tuple[int, ...] = (AD, SD)) -> Schedule:
    """An optimal schedule by trying every assignment (n <= EXHAUSTIVE_LIMIT)."""
    n = len(inst)
    if n > EXHAUSTIVE_LIMIT:
        raise ValueError(f"exhaustive search takes at most {EXHAUSTIVE_LIMIT} users, got {n}")
    best = np.zeros(n, dtype=np.int8)
    best_served = 0
    for combo in itertools.product((UNSERVED, *allowed), repeat=n):
        modes = np.array(combo, dtype=np.int8)
        served = int((modes != UNSERVED).sum())
        if served > best_served and is_feasible(inst, modes):
            best, best_served = modes, served
    return schedule_of(inst, best)
