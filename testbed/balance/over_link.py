"""The simulator's users over the links they came from: what the lab's network does to a
BALANCE user, drawn per user from the link's profile, so the simulator predicts each lab
point on the same footing as the lab runs it.

A user sends at its arrival time on its device. Its request reaches the server after half an
RTT, plus a retry timeout (`RETRY_RTTS` RTTs) for each time every copy was lost on the uplink;
the server gives it what is left of the deadline (`agents.balance.network.server_deadline_s`,
from the profile's RTT and loss, where the lab's server has what its device measured). Its
last tokens reach the device half an RTT after the server finishes, plus a repair when every
copy of the final answer was lost on the downlink.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agents.balance.network import (
    ANSWER_EVERY_S,
    REPAIR_RTTS,
    RETRY_RTTS,
    server_deadline_s,
)
from agents.balance.problem import Users
from agents.balance.serve import Workload
from testbed.topo.profile import LinkProfile


@dataclass(frozen=True)
class LinkView:
    """A link as the simulator sees it: its RTT, per-direction mean loss and copies."""

    rtt_s: float
    loss_up: float
    loss_down: float
    copies: int = 1

    @classmethod
    def of(cls, profile: LinkProfile, copies: int = 1) -> LinkView:
        return cls(profile.rtt_ms / 1000, profile.up_loss, profile.down_loss, copies)

    @property
    def loss(self) -> float:
        """The per-direction loss a device estimates from its round trips."""
        return 1 - math.sqrt((1 - self.loss_up) * (1 - self.loss_down))


@dataclass(frozen=True)
class OverLink:
    """Users drawn over a link: the server's workload, and what the network adds per user."""

    server: Workload  # arrival at the server (from the first send), the server's deadline
    send: np.ndarray  # first send on the device
    deadline: np.ndarray  # the user's own deadline (on the device)
    before_s: np.ndarray  # first send -> arrival at the server
    after_s: np.ndarray  # server's finish -> last token on the device

    def completion_s(self, server_finish: np.ndarray) -> np.ndarray:
        """Each user's time from its first send to its last token (nan: never finished)."""
        return server_finish - self.send + self.after_s

    def met(self, server_finish: np.ndarray) -> np.ndarray:
        done = self.completion_s(server_finish)
        return np.isfinite(done) & (done <= self.deadline)


def over_link(users: Users, send: np.ndarray, view: LinkView,
              rng: np.random.Generator) -> OverLink:  # fmt: skip
    """Draw what the link does to each user (module docstring)."""
    n = len(users)
    through = 1 - view.loss_up**view.copies  # a send's copies get one through
    retries = rng.geometric(max(through, 1e-9), n) - 1 if n else np.zeros(0, dtype=int)
    age = retries * RETRY_RTTS * view.rtt_s
    before = age + view.rtt_s / 2
    lost_final = rng.random(n) < view.loss_down**view.copies
    after = view.rtt_s / 2 + lost_final * (REPAIR_RTTS * view.rtt_s + 2 * ANSWER_EVERY_S)
    left = np.array([
        server_deadline_s(float(d), float(a), view.rtt_s, view.loss, view.copies)
        for d, a in zip(users.deadline, age)
    ])  # fmt: skip
    server_users = Users(users.prompt, users.output, np.maximum(left, 1e-3))
    return OverLink(Workload(server_users, send + before), send, users.deadline, before, after)
