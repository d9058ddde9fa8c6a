"""The agents' clock: real time, or real time slowed down N times (time dilation).

With a dilation of N every time the lab imposes runs N times slower: an agent that waits
`timeout_s` of emulated time waits N x timeout_s of real time, a paced forward sleeps N times
its modelled time, and an arrival due at 2 s comes 2N s after the start. Whatever the agents
record is read off this clock, so it is in emulated time: a span of N real seconds reads as
one. Wall-clock times keep their meaning across hosts: real and emulated wall time agree at
the condition's `epoch` (given by the controller), and drift apart N times slower after it.

Agents call the module's functions (`now`, `monotonic`, `sleep`, `to_real`) instead of the
`time` module's, so one `configure` at start-up dilates all of them. Dilation 1 (the default,
and on a physical lab) is the real clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Clock:
    """Emulated time: real time since `epoch` divided by `dilation`."""

    dilation: float = 1.0
    epoch: float = 0.0  # real wall time (seconds since the epoch) where both clocks agree

    def __post_init__(self) -> None:
        if not self.dilation > 0:
            raise ValueError(f"time dilation must be a positive number, got {self.dilation!r}")

    def now(self) -> float:
        """Emulated wall time, seconds since the Unix epoch."""
        return self.epoch + (time.time() - self.epoch) / self.dilation

    def monotonic(self) -> float:
        """Emulated monotonic time (only differences mean anything)."""
        return time.perf_counter() / self.dilation

    def to_real(self, seconds: float) -> float:
        """Real seconds that `seconds` of emulated time take."""
        return seconds * self.dilation

    def to_emulated(self, real_seconds: float) -> float:
        """Emulated seconds that `real_seconds` of real time stand for."""
        return real_seconds / self.dilation

    def wall(self, real_wall: float) -> float:
        """A real wall-clock time (another process's) on the emulated wall clock."""
        return self.epoch + (real_wall - self.epoch) / self.dilation

    def sleep(self, seconds: float) -> None:
        """Sleep `seconds` of emulated time."""
        if seconds > 0:
            time.sleep(seconds * self.dilation)


_clock = Clock()


def configure(dilation: float = 1.0, epoch: float | None = None) -> Clock:
    """Set this process's clock; returns it. `epoch` defaults to now."""
    global _clock
    _clock = Clock(float(dilation), time.time() if epoch is None else float(epoch))
    return _clock


def current() -> Clock:
    """This process's clock."""
    return _clock


def now() -> float:
    return _clock.now()


def monotonic() -> float:
    return _clock.monotonic()


def sleep(seconds: float) -> None:
    _clock.sleep(seconds)


def to_real(seconds: float) -> float:
    return _clock.to_real(seconds)


def to_emulated(real_seconds: float) -> float:
    return _clock.to_emulated(real_seconds)
