"""The server's KV-cache pool: a fixed budget shared by sessions, refusal, idle expiry."""

from __future__ import annotations

import time

import pytest
from agent_harness import KEY, ServerThread

from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.sled.kv_pool import KvPool, budget_tokens
from agents.sled.link import ServerLink
from agents.sled.retry import FixedTimeout

PROMPT = "Q: Tom has 3 apples. Sara gives Tom 4 more. How many apples"


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def ask(link: ServerLink, msg: wire.Verify) -> wire.Message | None:
    wanted = lambda m: getattr(m, "rid", None) == msg.rid  # noqa: E731
    return link.request(msg, wanted, FixedTimeout(2000), 1).reply


def test_pool_accounting_and_idle_order():
    pool = KvPool(budget=100, idle_s=10)
    pool.hold("a", 60, now=0.0)
    assert pool.fits("a", 100) and not pool.fits("b", 41) and pool.fits("b", 40)
    pool.hold("b", 40, now=5.0)
    assert pool.used == 100 and pool.idle(now=12.0) == ["a"]
    assert pool.idle(now=20.0) == ["a", "b"]
    pool.release("a")
    assert pool.used == 40


def test_a_memory_fraction_becomes_a_token_budget(target):
    per_token = target.kv_bytes_per_token
    assert per_token > 0
    assert budget_tokens(0.5, "cpu", per_token) == pytest.approx(
        2 * budget_tokens(0.25, "cpu", per_token), abs=1
    )
    with pytest.raises(ValueError, match="fraction"):
        budget_tokens(1.5, "cpu", per_token)


def test_a_session_that_does_not_fit_is_refused_and_others_go_on(tmp_path, target):
    ids = target.tokenize(PROMPT)
    budget = len(ids) + 4 + len(ids) // 2  # room for one session, not two
    srv = ServerThread(target, tmp_path / "server", pool=KvPool(budget=budget, idle_s=600))
    link = ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0))
    try:
        epoch = srv.server.epoch
        first = ask(link, wire.Verify("d1", 1, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(first, wire.Verdict)
        refused = ask(link, wire.Verify("d2", 1, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(refused, wire.Error) and refused.code == "kv_pool_full"
        assert srv.server.refusals["kv_pool_full"] == 1
        assert srv.server.pool.used <= budget
        # the session in the pool goes on
        nxt = ask(link, wire.Verify("d1", 2, "s1", first.length, [], [7], epoch))
        assert isinstance(nxt, wire.Verdict)
        # once it ends, the other device fits
        link.send(wire.End("d1", "s1", 3, epoch))
        deadline = time.monotonic() + 5
        while srv.server.pool.used and time.monotonic() < deadline:
            time.sleep(0.01)
        again = ask(link, wire.Verify("d2", 2, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(again, wire.Verdict)
    finally:
        link.close()
        srv.stop()


def test_idle_sessions_expire_and_free_the_pool(tmp_path, target):
    ids = target.tokenize(PROMPT)
    srv = ServerThread(target, tmp_path / "server", pool=KvPool(budget=10_000, idle_s=0.3))
    link = ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0))
    try:
        verdict = ask(link, wire.Verify("d1", 1, "s1", 0, ids, [5], srv.server.epoch))
        assert isinstance(verdict, wire.Verdict) and srv.server.pool.used > 0
        deadline = time.monotonic() + 10
        while srv.server.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not srv.server.sessions and srv.server.pool.used == 0
        assert srv.server.refusals["expired_idle"] == 1
        resync = ask(link, wire.Verify("d1", 2, "s1", verdict.length, [], [5], srv.server.epoch))
        assert isinstance(resync, wire.Resync) and resync.have == 0  # the device resends
    finally:
        link.close()
        srv.stop()


def test_a_filled_pool_refuses_every_session_until_drained(tmp_path, target):
    """The fault `fill_kv`: ballast as large as the budget, held by no session and never
    expired; a session in the pool cannot grow, none can open, and all go on once drained."""
    ids = target.tokenize(PROMPT)
    srv = ServerThread(target, tmp_path / "server", pool=KvPool(budget=10_000, idle_s=0.3))
    link = ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0))
    try:
        epoch = srv.server.epoch
        first = ask(link, wire.Verify("d1", 1, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(first, wire.Verdict)
        srv.server.pool.fill()
        grow = ask(link, wire.Verify("d1", 2, "s1", first.length, [], [7], epoch))
        opening = ask(link, wire.Verify("d2", 1, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(grow, wire.Error) and grow.code == "kv_pool_full"
        assert isinstance(opening, wire.Error) and opening.code == "kv_pool_full"
        time.sleep(0.6)  # past idle_s: sessions may expire, the ballast may not
        assert srv.server.pool.used >= srv.server.pool.budget
        srv.server.pool.drain()
        again = ask(link, wire.Verify("d2", 2, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(again, wire.Verdict) and srv.server.refusals["kv_pool_full"] == 2
    finally:
        link.close()
        srv.stop()
