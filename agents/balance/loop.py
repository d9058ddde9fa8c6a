"""The hybrid engine loop: AD users batched together, SD users together, time-shared.

Each mode steps at a fixed rate: at most `step_rate[AD]` AD steps and `step_rate[SD]` SD
rounds per second (the scheduler's compute split: a step's fixed cost times its rate is the
mode's reserved share, docs/balance.md). Every scheduling period of `period_s` seconds each
mode runs the steps it is owed; a step takes the users that are behind their own pace (a user
needing o tokens within d seconds is paced at o/d tokens per second, looking `lookahead_s` past
the period's end, so a burst of prefills does not make anyone late),
so a user's marginal cost is what it needs and no more. The loop then waits out the period.

Users join, leave and change mode only between steps or rounds, so a move never loses a
token: the executor keeps each user's committed tokens and syncs the other mode's caches to
them. The loop is the same for the real engine (`agents.balance.engine`) and the simulator
(`testbed.balance.simulator`); only the executor differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from agents.balance.modes import AD, SD


class Executor(Protocol):
    """Runs the model work of the loop and keeps its clock (seconds)."""

    def clock(self) -> float: ...

    def wait_until(self, t: float) -> None: ...

    def start(self, uid: int, mode: int) -> None:
        """Prepare the caches user uid needs in mode (prefill, or catch up after a move)."""

    def step(self, mode: int, uids: list[int]) -> tuple[dict[int, int], set[int]]:
        """One batched AD step or SD round: tokens each user got, and who is done."""

    def stop(self, uid: int) -> None:
        """Free user uid's caches."""


@dataclass
class Member:
    mode: int
    pace: float  # tokens per second the user needs
    since: float  # when its pace started
    delivered: int = 0
    ready: bool = False  # caches prepared for its current mode
    steps_in_mode: int = 0  # steps of its current mode it has been in
    delivered_in_mode: int = 0  # tokens those steps gave it

    def due(self, until: float) -> bool:
        return self.delivered < self.pace * (until - self.since)


@dataclass
class HybridLoop:
    executor: Executor
    step_rate: dict[int, float]  # AD steps / SD rounds per second
    period_s: float = 0.05
    lookahead_s: float = 0.1  # users are served this far ahead of their pace (absorbs bursts)
    members: dict[int, Member] = field(default_factory=dict)
    owed: dict[int, float] = field(default_factory=lambda: {AD: 0.0, SD: 0.0})
    busy_s: dict[int, float] = field(default_factory=lambda: {AD: 0.0, SD: 0.0})
    steps: dict[int, int] = field(default_factory=lambda: {AD: 0, SD: 0})
    last: float | None = None  # when the previous period started
    most_behind_s: float = 0.0  # the most a period started after the previous one was due to end
    rested: bool = False  # the loop waited for work since its last period (`rest`)

    def add(self, uid: int, mode: int, pace: float, since: float | None = None) -> None:
        """Serve uid in mode at pace tokens/s, counted from since (its arrival; default now)."""
        self.members[uid] = Member(mode, pace, self.executor.clock() if since is None else since)

    def move(self, uid: int, mode: int) -> None:
        """Serve uid in the other mode from its next step on (its tokens are kept)."""
        m = self.members[uid]
        if m.mode != mode:
            m.mode, m.ready, m.steps_in_mode, m.delivered_in_mode = mode, False, 0, 0

    def rest(self) -> None:
        """The loop had no one to serve and waited for work: the gap before its next period
        is idleness, not lateness, and `most_behind_s` leaves it out."""
        self.rested = True

    def run_period(self, start: float | None = None) -> dict[int, float]:
        """Run one period; return {uid: finish time} of the users that finished in it.

        `start`: when the period began (default now). A caller that admits and plans at the
        top of each period passes the time it began, so that work is part of the period
        rather than added to it: the next period, and the arrivals it admits, come on time.
        """
        start = self.executor.clock() if start is None else start
        horizon = start + self.period_s
        finished: dict[int, float] = {}
        # steps are owed for the time that really passed (a period that overran owes more)
        elapsed = self.period_s if self.last is None else start - self.last
        if not self.rested:
            self.most_behind_s = max(self.most_behind_s, elapsed - self.period_s)
        self.rested = False
        elapsed = min(max(elapsed, self.period_s), 4 * self.period_s)
        self.last = start
        for mode in (AD, SD):
            self.owed[mode] = min(self.owed[mode], 1.0) + self.step_rate[mode] * elapsed
            while self.owed[mode] >= 1:
                uids = [
                    u
                    for u, m in self.members.items()
                    if m.mode == mode and m.due(horizon + self.lookahead_s)
                ]
                if not uids:
                    break
                self.owed[mode] -= 1
                t0 = self.executor.clock()
                for u in uids:
                    if not self.members[u].ready:
                        self.executor.start(u, mode)
                        self.members[u].ready = True
                got, done = self.executor.step(mode, uids)
                self.busy_s[mode] += self.executor.clock() - t0
                self.steps[mode] += 1
                for u in uids:
                    self.members[u].steps_in_mode += 1
                for u, n in got.items():
                    self.members[u].delivered += n
                    self.members[u].delivered_in_mode += n
                for u in done:
                    finished[u] = self.executor.clock()
                    self.executor.stop(u)
                    del self.members[u]
        self.executor.wait_until(horizon)
        return finished
