"""Admission control: a user the schedule cannot serve in time is refused at once, with a reason.

At each period boundary the users who arrived during the period are admitted by the scheduler
(`algorithm.schedule`) on the compute share and memory still free, without moving anyone
already admitted; each user left out is refused and told which resource is short. Which
modes may open is planned on a window of recent arrivals (`plan_modes`).
The plan also prices compute and memory (its LP's dual values); the hybrid then admits each
arrival into the open mode where its priced demand is least, and refuses one whose priced
demand is too high (`offer_priced`). A user's compute demand is its work over its deadline;
it keeps that share until it finishes, when `release` returns both resources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.modes import AD, MODE_NAMES, SD, UNSERVED
from testbed.balance.algorithm import prices, schedule, served_all_open
from testbed.balance.problem import Instance, Schedule


@dataclass(frozen=True)
class Decision:
    mode: int  # UNSERVED when refused
    reason: str

    @property
    def admitted(self) -> bool:
        return self.mode != UNSERVED


def refusal_reason(compute: np.ndarray, memory: np.ndarray, free_c: float, free_m: float) -> str:
    """Why a user with demands (AD, SD) fits in neither mode, naming the short resource."""
    if compute.min() > 1:
        return (
            f"deadline too short: even alone it needs {compute.min():.2f}x the server's time "
            "before its deadline"
        )
    best = int(np.argmin(compute))
    parts = []
    if compute[best] > free_c:
        parts.append(f"compute: needs {compute[best]:.3f} of the server's time, {free_c:.3f} free")
    if memory[best] > free_m:
        parts.append(f"memory: needs {memory[best] / 2**20:.1f} MiB, {free_m / 2**20:.1f} MiB free")
    detail = "; ".join(parts) or "setup of the other mode does not fit"
    return f"no mode fits ({MODE_NAMES[best + 1]} would be cheapest): {detail}"


def refusals(inst: Instance, sched: Schedule) -> dict[int, str]:
    """Reasons for every user an offline schedule leaves out."""
    free_c = inst.compute_capacity - sched.usage.compute
    free_m = inst.memory_capacity - sched.usage.memory
    return {
        int(i): refusal_reason(inst.compute[i], inst.memory[i], free_c, free_m)
        for i in np.flatnonzero(sched.modes == UNSERVED)
    }


PLAN_HEADROOM = 0.9  # the plan fills this share of each capacity: arrivals come in bursts
PRICE_LIMIT = 1.5  # a user whose priced demand exceeds this is refused (the LP's cut-off is 1)
PRICE_MIN_USERS = 5  # a plan on fewer arrivals sets no prices: too few to tell what binds


@dataclass(frozen=True)
class Plan:
    """Which modes may open, and what compute and memory are worth (the plan LP's duals).

    A user's priced demand in mode m is (price_compute u_im + price_memory w_im) times its
    hold, the share of the plan's window it holds them (its deadline over the window's span).
    """

    modes: tuple[int, ...]
    allowed: tuple[int, ...] = (AD, SD)
    priced: bool = False  # False: too few arrivals to price; admit by the scheduler
    price_compute: float = 0.0
    price_memory: float = 0.0
    span_s: float = 1.0

    def cost(self, compute: np.ndarray, memory: np.ndarray, deadline: float) -> np.ndarray:
        """A user's priced demand in each mode (columns AD, SD)."""
        hold = deadline / self.span_s
        finite = np.isfinite(compute)  # inf: the mode cannot step fast enough for the user
        c = np.where(finite, compute, 0.0)
        return np.where(
            finite, (self.price_compute * c + self.price_memory * memory) * hold, np.inf
        )


def plan_modes(
    inst: Instance,
    window: np.ndarray,
    deadline: np.ndarray,
    span_s: float,
    allowed: tuple[int, ...],
) -> Plan:
    """Plan on a window of recent arrivals: the modes worth opening and the resources' prices.

    The window's users arrived over span_s seconds and each holds its share for about its
    deadline, so over the span it takes its demands times deadline / span_s on average
    (Little's law): the plan solves that time-averaged problem, at PLAN_HEADROOM of each
    capacity, which sees the resource that binds in the long run, where admitting each
    period's few arrivals on what is free cannot. Both modes open when the scheduler uses
    both, or when paying both setups still serves as many (a user only the other mode can
    serve in time then finds it open). Fewer than PRICE_MIN_USERS arrivals set no prices.
    """
    hold = deadline[window] / span_s
    sub = Instance(
        compute=inst.compute[window] * hold[:, None],
        memory=inst.memory[window] * hold[:, None],
        compute_capacity=inst.compute_capacity * PLAN_HEADROOM,
        memory_capacity=inst.memory_capacity * PLAN_HEADROOM,
        setup_compute=inst.setup_compute,
        setup_memory=inst.setup_memory,
    )
    best = schedule(sub, allowed)
    modes = tuple(m for m in allowed if (best.modes == m).any()) or allowed
    if len(modes) < len(allowed) and served_all_open(sub, allowed) >= best.served:
        modes = allowed
    if len(window) < PRICE_MIN_USERS:
        return Plan(modes, allowed)
    return Plan(modes, allowed, True, *prices(sub, modes), span_s)


class AdmissionController:
    """Online admission against the free compute share and memory of one server."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.free_compute = inst.compute_capacity
        self.free_memory = inst.memory_capacity
        self.members = {AD: 0, SD: 0}

    def offer_batch(self, users: np.ndarray, allowed: tuple[int, ...] = (AD, SD)) -> list[Decision]:
        """Admit the most of the users arriving in one period (the scheduler on what is free).

        Users already admitted are never moved; each new one gets a mode or a refusal now.
        """
        users = np.asarray(users, dtype=int)
        sub = Instance(
            compute=self.inst.compute[users],
            memory=self.inst.memory[users],
            compute_capacity=self.free_compute,
            memory_capacity=self.free_memory,
            setup_compute=np.array(
                [self.inst.setup_compute[m - 1] * (self.members[m] == 0) for m in (AD, SD)]
            ),
            setup_memory=np.array(
                [self.inst.setup_memory[m - 1] * (self.members[m] == 0) for m in (AD, SD)]
            ),
        )
        sched = schedule(sub, allowed)
        for k, i in enumerate(users):
            if sched.modes[k] != UNSERVED:
                self._take(int(sched.modes[k]), self.inst.compute[i], self.inst.memory[i], 1)
        reasons = refusals(sub, sched)
        return [
            Decision(int(m), reasons.get(k, f"admitted in {MODE_NAMES[int(m)]}"))
            for k, m in enumerate(sched.modes)
        ]

    def offer_priced(self, users: np.ndarray, plan: Plan, deadline: np.ndarray) -> list[Decision]:
        """Admit the period's arrivals by the plan's prices, cheapest priced demand first.

        Each user goes to the open mode whose priced demand is least among those that fit
        what is free; it is refused when none fits, or when even its cheapest priced demand
        exceeds PRICE_LIMIT (it would take capacity that serves more users later). A user no
        open mode can serve in time may open a mode the plan left shut, if it fits now.
        """
        users = np.asarray(users, dtype=int)
        cols = [m - 1 for m in plan.modes]
        priced = {
            int(i): plan.cost(self.inst.compute[i], self.inst.memory[i], deadline[i]) for i in users
        }
        decisions: dict[int, Decision] = {}
        for i in sorted(priced, key=lambda u: priced[u][cols].min()):
            modes = plan.modes
            if not np.isfinite(priced[i][cols]).any():  # only a mode the plan left shut can
                modes = tuple(m for m in plan.allowed if np.isfinite(priced[i][m - 1]))
            fit = [m for m in modes if self._fits(i, m)]
            cheapest = float(priced[i][[m - 1 for m in modes]].min()) if modes else np.inf
            if cheapest > PRICE_LIMIT:
                decisions[i] = Decision(
                    UNSERVED,
                    f"not worth its share: priced demand {cheapest:.2f} above {PRICE_LIMIT} "
                    "(the plan's prices of compute and memory)",
                )
            elif not fit:
                decisions[i] = Decision(
                    UNSERVED,
                    refusal_reason(
                        self.inst.compute[i],
                        self.inst.memory[i],
                        self.free_compute,
                        self.free_memory,
                    ),
                )
            else:
                mode = min(fit, key=lambda m: priced[i][m - 1])
                self._take(mode, self.inst.compute[i], self.inst.memory[i], 1)
                decisions[i] = Decision(mode, f"admitted in {MODE_NAMES[mode]}")
        return [decisions[int(i)] for i in users]

    def _fits(self, i: int, mode: int) -> bool:
        """Whether user i fits in mode now (the mode's setup too, if it is not open)."""
        col, setup = mode - 1, self.members[mode] == 0
        compute = self.inst.compute[i, col] + setup * self.inst.setup_compute[col]
        memory = self.inst.memory[i, col] + setup * self.inst.setup_memory[col]
        return bool(compute <= self.free_compute and memory <= self.free_memory)

    def release(self, mode: int, compute: np.ndarray, memory: np.ndarray) -> None:
        """Give back what an admitted user held (it finished or left)."""
        self._take(mode, compute, memory, sign=-1)

    def _take(self, mode: int, compute: np.ndarray, memory: np.ndarray, sign: int) -> None:
        col = mode - 1
        setup = self.members[mode] == 0 if sign > 0 else self.members[mode] == 1
        self.members[mode] += sign
        self.free_compute -= sign * (compute[col] + setup * self.inst.setup_compute[col])
        self.free_memory -= sign * (memory[col] + setup * self.inst.setup_memory[col])
