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

import numpy as np

from agents.balance.costmodel import CostModel
from agents.balance.modes import SD
from agents.balance.problem import Service, Users
from agents.balance.serve import ServeResult, Workload, serve


def random_workload(rng: np.random.Generator, n: int, rate_per_s: float) -> Workload:
    """Mixed lengths and deadlines, Poisson arrivals at rate_per_s."""
    output = rng.integers(8, 64, n)
    users = Users(
        prompt=rng.integers(8, 160, n),
        output=output,
        deadline=0.1 + output * rng.uniform(0.01, 0.05, n),  # 10 to 50 ms per token
    )
    return Workload(users, np.cumsum(rng.exponential(1 / rate_per_s, n)))


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


def simulate(
    cost: CostModel,
    work: Workload,
    memory_budget: float,
    service: Service,
    policy: str = "hybrid",
    seed: int = 0,
) -> ServeResult:
    """Run the workload through admission control and the loop on the simulated executor."""
    executor = SimulatedExecutor(cost, work.users, np.random.default_rng(seed))
    return serve(cost, work, memory_budget, service, executor, policy)
