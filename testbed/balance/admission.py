"""Admission control: a user the schedule cannot serve in time is refused at once, with a reason.

At each period boundary the users who arrived during the period are admitted by the scheduler
(`algorithm.schedule`) on the compute share and memory still free, without moving anyone
already admitted; each user left out is refused and told which resource is short. Which
modes may open is planned on a window of recent arrivals at full capacity (`plan_modes`).
A user's compute demand is its work over its deadline; it keeps that share until it
finishes, when `release` returns both resources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.modes import AD, MODE_NAMES, SD, UNSERVED
from testbed.balance.algorithm import schedule
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


def plan_modes(inst: Instance, window: np.ndarray, allowed: tuple[int, ...]) -> tuple[int, ...]:
    """The modes worth opening: those the scheduler uses for a window of recent arrivals.

    The window stands for the users the server holds at once (those arrived within about one
    deadline), so the plan sees which resource binds in the long run, which admitting each
    period's arrivals on what is free cannot.
    """
    sub = Instance(
        compute=inst.compute[window],
        memory=inst.memory[window],
        compute_capacity=inst.compute_capacity,
        memory_capacity=inst.memory_capacity,
        setup_compute=inst.setup_compute,
        setup_memory=inst.setup_memory,
    )
    modes = schedule(sub, allowed).modes
    used = tuple(m for m in allowed if (modes == m).any())
    return used or allowed


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

    def release(self, mode: int, compute: np.ndarray, memory: np.ndarray) -> None:
        """Give back what an admitted user held (it finished or left)."""
        self._take(mode, compute, memory, sign=-1)

    def _take(self, mode: int, compute: np.ndarray, memory: np.ndarray, sign: int) -> None:
        col = mode - 1
        setup = self.members[mode] == 0 if sign > 0 else self.members[mode] == 1
        self.members[mode] += sign
        self.free_compute -= sign * (compute[col] + setup * self.inst.setup_compute[col])
        self.free_memory -= sign * (memory[col] + setup * self.inst.setup_memory[col])
