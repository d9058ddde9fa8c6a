"""Chunked prefill (`prefill_chunk`): long contexts fed in pieces give the unchunked logits."""

from __future__ import annotations

import numpy as np
import pytest

from agents.engines.torch_hf import TorchEngine
from agents.spec.acceptance import verify

CONTEXT = " ".join(
    f"Q: Tom has {n} apples. Sara gives Tom {n + 3} more. How many apples does Tom have?"
    for n in range(1, 9)
)


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def scored(engine: TorchEngine, chunk: int | None, requests: list[list[int]]):
    """Logits of each request (a fresh session each), scored in one batch with `chunk`."""
    engine.prefill_chunk = chunk
    try:
        sids = [engine.open() for _ in requests]
        logits = engine.score_batch(dict(zip(sids, requests, strict=True)))
        lengths = [engine.length(sid) for sid in sids]
        for sid in sids:
            engine.close(sid)
    finally:
        engine.prefill_chunk = None
    return [logits[sid] for sid in sids], lengths


def test_a_long_context_in_chunks_gives_the_same_logits_and_verdict(target):
    ids = target.tokenize(CONTEXT)
    assert len(ids) > 4 * 16
    (whole,), _ = scored(target, None, [ids])
    (chunked,), lengths = scored(target, 16, [ids])
    assert lengths == [len(ids)] and chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, rtol=1e-4, atol=1e-4)
    assert (chunked.argmax(-1) == whole.argmax(-1)).all()
    # a greedy draft judged on either set of rows gets the same verdict
    draft = [int(t) for t in whole[-6:-1].argmax(-1)]
    assert verify(chunked[-6:], draft).accepted == verify(whole[-6:], draft).accepted


def test_a_batch_of_long_and_short_sessions_in_chunks_matches_unchunked(target):
    ids = target.tokenize(CONTEXT)
    requests = [ids, ids[:9], ids[: len(ids) // 2]]
    whole, _ = scored(target, None, requests)
    chunked, lengths = scored(target, 7, requests)
    assert lengths == [len(r) for r in requests]
    for a, b in zip(chunked, whole, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_a_chunk_must_hold_a_token(tiny_pair):
    with pytest.raises(ValueError, match="prefill_chunk"):
        TorchEngine(tiny_pair.target_hf, prefill_chunk=0)
