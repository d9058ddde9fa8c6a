"""How the server groups waiting verifications into target forwards, and what padding costs.

A forward over n sessions attends over a (n, max_past + max_new) block of key slots: each
session's cached tokens (left-padded) and its new tokens (right-padded). The padding share of
a forward is the part of that block no real token fills,
1 - sum(past_i + new_i) / (n * (max_past + max_new)).

- "arrival": one forward of up to max_batch requests in arrival order.
- "best_fit": requests sorted by length (past + new) and cut into groups whose lengths lie
  within `tolerance` tokens (the seed's 16), each at most max_batch; fewer padded slots at
  the price of more forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Strategy = Literal["arrival", "best_fit"]


@dataclass(frozen=True)
class Shape:
    """One request's place in a forward: cached tokens before it and tokens it feeds."""

    past: int
    new: int

    @property
    def length(self) -> int:
        return self.past + self.new


def padding_share(shapes: Sequence[Shape]) -> float:
    """Share of the forward's key slots that are padding (0 for a single request)."""
    if not shapes:
        return 0.0
    width = max(s.past for s in shapes) + max(s.new for s in shapes)
    return 1 - sum(s.length for s in shapes) / (len(shapes) * width)


def plan_groups(
    shapes: Sequence[Shape], strategy: Strategy, max_batch: int, tolerance: int = 16
) -> list[list[int]]:
    """Indices into shapes, one list per forward, in the order the forwards run."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    order = list(range(len(shapes)))
    if strategy == "arrival":
        return [order[i : i + max_batch] for i in range(0, len(order), max_batch)]
    if strategy != "best_fit":
        raise ValueError(f"batch strategy must be arrival or best_fit, got {strategy!r}")
    order.sort(key=lambda i: shapes[i].length)
    groups: list[list[int]] = []
    for i in order:
        group = groups[-1] if groups else None
        if (
            group is None
            or len(group) >= max_batch
            or shapes[i].length - shapes[group[0]].length > tolerance
        ):
            groups.append([i])
        else:
            group.append(i)
    return groups
