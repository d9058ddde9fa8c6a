"""How long a device waits for a verdict before resending: fixed, or adapted to the RTT.

`AdaptiveTimeout` is TCP's retransmission timer (RFC 6298): smoothed RTT and RTT variance
from each unambiguous sample (Karn's rule: only exchanges answered on their first attempt),
timeout = SRTT + 4 * RTTVAR, kept within the playbook's bounds. With `backoff` it also backs
off as RFC 6298 section 5.5 does: each attempt that goes unanswered doubles the timeout, and the
doubled timeout stays until a first attempt is answered again (a fresh sample). Without it a
server whose verifications queue past the timeout never answers a first attempt, so the timer
never learns the queueing delay and every device falls back. `FixedTimeout` is the SLED
design's policy (200 ms, 3 retries).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FixedTimeout:
    """The same wait for every attempt."""

    timeout_ms: float = 200.0

    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    def observe(self, rtt_ms: float) -> None:
        """A fixed policy learns nothing."""

    def expired(self) -> None:
        """An attempt went unanswered: a fixed wait stays the same."""


@dataclass
class AdaptiveTimeout:
    """SRTT + 4 RTTVAR within [min_ms, max_ms] (RFC 6298: alpha 1/8, beta 1/4)."""

    initial_ms: float = 200.0
    min_ms: float = 20.0
    max_ms: float = 1000.0
    srtt_ms: float | None = None
    rttvar_ms: float = 0.0
    backoff: bool = False  # RFC 6298 5.5: double the timeout on each expiry
    factor: float = 1.0  # the back-off in force: 2^(expiries since the last sample)

    def __post_init__(self) -> None:
        if not 0 < self.min_ms <= self.max_ms:
            raise ValueError(
                f"timeout bounds need 0 < min <= max, got {self.min_ms}, {self.max_ms}"
            )

    def observe(self, rtt_ms: float) -> None:
        """Fold in one RTT sample (from a request answered on its first attempt)."""
        if self.srtt_ms is None:
            self.srtt_ms, self.rttvar_ms = rtt_ms, rtt_ms / 2
        else:
            self.rttvar_ms = 0.75 * self.rttvar_ms + 0.25 * abs(self.srtt_ms - rtt_ms)
            self.srtt_ms = 0.875 * self.srtt_ms + 0.125 * rtt_ms
        self.factor = 1.0

    def expired(self) -> None:
        """An attempt went unanswered: with back-off, the next one waits twice as long (up to
        `max_ms`) until a sample comes."""
        if self.backoff and self.timeout_ms < self.max_ms:
            self.factor *= 2

    @property
    def timeout_ms(self) -> float:
        raw = self.initial_ms if self.srtt_ms is None else self.srtt_ms + 4 * self.rttvar_ms
        return min(self.max_ms, max(self.min_ms, raw) * self.factor)

    def timeout_s(self) -> float:
        return self.timeout_ms / 1000


RetryPolicy = FixedTimeout | AdaptiveTimeout
