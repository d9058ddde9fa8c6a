"""SLED device and server agents over real UDP on loopback, with the real tiny models."""

from __future__ import annotations

import socket
import threading

import pytest
from agent_harness import KEY, LossyRelay, ServerThread, problems, run_device

from agents.emulation import clock
from agents.engines.base import TokenizerMismatchError
from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.records import RecordWriter, read_records
from agents.sled.device import DeviceAgent, DeviceConfig
from agents.sled.link import ServerLink
from agents.sled.retry import FixedTimeout
from agents.spec.decoding import generate_ad

FIXED = FixedTimeout(200.0)


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


@pytest.fixture(scope="module")
def draft(tiny_pair):
    return LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)


def test_verified_answers_equal_the_targets_greedy_answers(tmp_path, draft, target):
    server = ServerThread(target, tmp_path / "server")
    try:
        items = problems(4)
        rounds = run_device(draft, server.addr, tmp_path / "dev", items, max_new=48)
    finally:
        server.stop()
    assert rounds and all(r["mode"] == "verified" for r in rounds)
    assert any(r["accepted"] > 0 for r in rounds)
    for req in read_records(tmp_path / "dev" / "requests.jsonl"):
        item = next(i for i in items if i["id"] == req["problem"])
        ad = generate_ad(target, target.tokenize(item["prompt"]), 48)
        assert req["text"] == target.detokenize(ad.tokens)
        assert req["verified_tokens"] == req["tokens"] == len(ad.tokens)


def test_two_devices_are_verified_in_shared_batches(tmp_path, draft, tiny_pair, target):
    server = ServerThread(target, tmp_path / "server", window_ms=40.0)
    draft2 = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
    try:
        results = {}

        def go(dev, engine, seed):
            results[dev] = run_device(
                engine, server.addr, tmp_path / dev, problems(2, seed), dev=dev, max_new=32
            )

        threads = [
            threading.Thread(target=go, args=("d1", draft, 1)),
            threading.Thread(target=go, args=("d2", draft2, 2)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        server.stop()
    batches = read_records(tmp_path / "server" / "batches.jsonl")
    assert max(b["batch"] for b in batches) == 2
    for dev in ("d1", "d2"):
        reqs = read_records(tmp_path / dev / "requests.jsonl")
        for req in reqs:
            item = next(
                i for i in problems(2, 1 if dev == "d1" else 2) if i["id"] == req["problem"]
            )
            ad = generate_ad(target, target.tokenize(item["prompt"]), 32)
            assert req["text"] == target.detokenize(ad.tokens), dev


def test_repeated_request_id_is_answered_from_cache(tmp_path, target):
    server = ServerThread(target, tmp_path / "server")
    link = ServerLink(server.addr, KEY, bind=("127.0.0.1", 0))
    try:
        ids = target.tokenize("Q: Tom has 3 apples. Sara gives Tom 4 more. How many apples")
        epoch = server.server.epoch
        req = wire.Verify("d1", 10, "s1", 0, ids, [5, 6, 7], epoch)
        wanted = lambda m: isinstance(m, wire.Verdict)  # noqa: E731
        first = link.request(req, wanted, FIXED).reply
        batches_after_first = server.server.batches
        again = link.request(req, wanted, FIXED).reply
        assert again == first
        assert server.server.batches == batches_after_first  # not recomputed
        stale = link.request(wire.Verify("d1", 9, "s1", 0, ids, [1], epoch), wanted, FIXED, 0)
        assert stale.reply is None  # an older id is ignored
        resync = link.request(
            wire.Verify("d1", 11, "s9", 5, [3], [4], epoch),
            lambda m: isinstance(m, wire.Resync),
            FIXED,
        ).reply
        assert resync.have == 0
    finally:
        link.close()
        server.stop()


def test_tokenizer_mismatch_is_refused_naming_both_hashes(tmp_path, target, draft):
    server = ServerThread(target, tmp_path / "server")
    link = ServerLink(server.addr, KEY, bind=("127.0.0.1", 0))
    try:
        ack = link.request(
            wire.Hello("d1", "f" * 64, rid=1), lambda m: isinstance(m, wire.HelloAck), FIXED
        ).reply
        assert not ack.ok
        assert "ffffffffffffffff" in ack.reason and target.tokenizer_hash[:16] in ack.reason

        class OtherTokenizer:  # the device's engine reporting another tokenizer
            def __getattr__(self, name):
                return getattr(draft, name)

            tokenizer_hash = "e" * 64

        with RecordWriter(tmp_path / "dev") as writer:
            agent = DeviceAgent(OtherTokenizer(), link, writer, DeviceConfig("d1"))
            with pytest.raises(TokenizerMismatchError, match="eeeeeeeeeeeeeeee"):
                agent.handshake()
    finally:
        link.close()
        server.stop()


def test_no_server_means_every_token_is_fallback(tmp_path, draft):
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))  # bound but never answers: every datagram is "lost"
    try:
        rounds = run_device(draft, silent.getsockname(), tmp_path / "dev", problems(3))
    finally:
        silent.close()
    assert rounds and all(r["mode"] == "fallback" for r in rounds)
    reqs = read_records(tmp_path / "dev" / "requests.jsonl")
    assert len(reqs) == 3
    assert all(r["fallback_tokens"] == r["tokens"] > 0 for r in reqs)
    # the handshake is the only wait: no fallback round sent a request or waited for a reply
    # (probes go out without waiting)
    assert all(r["attempts"] == 0 and r["waited_ms"] == 0 for r in rounds), rounds
    assert all(r["rtt_ms"] is None for r in rounds)


class WatchedRecords(RecordWriter):
    """A device's record writer that hands each round record, once written, to `on_round`
    (on the device's own thread, between its rounds)."""

    def __init__(self, folder, on_round) -> None:
        super().__init__(folder)
        self.on_round = on_round

    def write(self, table: str, record: dict) -> None:
        super().write(table, record)
        if table == "rounds":
            self.on_round(record)


def test_device_returns_to_verification_when_the_link_heals(tmp_path, draft, target):
    """The link is down from the start (the relay drops everything); once the device, in
    fallback, has had two probes lost, the link heals between two of its rounds; it stops
    after 10 verified rounds. Events are ordered by the device's own thread, not by time."""
    server = ServerThread(target, tmp_path / "server")
    relay = LossyRelay(server.addr)
    relay.down.set()
    link = ServerLink(relay.addr, KEY, bind=("127.0.0.1", 0))
    seen: list[tuple[str, bool]] = []  # (mode, whether the link was down) per round
    handshake_drops: list[int] = []
    healed_at: list[float] = []

    def on_round(record: dict) -> None:
        down = relay.down.is_set()
        if not seen:  # the handshake's HELLOs were dropped; from here on only probes go out
            handshake_drops.append(relay.dropped)
        seen.append((record["mode"], down))
        if down and relay.dropped >= handshake_drops[0] + 2:  # two probes lost while down
            healed_at.append(clock.now())  # the agent's clock, which stamps its rounds
            relay.down.clear()
        if sum(mode == "verified" for mode, _ in seen) >= 10:
            agent.stopping = True

    writer = WatchedRecords(tmp_path / "dev", on_round)
    agent = DeviceAgent(draft, link, writer, DeviceConfig("d1", max_new=48))
    try:
        # the tiny draft emits a fallback answer in about a millisecond: many problems keep
        # the device busy until it is stopped
        agent.run(problems(3000))
    finally:
        writer.close()
        link.close()
        relay.stop()
        server.stop()
    rounds = read_records(tmp_path / "dev" / "rounds.jsonl")
    assert [r["mode"] for r in rounds] == [mode for mode, _ in seen]
    assert healed_at, "the device never had two probes lost while the link was down"
    while_down = [mode for mode, down in seen if down]
    assert while_down and set(while_down) == {"fallback"}  # nothing verified while down
    modes = [r["mode"] for r in rounds]
    assert "verified" in modes
    first = modes.index("verified")
    assert first >= len(while_down)  # after the heal, on the device's own thread
    assert rounds[first]["t_start"] >= healed_at[0]  # the same clock, the same thread
    # after healing the device stays on verification
    assert set(modes[first:]) == {"verified"} and len(modes[first:]) >= 10
