"""Admission control and the hybrid engine loop over users arriving in time: what the BALANCE
server runs (`agents.balance.server`, over the real engines) and the controller's simulator
(`testbed.balance.simulator`, over a virtual executor) alike, so the two differ only in the
executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.admission import AdmissionController, Plan, plan_modes
from agents.balance.costmodel import CostModel
from agents.balance.loop import Executor, HybridLoop
from agents.balance.modes import AD, SD
from agents.balance.problem import (
    UNSERVED,
    Service,
    Users,
    make_instance,
    timing_of,
    user_demands,
)
from agents.balance.rescue import move_lagging_sd_users


@dataclass(frozen=True)
class Workload:
    """Users (lengths, deadlines) and their arrival times (seconds)."""

    users: Users
    arrival: np.ndarray


def workload_span_s(arrival: np.ndarray, deadline: np.ndarray) -> float:
    """From the first arrival to the latest deadline: the time within which the workload's
    users can finish in time. Task throughput is users in time over it, so that policies
    compare by the users they serve in time, not by when their last user happens to finish."""
    if len(arrival) == 0:
        return 0.0
    return float(np.max(arrival + deadline) - np.min(arrival))


PLAN_USERS = 50  # the hybrid plans on this many recent arrivals
PLAN_MIN_SPAN = 0.5  # ... taken as arriving over at least this many median deadlines, so the
# first few arrivals are not extrapolated into a flood (0.5 measured best of 0.1, 0.5 and 1)
POLICY_MODES = {"ad-only": (AD,), "sd-only": (SD,), "hybrid": (AD, SD)}


@dataclass(frozen=True)
class ServeResult:
    users: int
    mode: np.ndarray  # per user: UNSERVED (refused), AD or SD
    finish: np.ndarray  # absolute finish time, nan if refused
    met: np.ndarray  # finished within the deadline
    makespan_s: float  # first arrival to last finish
    span_s: float  # the workload's span (`workload_span_s`), the same under every policy
    peak_memory_bytes: float  # weights and reserved KV, at most the budget
    reason: tuple[str, ...] = ()  # per user: admission's decision (why refused, or how admitted)
    most_behind_s: float = 0.0  # the most a loop period started late (a stalled server)

    @property
    def served_in_time(self) -> int:
        return int(self.met.sum())

    @property
    def task_throughput(self) -> float:
        """Users finished within their deadline per second of the workload's span."""
        return self.served_in_time / self.span_s if self.span_s > 0 else 0.0

    @property
    def late(self) -> int:
        return int(((self.mode != UNSERVED) & ~self.met).sum())


def serve(
    cost: CostModel,
    work: Workload,
    memory_budget: float,
    service: Service,
    executor: Executor,
    policy: str = "hybrid",
    replan_s: float = 0.5,
) -> ServeResult:
    """Admission control and the hybrid loop over any executor (simulated or real).

    Every `replan_s` seconds each policy plans on the latest arrivals
    (`admission.plan_modes`). The hybrid takes from the plan which modes may open and the
    prices it admits by (`offer_priced`); AD-only and SD-only admit each period's arrivals
    by the scheduler (`offer_batch`). For all three, the plan also says whether a user who
    fits nowhere now may wait for a later start (`Plan.slack`).
    """
    users = work.users
    n = len(users)
    demands = user_demands(cost, users, service)
    inst = make_instance(cost, users, memory_budget, service, demands)
    admission = AdmissionController(inst, timing_of(cost, users, work.arrival, service, demands))
    rates = {AD: service.ad_steps_per_s, SD: service.sd_rounds_per_s}
    loop = HybridLoop(executor, rates, service.period_s)
    mode = np.full(n, UNSERVED, dtype=np.int8)
    reason = [""] * n
    finish = np.full(n, np.nan)
    fixed = cost.target.weights_bytes
    peak = float(fixed)
    order = np.argsort(work.arrival, kind="stable")
    nxt = 0
    plan: Plan | None = None
    planned_at = -np.inf
    while nxt < n or loop.members or admission.waiting:
        now = executor.clock()
        if not loop.members and not admission.waiting and nxt < n:
            executor.wait_until(float(work.arrival[order[nxt]]))
            loop.rest()
            now = executor.clock()
        first = nxt
        while nxt < n and work.arrival[order[nxt]] <= now:
            nxt += 1
        arrived = order[first:nxt]
        if len(arrived) and now - planned_at >= replan_s:
            recent = order[max(0, nxt - PLAN_USERS) : nxt]
            span = max(  # the window's arrivals came over this time (rate = len / span)
                now - float(work.arrival[recent[0]]),
                PLAN_MIN_SPAN * float(np.median(users.deadline[recent])),
            )
            plan = plan_modes(inst, recent, users.deadline, span, POLICY_MODES[policy])
            planned_at = now
        if plan is not None and plan.priced and policy == "hybrid":
            decisions = admission.offer_priced(arrived, plan, users.deadline, now)
        else:
            modes = POLICY_MODES[policy] if plan is None else plan.modes
            shut = tuple(m for m in POLICY_MODES[policy] if m not in modes)
            slack = plan is not None and plan.slack
            decisions = admission.offer_batch(arrived, modes, now, slack, shut)
        for i, decision in zip(arrived, decisions):
            mode[i] = decision.mode
            reason[i] = decision.reason
            if decision.admitted and not decision.waits:
                pace = float(demands.pace[i, decision.mode - 1])
                loop.add(int(i), decision.mode, pace, since=float(work.arrival[i]))
        for start in admission.start_due(now):
            loop.add(start.uid, start.mode, start.pace, since=start.since)
        peak = max(peak, fixed + inst.memory_capacity - admission.free_memory)
        for uid, t in loop.run_period(now).items():
            finish[uid] = t
            admission.release(uid)
        if policy == "hybrid":
            for uid, why in move_lagging_sd_users(
                loop, admission, cost, users, work.arrival, service, executor.clock()
            ).items():
                mode[uid] = AD
                reason[uid] += f"; {why}"
    met = finish <= work.arrival + users.deadline
    start = float(work.arrival.min()) if n else 0.0
    end = float(np.nanmax(finish)) if np.isfinite(finish).any() else start
    span = workload_span_s(work.arrival, users.deadline)
    return ServeResult(
        n, mode, finish, met, end - start, span, peak, tuple(reason), loop.most_behind_s
    )
