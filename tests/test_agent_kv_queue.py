"""The `queue` KV policy: requests that do not fit wait in a bounded FIFO for room."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from agent_harness import KEY, ServerThread, assert_targets_greedy_output, problems, run_device
from test_fuzz_server import barrier, datagram

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.records import read_records
from agents.sled.kv_pool import KvPool, KvQueue
from agents.sled.link import ServerLink
from agents.sled.request_checks import Limits
from agents.sled.server import main as server_main

PROMPT = "Q: Tom has 3 apples. Sara gives Tom 4 more. How many apples"


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def reply_to(link: ServerLink, rid: int, timeout_s: float = 10.0) -> wire.Message | None:
    return link.poll(lambda m: getattr(m, "rid", None) == rid, timeout_s)


def wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_queue_is_fifo_bounded_and_a_newer_request_keeps_its_place():
    q: KvQueue[str] = KvQueue(max_len=2, timeout_s=1.0)
    assert q.offer("d1", "a", now=0.0) and q.offer("d2", "b", now=0.5)
    assert not q.offer("d3", "c", now=0.6)  # full
    assert q.offer("d1", "a2", now=0.7)  # replaces d1's request, still first in line
    assert [(k, item) for k, item, _ in q.take_all()] == [("d1", "a2"), ("d2", "b")]
    assert len(q) == 0
    q.offer("d1", "x", now=0.0)
    q.offer("d2", "y", now=0.9)
    assert q.timed_out(now=1.5) == ["x"] and len(q) == 1
    with pytest.raises(ValueError, match="max_len"):
        KvQueue(max_len=0)


def test_server_flags_reject_an_empty_queue(tmp_path):
    with pytest.raises(SystemExit):
        server_main(["--bind", "127.0.0.1:0", "--model", str(tmp_path), "--key-file",
                     str(tmp_path / "k"), "--records", str(tmp_path), "--kv-policy", "queue",
                     "--kv-queue-max", "0"])  # fmt: skip


@contextmanager
def one_session_server(
    tmp_path, target, ids, **queue
) -> Iterator[tuple[ServerThread, dict[str, ServerLink]]]:
    """A server whose pool holds one session, and a link for each of devices d1 .. d3."""
    budget = len(ids) + 4 + len(ids) // 2  # room for one session, not two
    pool = KvPool(budget=budget, idle_s=600)
    srv = ServerThread(target, tmp_path / "server", pool=pool, kv_queue=KvQueue(**queue))
    links = {d: ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0)) for d in ("d1", "d2", "d3")}
    try:
        yield srv, links
    finally:
        for link in links.values():
            link.close()
        srv.stop()


def test_queued_requests_are_served_in_order_as_sessions_end(tmp_path, target):
    ids = target.tokenize(PROMPT)
    with one_session_server(tmp_path, target, ids, max_len=4, timeout_s=60) as (srv, links):
        epoch = srv.server.epoch
        links["d1"].send(wire.Verify("d1", 1, "s1", 0, ids, [5, 6], epoch))
        first = reply_to(links["d1"], 1)
        assert isinstance(first, wire.Verdict)
        links["d2"].send(wire.Verify("d2", 1, "s1", 0, ids, [5, 6], epoch))
        assert wait_for(lambda: len(srv.server.kv_queue) == 1)
        links["d3"].send(wire.Verify("d3", 1, "s1", 0, ids, [5, 6], epoch))
        assert wait_for(lambda: len(srv.server.kv_queue) == 2)
        # a session in the pool goes on while others wait
        links["d1"].send(wire.Verify("d1", 2, "s1", first.length, [], [7], epoch))
        assert isinstance(reply_to(links["d1"], 2), wire.Verdict)

        links["d1"].send(wire.End("d1", "s1", 3, epoch))
        second = reply_to(links["d2"], 1)
        assert isinstance(second, wire.Verdict)  # first in line, first served
        assert (second.accepted, second.token) == (first.accepted, first.token)
        assert list(srv.server.kv_queue.entries) == ["d3"]  # still waiting: no room yet
        assert srv.server.pool.used <= srv.server.pool.budget

        links["d2"].send(wire.End("d2", "s1", 2, epoch))
        third = reply_to(links["d3"], 1)
        assert isinstance(third, wire.Verdict)
        assert (third.accepted, third.token) == (first.accepted, first.token)
        assert not srv.server.refusals["kv_pool_full"] and not srv.server.kv_queue


def test_a_full_queue_refuses_and_a_long_wait_times_out(tmp_path, target):
    ids = target.tokenize(PROMPT)
    with one_session_server(tmp_path, target, ids, max_len=1, timeout_s=0.3) as (srv, links):
        epoch = srv.server.epoch
        links["d1"].send(wire.Verify("d1", 1, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(reply_to(links["d1"], 1), wire.Verdict)
        links["d2"].send(wire.Verify("d2", 1, "s1", 0, ids, [5, 6], epoch))
        assert wait_for(lambda: len(srv.server.kv_queue) == 1)
        links["d3"].send(wire.Verify("d3", 1, "s1", 0, ids, [5, 6], epoch))
        full = reply_to(links["d3"], 1)
        assert isinstance(full, wire.Error) and full.code == "kv_pool_full"
        late = reply_to(links["d2"], 1)
        assert isinstance(late, wire.Error) and late.code == "kv_queue_timeout"
        assert srv.server.refusals["kv_queue_timeout"] == 1
        assert srv.server.refusals["kv_pool_full"] == 1
        # the server still serves: the session in the pool goes on
        links["d1"].send(wire.Verify("d1", 2, "s1", 0, ids, [5, 6], epoch))
        assert isinstance(reply_to(links["d1"], 2), wire.Verdict)


def test_a_device_that_ends_its_session_leaves_the_queue(tmp_path, target):
    ids = target.tokenize(PROMPT)
    with one_session_server(tmp_path, target, ids, max_len=4, timeout_s=60) as (srv, links):
        epoch = srv.server.epoch
        links["d1"].send(wire.Verify("d1", 1, "s1", 0, ids, [5], epoch))
        assert isinstance(reply_to(links["d1"], 1), wire.Verdict)
        links["d2"].send(wire.Verify("d2", 1, "s1", 0, ids, [5], epoch))
        assert wait_for(lambda: len(srv.server.kv_queue) == 1)
        links["d2"].send(wire.End("d2", "s1", 2, epoch))
        assert wait_for(lambda: not srv.server.kv_queue)
        assert not srv.server.refusals["unknown_session"]
        assert ("d2", "s1") not in srv.server.sessions


def test_fuzzing_a_queueing_truncating_chunking_server_leaves_it_serving(
    tmp_path, target, tiny_pair
):
    """3,000 fuzz datagrams (long contexts, many sessions) against a small pool with a
    queue, truncation and chunked prefill; then a device still gets the target's output."""
    limits = Limits(target.vocab_size, max_draft=8, max_seq_length=256, truncate=True)
    pool = KvPool(budget=600, idle_s=1.0)
    target.prefill_chunk = 32
    srv = ServerThread(target, tmp_path / "server", limits=limits, pool=pool,
                       kv_queue=KvQueue(max_len=4, timeout_s=0.3))  # fmt: skip
    rng = random.Random(4321)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    epoch = srv.server.epoch
    try:
        for burst in range(30):
            for _ in range(100):
                sock.sendto(datagram(rng, srv.server.epoch, target.vocab_size), srv.addr)
            for k in range(3):  # well-formed long contexts from many devices fill the pool
                ctx = [rng.randrange(target.vocab_size) for _ in range(rng.randrange(100, 1200))]
                msg = wire.Verify(f"q{burst % 7}", burst * 3 + k + 1, "s", 0, ctx, [4], epoch)
                sock.sendto(msg.encode(KEY), srv.addr)
            barrier(sock, srv.addr, burst + 1)
        assert srv.thread.is_alive() and srv.server.refusals["internal_error"] == 0
        assert srv.server.pool.used <= pool.budget
        assert srv.server.refusals["kv_pool_full"] + srv.server.refusals["kv_queue_timeout"] > 0
        time.sleep(1.5)  # the fuzzer's sessions go idle and make room
        draft = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
        items = problems(1, seed=78)
        rounds = run_device(draft, srv.addr, tmp_path / "dev", items, max_new=32)
    finally:
        target.prefill_chunk = None
        sock.close()
        srv.stop()
    assert rounds and all(r["mode"] == "verified" for r in rounds)
    assert_targets_greedy_output(target, tmp_path / "dev", items, 32)
    rows = read_records(tmp_path / "server" / "verifications.jsonl")
    assert max(r["dropped"] for r in rows) > 0  # long hostile contexts were truncated


@pytest.mark.parametrize("policy", ["queue", "refuse"])
def test_a_generate_that_does_not_fit_waits_its_turn_or_is_refused(tmp_path, target, policy):
    """Centralized mode: a pool with room for one generation; a second device's GENERATE
    waits and then gets the target's own greedy output (queue), or is refused (refuse)."""
    from agents.spec.decoding import generate_ad

    ids, max_new = target.tokenize(PROMPT), 24
    pool = KvPool(budget=len(ids) + max_new + 4, idle_s=600)  # one generation, not two
    queue = KvQueue(max_len=4, timeout_s=60) if policy == "queue" else None
    srv = ServerThread(target, tmp_path / "server", pool=pool, kv_queue=queue)
    links = {d: ServerLink(srv.addr, KEY, bind=("127.0.0.1", 0)) for d in ("d1", "d2")}
    try:
        epoch = srv.server.epoch
        links["d1"].send(wire.Generate("d1", 1, "s1", ids, max_new, epoch))
        assert wait_for(lambda: srv.server.batcher.busy)
        links["d2"].send(wire.Generate("d2", 1, "s1", ids, max_new, epoch))
        first, second = reply_to(links["d1"], 1), reply_to(links["d2"], 1)
    finally:
        for link in links.values():
            link.close()
        srv.stop()
    expected = generate_ad(target, ids, max_new).tokens
    assert isinstance(first, wire.Result) and first.tokens == expected
    if policy == "queue":
        assert isinstance(second, wire.Result) and second.tokens == expected
        assert second.queue_ms > 0 and not srv.server.refusals["kv_pool_full"]
    else:
        assert isinstance(second, wire.Error) and second.code == "kv_pool_full"
        assert srv.server.refusals["kv_pool_full"] == 1
    assert srv.server.pool.used == 0  # both generations gave their room back
