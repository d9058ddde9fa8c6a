"""What the verification server accepts from an authenticated device, and refusal counting.

A tagged datagram comes from a lab host, but a buggy or stale device can still send
nonsense; every request is checked here against the server's limits before it reaches the
engine. A check returns a refusal code (counted by `Refusals`) or None.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from agents.protocol import wire

MAX_RID = 2**53  # request ids are JSON-safe integers
MAX_COPIES = 4  # redundant sends of one request (and of its answer)
NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True)
class Limits:
    """Bounds on one VERIFY: vocabulary, draft length, and sequence length."""

    vocab_size: int
    max_draft: int = 64
    max_seq_length: int = 4096
    max_support: int = 256  # longest sparse draft distribution row
    max_temperature: float = 10.0
    truncate: bool = False  # longer sessions keep their most recent tokens instead of refusal


def check_names(dev: str, sid: str | None = None) -> str | None:
    """Device and session names: short, printable, no spaces."""
    if not NAME.match(dev) or (sid is not None and not NAME.match(sid)):
        return "bad_name"
    return None


def check_rid(rid: int) -> str | None:
    return None if 0 <= rid < MAX_RID else "bad_rid"


def check_verify(msg: wire.Verify, limits: Limits) -> str | None:
    """The refusal code for a VERIFY that breaks a limit, or None."""
    problem = check_names(msg.dev, msg.sid) or check_rid(msg.rid)
    if problem:
        return problem
    if msg.pos < 0:
        return "bad_position"
    if not 1 <= msg.copies <= MAX_COPIES:
        return "bad_copies"
    if len(msg.draft) > limits.max_draft:
        return "draft_too_long"
    if any(not 0 <= t < limits.vocab_size for t in msg.ctx) or any(
        not 0 <= t < limits.vocab_size for t in msg.draft
    ):
        return "token_out_of_vocab"
    if not limits.truncate and msg.pos + len(msg.ctx) + len(msg.draft) > limits.max_seq_length:
        return "sequence_too_long"
    if msg.conf and (len(msg.conf) != len(msg.draft) or any(not 0 <= c <= 1 for c in msg.conf)):
        return "bad_confidence"
    if msg.temp != 0.0 or msg.q_ids or msg.q_probs:
        return check_draft_distribution(msg, limits)
    return None


def check_draft_distribution(msg: wire.Verify, limits: Limits) -> str | None:
    """A sampled draft: one sparse q row per token, holding that token, summing to 1."""
    if not 0 < msg.temp <= limits.max_temperature:
        return "bad_temperature"
    if not (len(msg.q_ids) == len(msg.q_probs) == len(msg.draft)):
        return "bad_distribution"
    for token, ids, probs in zip(msg.draft, msg.q_ids, msg.q_probs, strict=True):
        if not 0 < len(ids) == len(probs) <= limits.max_support or len(set(ids)) != len(ids):
            return "bad_distribution"
        if any(not 0 <= t < limits.vocab_size for t in ids):
            return "token_out_of_vocab"
        if any(not 0 <= p <= 1 for p in probs) or abs(sum(probs) - 1) > 1e-6:
            return "bad_distribution"
        if token not in ids or probs[ids.index(token)] <= 0:
            return "bad_distribution"
    return None


def check_generate(msg: wire.Generate, limits: Limits) -> str | None:
    """The refusal code for a centralized GENERATE that breaks a limit, or None."""
    problem = check_names(msg.dev, msg.sid) or check_rid(msg.rid)
    if problem:
        return problem
    if not msg.prompt or any(not 0 <= t < limits.vocab_size for t in msg.prompt):
        return "token_out_of_vocab"
    longest = msg.max_new + (1 if limits.truncate else len(msg.prompt))  # truncate: a tail
    if msg.max_new < 1 or longest > limits.max_seq_length:
        return "sequence_too_long"
    return None


class Refusals(Counter[str]):
    """Datagrams refused or dropped, by reason code."""

    def snapshot(self) -> dict[str, int]:
        return dict(sorted(self.items()))
