"""Asynchronous look-ahead: keep drafting while a round's verdict is in flight.

While the device waits, it drafts greedily beyond its pending drafts, betting that all of
them are accepted and that the target's bonus token is the draft's own next token. When the
verdict proves the bet (all accepted, bonus equal to the first look-ahead token), the
look-ahead after that token is exactly what the drafter would draft next, so the next round
starts with it at no cost. After a fallback round (no verdict, the drafts are emitted as
they are) the whole look-ahead extends the sequence and is kept too. Greedy drafting only.
"""

from __future__ import annotations

from agents.spec.decoding import draft_tokens
from agents.spec.session import TrackedSession


class LookAhead:
    """Greedy drafts beyond the pending round, one per `step`, at most `cap`."""

    def __init__(self, drafter: TrackedSession, cap: int, stop_id: int) -> None:
        self.drafter, self.cap = drafter, cap
        self.stop_id = stop_id  # the token that ends the answer (none for a held answer)
        self.base: list[int] = []
        self.tokens: list[int] = []
        self.conf: list[float] = []

    def start(self, base: list[int]) -> None:
        """Begin look-ahead after base (committed + the drafts in flight)."""
        self.base, self.tokens, self.conf = base, [], []

    def step(self) -> bool:
        """Draft one more look-ahead token; False when there is nothing more to do."""
        if not self.base or len(self.tokens) >= self.cap or self.stop_id in self.tokens:
            return False
        conf: list[float] = []
        token = draft_tokens(self.drafter, self.base + self.tokens, 1, confidences=conf,
                             stop_id=self.stop_id)[0][0]  # fmt: skip
        self.tokens.append(token)
        self.conf.extend(conf)
        return True

    def kept(self, verified: bool, all_accepted: bool, bonus: int) -> tuple[list[int], list[float]]:
        """The look-ahead that extends the new sequence (the next round's first drafts)."""
        if not verified:
            return self.tokens, self.conf
        if all_accepted and self.tokens and self.tokens[0] == bonus:
            return self.tokens[1:], self.conf[1:]
        return [], []
