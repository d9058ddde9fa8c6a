"""`max_seq_length` truncation: a long session keeps BOS and its most recent tokens."""

from __future__ import annotations

import numpy as np
import pytest
from agent_harness import KEY, ServerThread, run_past_the_limit

from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.records import read_records
from agents.sled.link import ServerLink
from agents.sled.request_checks import Limits
from agents.sled.retry import FixedTimeout
from agents.sled.truncation import dropped_tokens, window
from agents.spec.acceptance import verify

CONTEXT = " ".join(f"Q: Tom has {n} apples. Sara gives {n + 3} more." for n in range(1, 7))


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def test_the_window_keeps_bos_and_the_most_recent_tokens_within_the_limit():
    limit, longest = 40, 8
    previous = 0
    for n in range(1, 200):
        committed = list(range(n))
        dropped = dropped_tokens(n, limit, longest)
        seen = window(committed, dropped)
        assert len(seen) + longest <= limit if dropped else seen == committed
        assert seen[0] == 0 and seen[1:] == committed[len(committed) - len(seen) + 1 :]
        assert dropped >= previous  # the window only moves on
        assert dropped in (previous, previous + (limit - longest) // 4)  # in whole steps
        previous = dropped
    assert previous > 0
    with pytest.raises(ValueError, match="max_seq_length"):
        dropped_tokens(50, 9, 8)


def test_a_context_longer_than_the_limit_is_verified_on_its_window(tmp_path, target):
    ids = target.tokenize(CONTEXT)
    limits = Limits(target.vocab_size, max_draft=8, max_seq_length=len(ids) // 2, truncate=True)
    srv = ServerThread(target, tmp_path / "server", limits=limits)
    link = ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0))
    try:
        ref = target.open()
        dropped = dropped_tokens(len(ids), limits.max_seq_length, limits.max_draft)
        seen = window(ids, dropped)
        last = target.score(ref, seen)[-1:]
        draft = [int(last[0].argmax()), 5]
        expected = verify(np.concatenate([last, target.score(ref, draft)]), draft)
        target.close(ref)
        wanted = lambda m: getattr(m, "rid", None) == 1  # noqa: E731
        msg = wire.Verify("d1", 1, "s1", 0, ids, draft, srv.server.epoch)
        verdict = link.request(msg, wanted, FixedTimeout(3000), 1).reply
        assert isinstance(verdict, wire.Verdict)
        assert (verdict.accepted, verdict.token) == (expected.accepted, expected.token)
        assert verdict.length == len(ids) + verdict.accepted + 1  # device positions unchanged
        assert srv.server.pool.used <= limits.max_seq_length
        assert not srv.server.refusals["sequence_too_long"]
        far = wire.Verify("d1", 2, "s1", 10**30, [5], [6], srv.server.epoch)
        wanted = lambda m: getattr(m, "rid", None) == 2  # noqa: E731
        resync = link.request(far, wanted, FixedTimeout(3000), 1).reply
        assert isinstance(resync, wire.Resync) and resync.have == verdict.length
    finally:
        link.close()
        srv.stop()
    (row,) = read_records(tmp_path / "server" / "verifications.jsonl")
    assert row["dropped"] == dropped > 0


def test_a_session_longer_than_the_limit_stays_verified(tmp_path, target, tiny_pair):
    srv, rounds = run_past_the_limit(tmp_path, target, tiny_pair.draft_gguf, 12, truncate=True)
    assert {r["mode"] for r in rounds} == {"verified"}
    assert not srv.server.refusals["sequence_too_long"]
    (req,) = read_records(tmp_path / "dev" / "requests.jsonl")
    assert req["verified_tokens"] == req["tokens"] > 12
    rows = read_records(tmp_path / "server" / "verifications.jsonl")
    assert max(r["dropped"] for r in rows) > 0
