"""`testbed bench balance`: the scheduler against the exact optimum, and its solve time.

On random instances (`instances.py`) the approximation algorithm, AD-only, SD-only and the
naive greedy are compared with the integer program's optimum: served users over the optimum's,
mean and worst, and whether the proven bound max(OPT - 2, min(OPT, 1)) held on every instance.
Solve time is the median of a few repeats per user count, wall clock and process CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from agents.balance.algorithm import schedule
from agents.balance.problem import Instance, Schedule, is_feasible
from testbed.balance.baselines import ad_only, naive_greedy, sd_only
from testbed.balance.exact import solve_exact
from testbed.balance.instances import random_instance

POLICIES: dict[str, Callable[[Instance], Schedule]] = {
    "hybrid (ours)": schedule,
    "AD-only": ad_only,
    "SD-only": sd_only,
    "naive greedy": naive_greedy,
}


def proven_bound(optimum: int) -> int:
    """Served users the algorithm guarantees (docs/balance.md, Theorem 3)."""
    return max(optimum - 2, min(optimum, 1))


@dataclass(frozen=True)
class SolveTime:
    wall_s: float
    cpu_s: float


@dataclass
class RatioResult:
    instances: int = 0
    ratios: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in POLICIES})
    bound_violations: int = 0
    infeasible: int = 0

    def mean(self, policy: str) -> float:
        return float(np.mean(self.ratios[policy]))

    def worst(self, policy: str) -> float:
        return float(np.min(self.ratios[policy]))


def ratio_bench(
    instances: int, min_users: int, max_users: int, seed: int, progress: Callable[[], None]
) -> RatioResult:
    """Each policy's served users over the optimum on random instances."""
    rng = np.random.default_rng(seed)
    out = RatioResult()
    for _ in range(instances):
        inst = random_instance(rng, int(rng.integers(min_users, max_users + 1)))
        optimum = solve_exact(inst).served
        for name, policy in POLICIES.items():
            sched = policy(inst)
            out.infeasible += not is_feasible(inst, sched.modes)
            out.ratios[name].append(sched.served / optimum if optimum else 1.0)
            if name == "hybrid (ours)" and sched.served < proven_bound(optimum):
                out.bound_violations += 1
        out.instances += 1
        progress()
    return out


def solve_times(user_counts: Iterable[int], repeats: int, seed: int) -> dict[int, SolveTime]:
    """Median wall and CPU seconds the algorithm takes per user count.

    CPU time is the process's own (all threads), so it holds on a loaded machine too.
    """
    rng = np.random.default_rng(seed)
    times = {}
    for n in user_counts:
        inst = random_instance(rng, n)
        wall, cpu = [], []
        for _ in range(repeats):
            w0, c0 = time.perf_counter(), time.process_time()
            schedule(inst)
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
        times[n] = SolveTime(float(np.median(wall)), float(np.median(cpu)))
    return times
