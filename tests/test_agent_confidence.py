"""Draft confidence: kept per token, early stop under a threshold, acceptance per bucket."""

from __future__ import annotations

import numpy as np
import pytest
from agent_harness import ServerThread, assert_targets_greedy_output, problems, run_device

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.records import read_records
from agents.spec.acceptance import probabilities
from agents.spec.confidence import ConfidenceBuckets
from agents.spec.decoding import draft_tokens
from agents.spec.session import TrackedSession


@pytest.fixture(scope="module")
def draft(tiny_pair):
    return LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)


def draft_with(engine, ids, k, min_confidence):
    s = TrackedSession(engine)
    conf: list[float] = []
    try:
        drafts, _ = draft_tokens(s, ids, k, confidences=conf, min_confidence=min_confidence)
    finally:
        s.close()
    return drafts, conf


@pytest.mark.parametrize("kind", ["llama", "torch"])
def test_confidences_are_the_drafts_probabilities_and_stop_drafting(tiny_pair, draft, kind):
    engine = draft if kind == "llama" else TorchEngine(tiny_pair.draft_hf, threads=1)
    ids = engine.tokenize(problems(1, seed=8)[0]["prompt"])
    drafts, conf = draft_with(engine, ids, 8, 0.0)
    assert len(drafts) == len(conf) == 8
    s = TrackedSession(engine)  # the same probabilities from plain scoring
    rows = s.score(list(ids) + drafts[:-1])[len(ids) - 1 :]
    s.close()
    expected = [probabilities(r, 1.0)[t] for r, t in zip(rows, drafts, strict=True)]
    assert np.allclose(conf, expected, atol=1e-4)
    # a threshold stops drafting right after the first draft below it
    threshold = sorted(conf)[len(conf) // 2] + 1e-9
    stop = next(i for i, c in enumerate(conf) if c < threshold)
    short, short_conf = draft_with(engine, ids, 8, threshold)
    assert short == drafts[: stop + 1] and len(short_conf) == stop + 1
    assert draft_with(engine, ids, 8, 1.01)[0] == drafts[:1]  # nothing is that confident


def test_buckets_count_judged_drafts_only():
    b = ConfidenceBuckets()
    b.add([0.95, 0.85, 0.3, 0.99], accepted=2)  # 0.95, 0.85 accepted; 0.3 rejected; 0.99 unjudged
    rows = {r["conf_lo"]: r for r in b.rows()}
    assert (rows[0.9]["judged"], rows[0.9]["accepted"]) == (1, 1)
    assert (rows[0.8]["judged"], rows[0.8]["accepted"]) == (1, 1)
    assert (rows[0.2]["judged"], rows[0.2]["accepted"]) == (1, 0)
    b.add([1.0], accepted=1)
    assert b.rows()[-1]["judged"] == 2  # 1.0 counts in the top bucket


def test_confidences_travel_with_drafts_and_output_stays_the_targets(tmp_path, tiny_pair, draft):
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    server = ServerThread(target, tmp_path / "server")
    items = problems(3, seed=12)
    try:
        rounds = run_device(draft, server.addr, tmp_path / "dev", items, max_new=40,
                            draft_len=6, min_confidence=0.6)  # fmt: skip
    finally:
        server.stop()
    assert all(len(r["conf"]) == r["drafted"] for r in rounds)
    # every round stopped at its first draft under 0.6, or drafted all 6
    assert all(r["drafted"] == 6 or r["conf"][-1] < 0.6 for r in rounds)
    assert all(min(r["conf"][:-1], default=1.0) >= 0.6 for r in rounds)
    table = read_records(tmp_path / "server" / "confidence.jsonl")
    judged = sum(r["judged"] for r in table)
    assert judged == sum(min(r["accepted"] + 1, r["drafted"]) for r in rounds)
    assert_targets_greedy_output(target, tmp_path / "dev", items, 40)
