"""Acceptance against draft confidence: is a confident draft token a likely accepted one?

Each draft token carries its probability under the draft model. In a verified round the
first `accepted` drafts were accepted and the next one (if any) rejected; later drafts were
never judged and are left out. Counting both by confidence bucket checks the SLED seed's
claim (confidence above 0.8 gives at least 92 % acceptance) on any model pair.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 1.0)


@dataclass
class ConfidenceBuckets:
    """Judged and accepted draft tokens per confidence bucket [EDGES[i], EDGES[i+1])."""

    judged: list[int] = field(default_factory=lambda: [0] * (len(EDGES) - 1))
    accepted: list[int] = field(default_factory=lambda: [0] * (len(EDGES) - 1))

    def add(self, conf: Sequence[float], accepted: int) -> None:
        """One verified round: confidences of its drafts and how many were accepted."""
        for i, c in enumerate(conf[: accepted + 1]):
            b = min(len(EDGES) - 2, max(0, bisect.bisect_right(EDGES, c) - 1))
            self.judged[b] += 1
            self.accepted[b] += i < accepted

    def rows(self) -> list[dict[str, float]]:
        return [
            {"conf_lo": EDGES[b], "conf_hi": EDGES[b + 1], "judged": self.judged[b],
             "accepted": self.accepted[b],
             "acceptance": self.accepted[b] / self.judged[b] if self.judged[b] else None}
            for b in range(len(EDGES) - 1)
        ]  # fmt: skip


def confident_prefix(conf: Sequence[float], threshold: float) -> int:
    """How many leading drafts are at least `threshold` confident; at least 1 (all if no
    threshold), so that a retry still carries a draft to verify."""
    n = next((i for i, c in enumerate(conf) if c < threshold), len(conf))
    return max(1, n) if conf else 0
