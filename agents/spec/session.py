"""A session of an engine that remembers its tokens, so it can be synced to any sequence.

Speculative decoding keeps each model's cache at "every committed token but the last". After
a round the committed sequence changes in ways that differ per model (the draft fed drafts the
target rejected; the target never saw fallback tokens), so each side calls `prepare(committed)`
which rolls back to the longest common prefix and returns the tokens still to feed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.engines.base import Engine


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TrackedSession:
    """An engine session plus the list of tokens in its cache."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sid = engine.open()
        self.tokens: list[int] = []

    def prepare(self, committed: Sequence[int]) -> list[int]:
        """Roll back to the common prefix with committed[:-1]; return what is left to feed.

        The returned list always ends with committed[-1], whose logits predict the next token.
        """
        if not committed:
            raise ValueError("a session needs at least one committed token (BOS)")
        keep = common_prefix(self.tokens, committed[:-1])
        if keep < len(self.tokens):
            self.engine.rollback(self.sid, keep)
            del self.tokens[keep:]
        return list(committed[keep:])

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens; return their next-token logits (len(tokens), vocab)."""
        out = self.engine.score(self.sid, tokens)
        self.tokens.extend(tokens)
        return out

    def record_scored(self, tokens: Sequence[int]) -> None:
        """Note tokens fed through a batched call made outside this object."""
        self.tokens.extend(tokens)

    def truncate(self, n: int) -> None:
        """Keep the first n cached tokens."""
        if n < len(self.tokens):
            self.engine.rollback(self.sid, n)
            del self.tokens[n:]

    def close(self) -> None:
        self.engine.close(self.sid)
        self.tokens = []
