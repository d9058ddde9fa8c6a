"""The rounds a centralized answer is recorded as: one per token, at the time a streaming
client would have seen it.

The server sends the whole answer in one RESULT, with each token's step end (`token_ms`,
from its first step). A token is taken to reach the device as long before the RESULT as it
was made before the last token: the same one-way delay for every token, as a stream over the
same link would have it on a clean path. So TTFT is the first token's, TPOT and ITL the
server's decoding steps as the device sees them. Without step times (none kept, or no token)
the answer is one round at the RESULT's arrival.
"""

from __future__ import annotations

from typing import Any


def centralized_rounds(
    dev: str, sid: str, t_start: float, t_end: float, tokens: int, token_ms: list[float],
    first: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Round rows for an answer of `tokens` received at `t_end`; `first` holds the columns
    only the first round carries (attempts, waits, the server's timings)."""
    base = {"dev": dev, "problem": sid, "mode": "centralized"}
    if tokens < 1 or len(token_ms) != tokens:
        return [{**base, "round": 0, "t_start": t_start, "t_end": t_end, "tokens": tokens, **first}]
    last = token_ms[-1]
    rows, prev = [], t_start
    for i, ms in enumerate(token_ms):
        seen = max(prev, t_end - (last - ms) / 1000)
        rows.append({**base, "round": i, "t_start": prev, "t_end": seen, "tokens": 1,
                     **(first if i == 0 else {})})  # fmt: skip
        prev = seen
    return rows
