"""Adaptive draft length: a PID controller steering the recent acceptance rate to a target.

The measured value is the acceptance rate over a sliding window of recent rounds (accepted
drafts / drafted tokens). Acceptance above the target means drafts are cheap to extend, so
the length grows; below it, drafted tokens are wasted, so it shrinks. The controller keeps a
real-valued length (incremental form: each round adds kp*e + ki*sum(e) + kd*(e - e_prev),
the integral clamped against wind-up) and drafts round(length) tokens, within [min, max].
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from agents.spec.rates import acceptance_rate


@dataclass
class DraftLengthController:
    """Draft length from recent acceptance (defaults: the SLED design's 3..8, target 0.75)."""

    min_len: int = 3
    max_len: int = 8
    target_acceptance: float = 0.75
    window: int = 8
    kp: float = 2.0
    ki: float = 0.2
    kd: float = 0.5
    integral_limit: float = 2.0
    length: float = field(init=False)
    _rounds: deque[tuple[int, int]] = field(init=False, repr=False)
    _integral: float = field(default=0.0, init=False)
    _last_error: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(
                f"draft length needs 1 <= min <= max, got {self.min_len}, {self.max_len}"
            )
        if not 0 < self.target_acceptance < 1:
            raise ValueError(f"target acceptance must be in (0, 1), got {self.target_acceptance}")
        self.length = float(self.min_len + self.max_len) / 2
        self._rounds = deque(maxlen=self.window)

    @property
    def current(self) -> int:
        """The number of tokens to draft in the next round."""
        return min(self.max_len, max(self.min_len, round(self.length)))

    def acceptance(self) -> float | None:
        """Acceptance over the window, or None before the first round."""
        return acceptance_rate(sum(a for a, _ in self._rounds), sum(d for _, d in self._rounds))

    def observe(self, accepted: int, drafted: int) -> int:
        """Fold in one verified round; return the next draft length."""
        if drafted <= 0:
            return self.current
        self._rounds.append((accepted, drafted))
        error = (self.acceptance() or 0.0) - self.target_acceptance
        self._integral = max(-self.integral_limit, min(self.integral_limit, self._integral + error))
        derivative = 0.0 if self._last_error is None else error - self._last_error
        self._last_error = error
        step = self.kp * error + self.ki * self._integral + self.kd * derivative
        self.length = min(self.max_len + 0.49, max(self.min_len - 0.49, self.length + step))
        return self.current
