"""`max_seq_length` truncation: what part of a long session the target still sees.

With `--max-seq-policy truncate`, a session that outgrows `max_seq_length` is not refused:
the target keeps the first token (BOS, which anchors attention) and the most recent tokens,
so that context and draft together stay within `max_seq_length`. The oldest tokens after BOS
are dropped in steps of a quarter of the room left beside the longest draft, so the cache is
rebuilt (re-prefilled from position 0) once per step instead of every round. The device's
view of positions is unchanged: the server keeps every committed token and feeds the target
only the window.
"""

from __future__ import annotations

from collections.abc import Sequence


def slide_step(max_seq_length: int, max_draft: int) -> int:
    """How many tokens the window moves on when it must move."""
    room = max_seq_length - max_draft
    if room < 2:
        raise ValueError(
            f"max_seq_length ({max_seq_length}) must exceed the longest draft ({max_draft}) "
            "by at least 2 tokens to truncate"
        )
    return max(1, room // 4)


def dropped_tokens(committed: int, max_seq_length: int, max_draft: int) -> int:
    """Tokens after BOS left out of the window of a session with `committed` tokens."""
    over = committed + max_draft - max_seq_length
    if over <= 0:
        return 0
    step = slide_step(max_seq_length, max_draft)
    return -(-over // step) * step


def window(committed: Sequence[int], dropped: int) -> list[int]:
    """The tokens the target sees: the first one, then all but the `dropped` after it."""
    return [*committed[:1], *committed[1 + dropped :]]
