"""The scheduler: resource allocation by LP relaxation, then user scheduling by rounding.

For each set of open modes (AD, SD, both) the setups are paid, and the LP relaxation of the
rest is solved to a vertex (HiGHS dual simplex). The vertex has at most two fractional users
(docs/balance.md, Lemma 2); they are dropped, every user the vertex serves whole keeps its
mode, then a greedy pass adds any left-out user that still fits. The best set of open modes
wins, so the hybrid schedule serves at least as many users as AD-only or SD-only (each is one
of the sets), and at least max(OPT - 2, min(OPT, 1)) users (docs/balance.md, Theorem 3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import OptimizeResult, linprog
from scipy.sparse import csr_array, hstack, identity, vstack

from agents.balance.exhaustive import solve_exhaustive
from agents.balance.problem import AD, SD, UNSERVED, Instance, Schedule, schedule_of

MODE_SETS: tuple[tuple[int, ...], ...] = ((AD,), (SD,), (AD, SD))
INTEGRAL = 1 - 1e-7  # an LP value at least this is a whole user
SMALL = 4  # at most this many users: exhaustive search (3^4 assignments)


def schedule(inst: Instance, allowed: tuple[int, ...] = (AD, SD)) -> Schedule:
    """The approximation algorithm; `allowed` restricts the modes (AD-only, SD-only)."""
    candidates = [schedule_of(inst, np.zeros(len(inst), dtype=np.int8))]
    for modes in (s for s in MODE_SETS if set(s) <= set(allowed)):
        if len(inst) <= SMALL:  # optimal, and cheaper than an LP
            candidates.append(solve_exhaustive(inst, modes))
        else:
            candidates.append(schedule_of(inst, _solve_open(inst, modes)))
    return max(candidates, key=lambda c: (c.served, -_bottleneck(inst, c)))


def served_all_open(inst: Instance, modes: tuple[int, ...]) -> int:
    """Users the algorithm serves with every mode of `modes` open (all their setups paid)."""
    cols = [m - 1 for m in modes]
    paid = replace(
        inst,
        compute_capacity=inst.compute_capacity - inst.setup_compute[cols].sum(),
        memory_capacity=inst.memory_capacity - inst.setup_memory[cols].sum(),
        setup_compute=np.zeros(2),
        setup_memory=np.zeros(2),
    )
    if paid.compute_capacity < 0 or paid.memory_capacity < 0:
        return 0
    return schedule(paid, modes).served


def prices(inst: Instance, modes: tuple[int, ...]) -> tuple[float, float]:
    """Shadow prices of compute and memory (per unit of each) in the LP with `modes` open.

    They are the LP's dual values: serving one more user is worth 1, so at the LP optimum a
    user is served only if its demands, priced, cost at most 1 (docs/balance.md, section 4).
    Zero when nothing fits or nothing binds.
    """
    lp = _open_lp(inst, modes)
    if lp is None or lp.cap_c <= 0 or lp.cap_m <= 0 or len(lp.users) == 0:
        return 0.0, 0.0
    price_c, price_m = -lp.solve().ineqlin.marginals[:2]  # linprog minimises -sum(x)
    return max(float(price_c), 0.0) / lp.cap_c, max(float(price_m), 0.0) / lp.cap_m


def _bottleneck(inst: Instance, sched: Schedule) -> float:
    """The larger fraction of a capacity a schedule uses (ties go to the one leaving more)."""
    return max(
        sched.usage.compute / max(inst.compute_capacity, 1e-300),
        sched.usage.memory / max(inst.memory_capacity, 1e-300),
    )


@dataclass(frozen=True)
class _OpenLP:
    """The LP relaxation with `cols` open: demands as shares of what the setups leave."""

    cols: list[int]
    cap_c: float
    cap_m: float
    comp: np.ndarray  # n x len(cols)
    mem: np.ndarray
    fits: np.ndarray  # whether a user fits alone in each mode
    users: np.ndarray  # those that fit some mode: the LP's users

    def solve(self) -> OptimizeResult:
        ok = self.fits[self.users]  # a mode a user cannot fit alone has its variable fixed at 0
        comp, mem = self.comp[self.users], self.mem[self.users]
        return _lp(np.where(ok, comp, 0), np.where(ok, mem, 0), ok)


def _open_lp(inst: Instance, modes: tuple[int, ...]) -> _OpenLP | None:
    """The LP of `inst` with `modes` open (setups paid); None when a setup does not fit."""
    cols = [m - 1 for m in modes]
    cap_c = float(inst.compute_capacity - inst.setup_compute[cols].sum())
    cap_m = float(inst.memory_capacity - inst.setup_memory[cols].sum())
    if cap_c < 0 or cap_m < 0 or len(inst) == 0:
        return None
    comp = inst.compute[:, cols] / cap_c if cap_c > 0 else np.where(inst.compute[:, cols] > 0, 2, 0)
    mem = inst.memory[:, cols] / cap_m if cap_m > 0 else np.where(inst.memory[:, cols] > 0, 2, 0)
    fits = (comp <= 1) & (mem <= 1)
    return _OpenLP(cols, cap_c, cap_m, comp, mem, fits, np.flatnonzero(fits.any(axis=1)))


def _solve_open(inst: Instance, modes: tuple[int, ...]) -> np.ndarray:
    """Round the LP of `inst` with `modes` open (setups paid) and fill greedily."""
    assigned = np.zeros(len(inst), dtype=np.int8)
    lp = _open_lp(inst, modes)
    if lp is None or len(lp.users) == 0:
        return assigned
    x = lp.solve().x.reshape(len(lp.cols), len(lp.users)).T
    whole = x >= INTEGRAL
    for k, col in enumerate(lp.cols):
        assigned[lp.users[whole[:, k]]] = col + 1
    _repair(assigned, lp.comp, lp.mem, lp.cols)
    _fill(assigned, lp.comp, lp.mem, lp.fits, lp.cols)
    return assigned


def _lp_vertex(comp: np.ndarray, mem: np.ndarray, fits: np.ndarray) -> np.ndarray:
    """A vertex of max sum(x) s.t. sum(comp x) <= 1, sum(mem x) <= 1, per-user sum <= 1."""
    n, k = comp.shape
    return _lp(comp, mem, fits).x.reshape(k, n).T


def _lp(comp: np.ndarray, mem: np.ndarray, fits: np.ndarray) -> OptimizeResult:
    """Solve that LP (HiGHS dual simplex); the result holds the vertex and the duals."""
    n, k = comp.shape
    resources = csr_array(np.vstack([comp.T.ravel(), mem.T.ravel()]))
    if k > 1:  # with one mode, "at most one mode per user" is the variable's bound
        resources = vstack([resources, hstack([identity(n, format="csr")] * k)])
    a_ub = resources.tocsr()
    b_ub = np.ones(a_ub.shape[0])
    upper = fits.T.ravel().astype(float)  # a mode a user cannot fit alone stays at 0
    res = linprog(
        -np.ones(n * k),
        A_ub=a_ub,
        b_ub=b_ub,
        bounds=np.stack([np.zeros(n * k), upper], axis=1),
        method="highs-ds",
    )
    if res.status != 0:
        raise RuntimeError(f"balance scheduler: LP relaxation failed ({res.message})")
    return res


def _repair(assigned: np.ndarray, comp: np.ndarray, mem: np.ndarray, cols: list[int]) -> None:
    """Drop the largest users while the rounded vertex exceeds a capacity (solver tolerance)."""
    while True:
        rows = np.flatnonzero(assigned != UNSERVED)
        idx = np.searchsorted(np.array(cols), assigned[rows] - 1)
        used_c, used_m = comp[rows, idx], mem[rows, idx]
        if used_c.sum() <= 1 + 1e-12 and used_m.sum() <= 1 + 1e-12:
            return
        assigned[rows[np.argmax(used_c + used_m)]] = UNSERVED


def _fill(
    assigned: np.ndarray, comp: np.ndarray, mem: np.ndarray, fits: np.ndarray, cols: list[int]
) -> None:
    """Add left-out users, smallest combined demand first, to the open mode that fits best."""
    chosen = assigned != UNSERVED
    col_of = np.array(cols)
    idx = np.searchsorted(col_of, assigned[chosen] - 1)
    rows = np.flatnonzero(chosen)
    free_c = 1 - comp[rows, idx].sum()
    free_m = 1 - mem[rows, idx].sum()
    size = np.where(fits, comp + mem, np.inf)
    rest = np.flatnonzero(~chosen & fits.any(axis=1))
    for i in rest[np.argsort(size[rest].min(axis=1), kind="stable")]:
        ok = (comp[i] <= free_c + 1e-12) & (mem[i] <= free_m + 1e-12)
        if not ok.any():
            continue
        k = int(
            np.argmin(
                np.where(ok, comp[i] / max(free_c, 1e-12) + mem[i] / max(free_m, 1e-12), np.inf)
            )
        )
        assigned[i] = cols[k] + 1
        free_c -= comp[i, k]
        free_m -= mem[i, k]
