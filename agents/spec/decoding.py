"""Autoregressive (AD) and speculative (SD) decoding of one sequence on local engines.

These loops are the reference the distributed modes are checked against: SLED splits the SD
round across a device (drafting) and a server (verifying) but applies the same
`acceptance.verify` to the same logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.emulation import clock
from agents.engines.base import Engine
from agents.spec.acceptance import pick, probabilities, sample, verify
from agents.spec.rates import acceptance_rate
from agents.spec.session import TrackedSession
from agents.spec.sparse import dense_rows, top_k_distribution


@dataclass
class Generation:
    """Generated tokens (prompt excluded) and what it took."""

    tokens: list[int]
    seconds: float
    rounds: int = 0  # SD rounds (AD: target forwards)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # SD rounds that ended in a rejected draft
    accepted_lengths: list[int] = field(default_factory=list)  # per round, with the bonus
    draft_seconds: float = 0.0  # SD: time spent drafting
    verify_seconds: float = 0.0  # SD: time spent in target forwards and the acceptance rule

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (agents.spec.rates)."""
        return acceptance_rate(self.accepted, self.drafted) or 0.0


def finish(tokens: list[int], stop_id: int, max_new: int) -> tuple[list[int], bool]:
    """Cut generated tokens at the stop token (kept; the engine's EOS, or
    `agents.workloads.request.NO_STOP` for an answer held to its length) or max_new; say
    whether generation is over."""
    if stop_id in tokens[:max_new]:
        tokens = tokens[: tokens.index(stop_id) + 1]
        return tokens, True
    if len(tokens) >= max_new:
        return tokens[:max_new], True
    return tokens, False


def generate_ad(
    engine: Engine,
    prompt: Sequence[int],
    max_new: int,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    stop_id: int | None = None,
) -> Generation:
    """The target alone, one token per forward, until max_new tokens or the stop token
    (default the engine's EOS)."""
    stop = engine.eos_id if stop_id is None else stop_id
    t0 = clock.monotonic()
    session = TrackedSession(engine)
    committed = list(prompt)
    out: list[int] = []
    steps = 0
    try:
        while True:
            logits = session.score(session.prepare(committed))[-1]
            steps += 1
            token = pick(logits, temperature, rng)
            committed.append(token)
            out, done = finish(out + [token], stop, max_new)
            if done:
                break
    finally:
        session.close()
    return Generation(out, clock.monotonic() - t0, rounds=steps)


def draft_tokens(
    session: TrackedSession,
    committed: Sequence[int],
    k: int,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    top_k: int | None = None,
    confidences: list[float] | None = None,
    min_confidence: float = 0.0,
    stop_id: int | None = None,
) -> tuple[list[int], np.ndarray | None]:
    """Draft k tokens after committed; return them and their draft distributions (sampling).

    Greedy drafting uses the engine's `draft_greedy` fast path where it has one (llama.cpp),
    which may stop early after EOS (unless stop_id says the answer is held past it). With
    top_k, each token is sampled from the top_k most likely tokens, renormalised
    (`agents.spec.sparse`), and that truncated row is returned. Given a `confidences` list,
    each draft's probability under the draft is appended to it and drafting stops after the
    first draft below min_confidence.
    """
    feed = session.prepare(committed)
    fast = getattr(session.engine, "draft_greedy", None)
    if temperature <= 0 and fast is not None:
        drafts = fast(session.sid, feed, k, stop_at_eos=stop_id in (None, session.engine.eos_id),
                      confidences=confidences, min_confidence=min_confidence)  # fmt: skip
        session.record_scored(feed + drafts[:-1])
        return drafts, None
    drafts: list[int] = []
    rows: list[np.ndarray] = []
    for _ in range(k):
        logits = session.score(feed)[-1]
        if temperature > 0:
            if top_k:
                ids, probs = top_k_distribution(logits, temperature, top_k)
                q = dense_rows([ids], [probs], logits.shape[-1])[0]
            else:
                q = probabilities(logits, temperature)
            rows.append(q)
            if rng is None:
                raise ValueError("sampling (temperature > 0) needs a random generator")
            token = sample(q, rng)
        else:
            token = int(np.argmax(logits))
        drafts.append(token)
        if confidences is not None:
            conf = rows[-1][token] if rows else probabilities(logits, 1.0)[token]
            confidences.append(float(conf))
            if confidences[-1] < min_confidence:
                break
        feed = [token]
    return drafts, (np.stack(rows) if rows else None)


def generate_sd(
    draft: Engine,
    target: Engine,
    prompt: Sequence[int],
    max_new: int,
    k: int,
    temperature: float = 0.0,
    rng: np.random.Generator | None = None,
    stop_id: int | None = None,
) -> Generation:
    """Speculative decoding: the draft proposes k tokens, the target verifies them at once,
    until max_new tokens or the stop token (default the target's EOS)."""
    stop = target.eos_id if stop_id is None else stop_id
    if k < 1:
        raise ValueError("draft length k must be >= 1")
    t0 = clock.monotonic()
    ds, ts = TrackedSession(draft), TrackedSession(target)
    committed = list(prompt)
    gen = Generation([], 0.0)
    try:
        while True:
            t_draft = clock.monotonic()
            drafts, q = draft_tokens(ds, committed, k, temperature, rng, stop_id=stop)
            t_verify = clock.monotonic()
            feed = ts.prepare(committed)
            logits = ts.score(feed + drafts)[len(feed) - 1 :]
            verdict = verify(logits, drafts, temperature, q, rng)
            ts.truncate(len(committed) + verdict.accepted)
            gen.draft_seconds += t_verify - t_draft
            gen.verify_seconds += clock.monotonic() - t_verify
            new = verdict.emitted(drafts)
            committed.extend(new)
            gen.rounds += 1
            gen.drafted += len(drafts)  # fewer than k when the draft stopped at EOS
            gen.rejections += verdict.accepted < len(drafts)
            gen.accepted += verdict.accepted
            gen.accepted_lengths.append(len(new))
            gen.tokens, done = finish(gen.tokens + new, stop, max_new)
            if done:
                break
    finally:
        ds.close()
        ts.close()
    gen.seconds = clock.monotonic() - t0
    return gen
