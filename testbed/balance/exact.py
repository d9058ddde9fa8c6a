"""Exact optima for small instances: an integer program (HiGHS).

The integer program has x[i, m] = 1 when user i is served in mode m and y[m] = 1 when mode m
is open (its setup paid); x[i, m] <= y[m]. Exhaustive search
(`agents.balance.exhaustive`) enumerates all 3^n assignments and is its independent check in
the tests.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array, hstack, identity, vstack

from agents.balance.problem import UNSERVED, Instance, Schedule, schedule_of


def solve_exact(inst: Instance, time_limit_s: float = 60.0) -> Schedule:
    """An optimal schedule by integer programming (HiGHS branch and bound)."""
    n = len(inst)
    if n == 0:
        return schedule_of(inst, np.zeros(0, dtype=np.int8))
    nx = 2 * n  # x[i, AD] for all i, then x[i, SD]
    resources = np.zeros((2, nx + 2))
    resources[0, :nx] = inst.compute.T.ravel()
    resources[1, :nx] = inst.memory.T.ravel()
    resources[0, nx:] = inst.setup_compute
    resources[1, nx:] = inst.setup_memory
    per_user = hstack([identity(n), identity(n), csr_array((n, 2))])
    link = hstack(
        [identity(nx), -csr_array(np.repeat(np.eye(2), n, axis=0))]
    )  # x[i, m] - y[m] <= 0
    a = vstack([csr_array(resources), per_user, link]).tocsr()
    upper = np.concatenate(
        [[inst.compute_capacity, inst.memory_capacity], np.ones(n), np.zeros(nx)]
    )
    res = milp(
        c=np.concatenate([-np.ones(nx), np.zeros(2)]),
        constraints=LinearConstraint(a, -np.inf, upper),
        integrality=np.ones(nx + 2),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit_s, "mip_rel_gap": 0.0},
    )
    if res.status != 0:
        raise RuntimeError(f"balance exact solver: HiGHS did not prove optimality ({res.message})")
    x = np.round(res.x[:nx]).reshape(2, n).T
    modes = np.where(x[:, 0] > 0.5, 1, np.where(x[:, 1] > 0.5, 2, UNSERVED)).astype(np.int8)
    return schedule_of(inst, modes)
