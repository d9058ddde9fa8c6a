"""The verification server against hostile datagrams: tags, replays, forged ids, bad requests.

Each test talks raw UDP to a server thread on loopback and then checks that an honest
request is still verified. Waits poll the server's counters (no timing is asserted).
"""

from __future__ import annotations

import socket
import time

import pytest
from agent_harness import KEY, ServerThread, run_past_the_limit

from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.protocol.auth import LabKey
from agents.records import read_records
from agents.sled.request_checks import Limits

PROMPT = "Q: Tom has 3 apples. Sara gives Tom 4 more. How many apples"


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


@pytest.fixture
def server(tmp_path, target):
    limits = Limits(target.vocab_size, max_draft=8, max_seq_length=256)
    srv = ServerThread(target, tmp_path / "server", limits=limits)
    yield srv
    srv.stop()


class Client:
    """A raw UDP client that signs with a chosen key."""

    def __init__(self, addr, key: LabKey = KEY) -> None:
        self.addr, self.key = addr, key
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)

    def send(self, msg: wire.Message | bytes) -> bytes:
        data = msg if isinstance(msg, bytes) else msg.encode(self.key)
        self.sock.sendto(data, self.addr)
        return data

    def reply(self, wait_s: float = 3.0) -> wire.Message | None:
        """The next datagram this client's key authenticates, or None after wait_s."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                data, _ = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except TimeoutError:
                continue
            try:
                return wire.decode(data, KEY)
            except wire.ProtocolError:
                continue
        return None

    def ask(self, msg: wire.Message) -> wire.Message | None:
        self.send(msg)
        return self.reply()


def wait_count(srv: ServerThread, reason: str, at_least: int = 1) -> int:
    deadline = time.monotonic() + 10
    while srv.server.refusals[reason] < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return srv.server.refusals[reason]


def honest_verify(srv, target, client: Client, rid: int, dev: str = "d1") -> wire.Message | None:
    ids = target.tokenize(PROMPT)
    return client.ask(wire.Verify(dev, rid, "s1", 0, ids, [5, 6, 7], srv.server.epoch))


def test_a_wrong_key_is_refused_and_counted(server, target):
    outsider = Client(server.addr, LabKey(b"not-the-lab-secret" * 2))
    outsider.send(wire.Hello("d1", target.tokenizer_hash, rid=1))
    assert wait_count(server, "bad_tag") == 1
    answer = outsider.reply()  # decoded with the lab key: the server's own refusal
    assert isinstance(answer, wire.Error) and answer.code == "bad_tag"
    ack = Client(server.addr).ask(wire.Hello("d1", target.tokenizer_hash, rid=2))
    assert isinstance(ack, wire.HelloAck) and ack.ok and ack.epoch == server.server.epoch


def test_a_replayed_request_is_refused_without_recomputing(server, target):
    client = Client(server.addr)
    first = honest_verify(server, target, client, rid=10)
    assert isinstance(first, wire.Verdict)
    assert isinstance(honest_verify(server, target, client, rid=11), wire.Verdict)
    batches = server.server.batches
    ids = target.tokenize(PROMPT)
    client.send(wire.Verify("d1", 10, "s1", 0, ids, [5, 6, 7], server.server.epoch))
    assert wait_count(server, "replay") == 1
    assert client.reply(0.5) is None
    assert server.server.batches == batches


def test_a_forged_request_id_does_not_silence_the_device(server, target):
    attacker = Client(server.addr, LabKey(b"guessed-secret-guessed-secret-xx"))
    attacker.send(wire.Verify("d1", 2**52, "s1", 0, [1, 2], [3], server.server.epoch))
    wait_count(server, "bad_tag")
    verdict = honest_verify(server, target, Client(server.addr), rid=5)
    assert isinstance(verdict, wire.Verdict)


def test_a_request_from_an_earlier_server_process_is_stale(server, target):
    ids = target.tokenize(PROMPT)
    error = Client(server.addr).ask(wire.Verify("d1", 3, "s1", 0, ids, [5], "0123456789abcdef"))
    assert isinstance(error, wire.Error) and error.code == "stale_epoch"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"draft": [10**9]}, "token_out_of_vocab"),
        ({"ctx": [-1, 5]}, "token_out_of_vocab"),
        ({"pos": -3}, "bad_position"),
        ({"pos": 10**30}, "sequence_too_long"),
        ({"draft": [5] * 9}, "draft_too_long"),
        ({"ctx": [5] * 300}, "sequence_too_long"),
        ({"dev": "a b"}, "bad_name"),
        ({"sid": "x" * 65}, "bad_name"),
        ({"rid": -1}, "bad_rid"),
        ({"rid": 2**70}, "bad_rid"),
    ],
)
def test_a_hostile_request_gets_an_error_with_its_reason(server, target, change, code):
    fields = {"dev": "d2", "rid": 7, "sid": "s1", "pos": 0, "ctx": target.tokenize(PROMPT),
              "draft": [5, 6], "epoch": server.server.epoch}  # fmt: skip
    fields.update(change)
    error = Client(server.addr).ask(wire.Verify(**fields))
    assert isinstance(error, wire.Error) and error.code == code
    assert server.server.refusals[code] == 1
    # the server still verifies, for this device too
    assert isinstance(honest_verify(server, target, Client(server.addr), 8, "d2"), wire.Verdict)


def test_an_unknown_session_is_resynced_or_counted(server, target):
    client = Client(server.addr)
    epoch = server.server.epoch
    resync = client.ask(wire.Verify("d3", 1, "nope", 40, [5], [6], epoch))
    assert isinstance(resync, wire.Resync) and resync.have == 0
    assert not server.server.sessions  # asking about a session does not open one
    client.send(wire.End("d3", "nope", 2, epoch))
    assert wait_count(server, "unknown_session") == 1


def test_an_error_is_never_larger_than_the_datagram_it_answers(server):
    client = Client(server.addr)
    client.send(b"SL")  # 2 bytes: refused silently
    assert wait_count(server, "bad_magic") == 1
    assert client.reply(0.3) is None
    client.send(b"SL\x02\x03" + b"\0" * 16 + b"x" * 200)
    error = client.reply()
    assert isinstance(error, wire.Error) and error.code == "bad_tag"


def test_a_session_longer_than_the_server_allows_falls_back_on_the_device(
    tmp_path, target, tiny_pair
):
    srv, rounds = run_past_the_limit(tmp_path, target, tiny_pair.draft_gguf, 10, truncate=False)
    modes = [r["mode"] for r in rounds]
    assert modes[0] == "verified" and modes[-1] == "fallback"  # verified until the limit
    assert srv.server.refusals["sequence_too_long"] >= 1
    (req,) = read_records(tmp_path / "dev" / "requests.jsonl")
    assert req["verified_tokens"] <= 10 < req["tokens"]
