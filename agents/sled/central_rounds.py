"""The rounds a centralized answer is recorded as: one per token, at the time a streaming
client would have seen it.

The server sends the whole answer in one RESULT (one datagram, as before), with how long its
decoding took after the first token (`gen_ms - first_ms`). Each token is taken to reach the
device that long before the RESULT, its decoding steps spread evenly over it: the same one-way
delay for every token, as a stream over the same link would have it on a clean path. TTFT and
TPOT are then exactly those a streaming client sees; the ITL within an answer is its mean
step. Without that time (no token, or an older server) the answer is one round at the
RESULT's arrival.
"""

from __future__ import annotations

from typing import Any


def centralized_rounds(
    dev: str, sid: str, t_start: float, t_end: float, tokens: int, decode_ms: float | None,
    first: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """Round rows for an answer of `tokens` received at `t_end` whose tokens after the first
    took `decode_ms` to make; `first` holds the columns only the first round carries
    (attempts, waits, the server's timings)."""
    base = {"dev": dev, "problem": sid, "mode": "centralized"}
    if tokens < 1 or decode_ms is None or decode_ms < 0:
        return [{**base, "round": 0, "t_start": t_start, "t_end": t_end, "tokens": tokens, **first}]
    step_s = decode_ms / 1000 / max(1, tokens - 1)
    rows, prev = [], t_start
    for i in range(tokens):
        seen = max(prev, t_end - (tokens - 1 - i) * step_s)
        rows.append({**base, "round": i, "t_start": prev, "t_end": seen, "tokens": 1,
                     **(first if i == 0 else {})})  # fmt: skip
        prev = seen
    return rows
