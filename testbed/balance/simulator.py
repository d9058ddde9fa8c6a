"""A discrete-event simulator of the hybrid server, driven by the profiled cost model.

Users arrive over time; at each period boundary the arrivals are offered to admission
control (refused at once or admitted into AD or SD with their compute share), and the engine
loop of `agents.balance.loop` runs one period against a simulated executor: an AD step of b
users costs t_AD(b), an SD round t_SD(b) (both as profiled on the loop itself; the slower
after-idle time for the first step after the loop waited), and an SD round yields each user
1..g+1 tokens drawn from the shares the profile measured; prefill costs its per-token time.
The clock is virtual, so 10,000 users take seconds. The result says which users finished
within their deadline (task throughput), how many were refused, and the peak memory
reserved (weights and KV caches).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.loop import Executor, HybridLoop
from agents.balance.modes import AD, SD
from testbed.balance.admission import AdmissionController, Plan, plan_modes
from testbed.balance.costmodel import CostModel
from testbed.balance.problem import (
    UNSERVED,
    Service,
    Users,
    make_instance,
    timing_of,
    user_demands,
)
from testbed.balance.rescue import move_lagging_sd_users


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


def random_workload(rng: np.random.Generator, n: int, rate_per_s: float) -> Workload:
    """Mixed lengths and deadlines, Poisson arrivals at rate_per_s."""
    output = rng.integers(8, 64, n)
    users = Users(
        prompt=rng.integers(8, 160, n),
        output=output,
        deadline=0.1 + output * rng.uniform(0.01, 0.05, n),  # 10 to 50 ms per token
    )
    return Workload(users, np.cumsum(rng.exponential(1 / rate_per_s, n)))


PLAN_USERS = 50  # the hybrid plans on this many recent arrivals
PLAN_MIN_SPAN = 0.5  # ... taken as arriving over at least this many median deadlines, so the
# first few arrivals are not extrapolated into a flood (0.5 measured best of 0.1, 0.5 and 1)
POLICY_MODES = {"ad-only": (AD,), "sd-only": (SD,), "hybrid": (AD, SD)}


class SimulatedExecutor:
    """The engine's costs from the cost model, on a virtual clock."""

    def __init__(self, cost: CostModel, users: Users, rng: np.random.Generator) -> None:
        self.cost = cost
        self.users = users
        self.rng = rng
        self.now = 0.0
        self.left: dict[int, int] = {}
        self._round_cdf = np.cumsum(cost.round_tokens)
        self.idle = True  # the loop waited since the last step (its next step runs cold)

    def clock(self) -> float:
        return self.now

    def wait_until(self, t: float) -> None:
        if t > self.now:
            self.now, self.idle = t, True

    def start(self, uid: int, mode: int) -> None:
        if uid not in self.left:  # a move keeps the tokens; only a new user is prefilled
            self.left[uid] = int(self.users.output[uid])
            self.now += self.cost.prefill_s(mode, int(self.users.prompt[uid]))
            self.idle = False

    def step(self, mode: int, uids: list[int]) -> tuple[dict[int, int], set[int]]:
        self.now += self.cost.loop_step(mode).time(len(uids), self.idle)
        self.idle = False
        if mode == SD:  # 1..g+1 tokens each, as the profile measured rounds to yield
            draws = self.rng.random(len(uids)) * self._round_cdf[-1]
            tokens = np.searchsorted(self._round_cdf, draws, side="right") + 1
        else:
            tokens = np.ones(len(uids), dtype=int)
        got, done = {}, set()
        for u, t in zip(uids, tokens):
            got[u] = int(min(t, self.left[u]))
            self.left[u] -= got[u]
            if self.left[u] <= 0:
                done.add(u)
        return got, done

    def stop(self, uid: int) -> None:
        self.left.pop(uid, None)


@dataclass(frozen=True)
class SimResult:
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


def simulate(
    cost: CostModel,
    work: Workload,
    memory_budget: float,
    service: Service,
    policy: str = "hybrid",
    seed: int = 0,
) -> SimResult:
    """Run the workload through admission control and the loop on the simulated executor."""
    executor = SimulatedExecutor(cost, work.users, np.random.default_rng(seed))
    return serve(cost, work, memory_budget, service, executor, policy)


def serve(
    cost: CostModel,
    work: Workload,
    memory_budget: float,
    service: Service,
    executor: Executor,
    policy: str = "hybrid",
    replan_s: float = 0.5,
) -> SimResult:
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
    return SimResult(
        n, mode, finish, met, end - start, span, peak, tuple(reason), loop.most_behind_s
    )
