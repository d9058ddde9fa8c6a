"""Admission control and the hybrid engine loop over users arriving in time: what the BALANCE
server runs (`agents.balance.server`, over the real engines) and the controller's simulator
(`testbed.balance.simulator`, over a virtual executor) alike, so the two differ only in the
executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.admission import AdmissionController, Decision, Plan, plan_modes
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


class Serving:
    """Admission control and the hybrid loop for users arriving one by one (or in batches) at
    times the caller says: the simulator feeds a known schedule (`serve`), the BALANCE server
    the users whose requests came in over the network (`agents.balance.server`).

    Users are indexed 0..n-1 (n known up front: a row each); a user's lengths and deadline may
    be set when it arrives (`arrive(..., deadline=...)`: its deadline left at the server, once
    the network's time is taken out), its demands then computed for that row.
    """

    def __init__(
        self,
        cost: CostModel,
        users: Users,
        memory_budget: float,
        service: Service,
        executor: Executor,
        policy: str = "hybrid",
        replan_s: float = 0.5,
    ) -> None:
        users = Users(  # its own arrays: rows are filled in as users arrive
            prompt=np.array(users.prompt, dtype=int),
            output=np.array(users.output, dtype=int),
            deadline=np.array(users.deadline, dtype=float),
        )
        self.cost, self.users, self.service, self.policy = cost, users, service, policy
        self.executor, self.replan_s = executor, replan_s
        n = len(users)
        self.demands = user_demands(cost, users, service)
        self.inst = make_instance(cost, users, memory_budget, service, self.demands)
        self.arrival = np.full(n, np.inf)
        self.timing = timing_of(cost, users, self.arrival, service, self.demands)
        self.admission = AdmissionController(self.inst, self.timing)
        rates = {AD: service.ad_steps_per_s, SD: service.sd_rounds_per_s}
        self.loop = HybridLoop(executor, rates, service.period_s)
        self.mode = np.full(n, UNSERVED, dtype=np.int8)
        self.reason = [""] * n
        self.finish = np.full(n, np.nan)
        self.peak = float(cost.target.weights_bytes)
        self.arrived: list[int] = []  # in arrival order
        self.plan: Plan | None = None
        self.planned_at = -np.inf

    @property
    def busy(self) -> bool:
        """Some user is being served or waits for its start."""
        return bool(self.loop.members or self.admission.waiting)

    def _set_user(self, uid: int, prompt: int, output: int, deadline: float) -> None:
        """User uid's lengths and deadline (seconds from its arrival), and its demands."""
        self.users.prompt[uid], self.users.output[uid] = prompt, output
        self.users.deadline[uid] = deadline
        one = Users(np.array([prompt]), np.array([output]), np.array([deadline], dtype=float))
        row = user_demands(self.cost, one, self.service)
        for name in ("compute", "memory", "pace", "window"):
            getattr(self.demands, name)[uid] = getattr(row, name)[0]
        self.inst.compute[uid], self.inst.memory[uid] = row.compute[0], row.memory[0]

    def arrive(
        self,
        uids: list[int],
        now: float,
        at: dict[int, float] | None = None,
        lengths: dict[int, tuple[int, int, float]] | None = None,
    ) -> dict[int, Decision]:
        """Users `uids` are offered at `now`, having arrived `at` (default: now); `lengths`
        (prompt, output, deadline from arrival) where they are known only on arrival.
        Admission decides each (returned)."""
        for uid in uids:
            if lengths and uid in lengths:
                self._set_user(uid, *lengths[uid])
            self.arrival[uid] = now if at is None else at[uid]
            self.arrived.append(uid)
        arrived = np.array(uids, dtype=int)
        if not len(arrived):
            return {}
        users, policy = self.users, self.policy
        if now - self.planned_at >= self.replan_s:
            recent = np.array(self.arrived[-PLAN_USERS:], dtype=int)
            span = max(  # the window's arrivals came over this time (rate = len / span)
                now - float(self.arrival[recent[0]]),
                PLAN_MIN_SPAN * float(np.median(users.deadline[recent])),
            )
            self.plan = plan_modes(self.inst, recent, users.deadline, span, POLICY_MODES[policy])
            self.planned_at = now
        plan = self.plan
        if plan is not None and plan.priced and policy == "hybrid":
            decisions = self.admission.offer_priced(arrived, plan, users.deadline, now)
        else:
            modes = POLICY_MODES[policy] if plan is None else plan.modes
            shut = tuple(m for m in POLICY_MODES[policy] if m not in modes)
            slack = plan is not None and plan.slack
            decisions = self.admission.offer_batch(arrived, modes, now, slack, shut)
        out = {}
        for i, decision in zip(arrived, decisions):
            self.mode[i] = decision.mode
            self.reason[i] = decision.reason
            if decision.admitted and not decision.waits:
                pace = float(self.demands.pace[i, decision.mode - 1])
                self.loop.add(int(i), decision.mode, pace, since=float(self.arrival[i]))
            out[int(i)] = decision
        return out

    def period(self, now: float) -> dict[int, float]:
        """One period of the loop from `now` (it waits out the period): users that waited
        start when due, the peak memory is noted, finished users release what they held;
        returns {uid: finish time} of those that finished."""
        for start in self.admission.start_due(now):
            self.loop.add(start.uid, start.mode, start.pace, since=start.since)
        free = self.admission.free_memory
        self.peak = max(
            self.peak, self.cost.target.weights_bytes + self.inst.memory_capacity - free
        )
        finished = self.loop.run_period(now)
        for uid, t in finished.items():
            self.finish[uid] = t
            self.admission.release(uid)
        if self.policy == "hybrid":
            for uid, why in move_lagging_sd_users(
                self.loop, self.admission, self.cost, self.users, self.arrival, self.service,
                self.executor.clock(),
            ).items():  # fmt: skip
                self.mode[uid] = AD
                self.reason[uid] += f"; {why}"
        return finished

    def result(self) -> ServeResult:
        """Who was served how, and when each finished, over the users that arrived."""
        users, arrival = self.users, self.arrival
        came = np.isfinite(arrival)
        met = self.finish <= arrival + users.deadline
        start = float(arrival[came].min()) if came.any() else 0.0
        end = float(np.nanmax(self.finish)) if np.isfinite(self.finish).any() else start
        span = workload_span_s(arrival[came], users.deadline[came])
        return ServeResult(
            len(users), self.mode, self.finish, met, end - start, span, self.peak,
            tuple(self.reason), self.loop.most_behind_s,
        )  # fmt: skip


def serve(
    cost: CostModel,
    work: Workload,
    memory_budget: float,
    service: Service,
    executor: Executor,
    policy: str = "hybrid",
    replan_s: float = 0.5,
) -> ServeResult:
    """Admission control and the hybrid loop over any executor (simulated or real), the users
    arriving at the workload's times.

    Every `replan_s` seconds each policy plans on the latest arrivals
    (`admission.plan_modes`). The hybrid takes from the plan which modes may open and the
    prices it admits by (`offer_priced`); AD-only and SD-only admit each period's arrivals
    by the scheduler (`offer_batch`). For all three, the plan also says whether a user who
    fits nowhere now may wait for a later start (`Plan.slack`).
    """
    serving = Serving(cost, work.users, memory_budget, service, executor, policy, replan_s)
    n = len(work.users)
    order = np.argsort(work.arrival, kind="stable")
    nxt = 0
    while nxt < n or serving.busy:
        now = executor.clock()
        if not serving.busy and nxt < n:
            executor.wait_until(float(work.arrival[order[nxt]]))
            serving.loop.rest()
            now = executor.clock()
        first = nxt
        while nxt < n and work.arrival[order[nxt]] <= now:
            nxt += 1
        came = [int(i) for i in order[first:nxt]]
        serving.arrive(came, now, at={i: float(work.arrival[i]) for i in came})
        serving.period(now)
    return serving.result()
