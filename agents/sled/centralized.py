"""The centralized baseline: the target generates every token, with continuous batching.

Devices that send only their prompt (GENERATE) get autoregressive greedy generation by the
target. All running generations advance together, one token each per batched forward;
a new one joins between steps and a finished one (EOS or max_new; max_new alone for an
answer held to its length) leaves, as in vLLM's continuous batching. The result goes back
in one RESULT when a generation finishes, with the time its first token was made, so the
device can say when a streaming client would have seen its tokens.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from agents.emulation import clock
from agents.engines.base import Engine
from agents.spec.decoding import finish
from agents.spec.session import TrackedSession
from agents.workloads.request import NO_STOP


@dataclass
class RunningRequest:
    """One running centralized request."""

    key: Hashable
    rid: int
    addr: tuple[str, int]
    tracked: TrackedSession
    committed: list[int]
    max_new: int
    arrived: float
    stop_id: int  # EOS, or NO_STOP for an answer held to max_new
    out: list[int] = field(default_factory=list)
    first_token: float | None = None  # monotonic end of the step that made the first token
    steps: int = 0
    started: float | None = None
    done: bool = False


class ContinuousBatcher:
    """Advances every running generation by one token per `step`."""

    def __init__(self, engine: Engine, max_batch: int) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.running: dict[Hashable, RunningRequest] = {}
        self.waiting: list[RunningRequest] = []

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    def has(self, key: Hashable) -> bool:
        return key in self.running or any(g.key == key for g in self.waiting)

    def join(self, key: Hashable, rid: int, addr: tuple[str, int], prompt: list[int],
             max_new: int, hold: bool = False) -> None:  # fmt: skip
        """Queue a generation; it enters the batch at the next step with room."""
        gen = RunningRequest(
            key,
            rid,
            addr,
            TrackedSession(self.engine),
            list(prompt),
            max_new,
            clock.monotonic(),
            NO_STOP if hold else self.engine.eos_id,
        )
        self.waiting.append(gen)

    def step(self) -> tuple[list[RunningRequest], int]:
        """One batched forward; returns the generations that finished and the batch size."""
        while self.waiting and len(self.running) < self.max_batch:
            gen = self.waiting.pop(0)
            self.running[gen.key] = gen
        gens = list(self.running.values())
        if not gens:
            return [], 0
        now = clock.monotonic()
        feeds = {}
        for g in gens:
            g.started = g.started or now
            feeds[g.tracked.sid] = g.tracked.prepare(g.committed)
        logits = self.engine.score_batch(feeds)
        ended = clock.monotonic()
        finished = []
        for g in gens:
            feed = feeds[g.tracked.sid]
            g.tracked.record_scored(feed)
            token = int(np.argmax(logits[g.tracked.sid][-1]))
            g.committed.append(token)
            g.steps += 1
            g.first_token = g.first_token or ended
            g.out, g.done = finish(g.out + [token], g.stop_id, g.max_new)
            if g.done:
                finished.append(g)
                self.remove(g.key)
        return finished, len(gens)

    def remove(self, key: Hashable) -> None:
        """Stop a generation and free its cache."""
        gen = self.running.pop(key, None)
        if gen is None:
            for g in [g for g in self.waiting if g.key == key]:
                self.waiting.remove(g)
                gen = g
        if gen is not None:
            gen.tracked.close()


def first_token_ms(gen: RunningRequest) -> float:
    """From the generation's first step's start to the end of the step that made its first
    token (0 before any)."""
    if gen.first_token is None or gen.started is None:
        return 0.0
    return round((gen.first_token - gen.started) * 1000, 3)
