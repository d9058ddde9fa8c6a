"""Fuzz: >= 10,000 random, mutated and well-formed-but-hostile datagrams to a running server.

Afterwards the server must still be alive, have counted every datagram, have raised no
internal error, and verify a normal device session to exactly the target's greedy output.
Datagrams go out in bursts of 100 followed by a PING barrier (the PONG comes back only
after the server has handled everything before it), so none is lost to a full socket buffer.
"""

from __future__ import annotations

import json
import random
import socket

import pytest
from agent_harness import KEY, ServerThread, assert_targets_greedy_output, problems, run_device

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.protocol.auth import LabKey
from agents.records import read_records
from agents.sled.request_checks import Limits

N_DATAGRAMS = 10_000
BURST = 100
EXPECTED_REASONS = (
    "bad_magic", "bad_tag", "bad_version", "unknown_kind", "bad_json", "bad_body", "bad_field",
    "token_out_of_vocab", "bad_position", "draft_too_long", "sequence_too_long", "bad_name",
    "bad_rid", "stale_epoch", "replay", "unexpected_kind", "tokenizer_mismatch",
)  # fmt: skip


def signed(kind: int, body: bytes, version: int = wire.VERSION) -> bytes:
    header = wire.MAGIC + bytes([version, kind])
    return header + KEY.tag(header + body) + body


def hostile_bodies(rng: random.Random, epoch: str, vocab: int) -> list[bytes]:
    """Signed datagrams that parse but break the rules in one way each."""
    ok = {"dev": "fz", "rid": rng.randrange(1, 2**40), "sid": "s", "pos": 0,
          "ctx": [1, 5, 9], "draft": [4], "epoch": epoch}  # fmt: skip

    def verify(**change) -> bytes:
        return signed(wire.Kind.VERIFY, json.dumps({**ok, **change}).encode())

    deep = "[" * rng.randrange(9, 3000) + "]" * 5
    return [
        verify(draft=[rng.choice([-1, vocab, 10**12])]),
        verify(ctx=[rng.randrange(vocab) for _ in range(5)] + [vocab + 3]),
        verify(pos=rng.choice([-1, -(10**9), 10**18, 2**64])),
        verify(draft=[1] * rng.randrange(9, 500)),
        verify(ctx=[1] * rng.randrange(300, 3000)),
        verify(dev=rng.choice(["", "x" * 100, "a b", "é", "../etc"])),
        verify(rid=rng.choice([-5, 2**60, 10**100])),
        verify(epoch="stale", dev="fz-stale", rid=rng.randrange(2**52)),
        verify(pos=rng.randrange(1, 200), sid=f"u{rng.randrange(1000)}"),  # unknown session
        verify(rid=rng.randrange(1, 1000)),  # out of order after larger ids
        verify(draft=True),
        verify(ctx="abc"),
        verify(ctx=[1.5]),
        signed(wire.Kind.VERIFY, b'{"extra":' + deep.encode() + b"}"),
        signed(wire.Kind.VERIFY, deep.encode()),
        signed(wire.Kind.VERIFY, b"[]"),
        signed(wire.Kind.VERIFY, b"\xff\xfe"),
        signed(
            rng.choice([2, 4, 5, 7, 9]),
            b'{"rid":1,"sid":"s","ok":true,"tokenizer":"x",'
            b'"accepted":1,"token":1,"length":1,"have":0,"reason":"r"}',
        ),  # fmt: skip
        signed(
            wire.Kind.END,
            json.dumps({"dev": "fz", "sid": "nope", "rid": 2**41, "epoch": epoch}).encode(),
        ),  # fmt: skip
        signed(
            wire.Kind.HELLO,
            json.dumps(
                {"dev": "fz", "tokenizer": "0" * 64, "rid": rng.randrange(2**41, 2**50)}
            ).encode(),
        ),  # fmt: skip
        signed(rng.randrange(10, 256), b"{}"),
        signed(wire.Kind.PING, b"{}", version=rng.choice([0, 1, 3, 255])),
        verify(
            ctx=[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))],
            draft=[rng.randrange(vocab) for _ in range(rng.randrange(0, 8))],
            rid=2**45 + rng.randrange(2**40),
            sid=f"v{rng.randrange(50)}",
        ),  # fmt: skip
    ]


def valid_samples(epoch: str) -> list[bytes]:
    return [
        wire.Hello("d1", "ab" * 32, rid=1).encode(KEY),
        wire.Verify("d1", 2, "s", 0, [1, 5, 9], [4, 4], epoch).encode(KEY),
        wire.End("d1", "s", 3, epoch).encode(KEY),
        wire.Ping("d1", 4).encode(KEY),
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        op = rng.randrange(4)
        if op == 0 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif op == 1:
            b = b[: rng.randrange(len(b) + 1)]
        elif op == 2:
            b += rng.randbytes(rng.randrange(1, 64))
        elif b:
            i = rng.randrange(len(b))
            b[i:i] = rng.randbytes(rng.randrange(1, 16))
    return bytes(b)


def datagram(rng: random.Random, epoch: str, vocab: int) -> bytes:
    """One datagram of a random family: random bytes, header + junk, mutated, hostile."""
    family = rng.random()
    if family < 0.2:
        return rng.randbytes(rng.randrange(0, 300))
    if family < 0.35:
        header = wire.MAGIC + bytes([wire.VERSION, rng.randrange(256)])
        return header + rng.randbytes(rng.randrange(0, 300))
    if family < 0.5:  # forged: a well-formed message under a guessed key, for the honest dev
        forged = wire.Verify("d1", rng.randrange(2**53), "s", 0, [1], [2], epoch)
        return forged.encode(LabKey(rng.randbytes(32)))
    if family < 0.7:
        return mutate(rng, rng.choice(valid_samples(epoch)))
    return rng.choice(hostile_bodies(rng, epoch, vocab))


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def barrier(sock: socket.socket, addr, rid: int) -> None:
    """PING until the matching PONG: the server has handled every earlier datagram."""
    for _ in range(50):
        sock.sendto(wire.Ping("fuzz-barrier", rid).encode(KEY), addr)
        try:
            while True:
                msg = wire.decode(sock.recvfrom(wire.MAX_DATAGRAM)[0], KEY)
                if isinstance(msg, wire.Pong) and msg.rid == rid:
                    return
        except (TimeoutError, wire.ProtocolError):
            continue
    raise AssertionError("the server stopped answering PING")


def test_server_survives_fuzzing_then_serves_a_device_losslessly(tmp_path, target, tiny_pair):
    limits = Limits(target.vocab_size, max_draft=8, max_seq_length=256)
    srv = ServerThread(target, tmp_path / "server", limits=limits)
    rng = random.Random(1234)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    sent = pings = 0
    try:
        while sent < N_DATAGRAMS:
            for _ in range(BURST):
                sock.sendto(datagram(rng, srv.server.epoch, target.vocab_size), srv.addr)
                sent += 1
            pings += 1
            barrier(sock, srv.addr, pings)
        assert srv.thread.is_alive()
        assert srv.server.datagrams >= sent + pings
        refusals = srv.server.refusals
        assert refusals["internal_error"] == 0
        for reason in EXPECTED_REASONS:
            assert refusals[reason] > 0, reason
        # a normal device session afterwards: output equal to the target's own
        draft = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
        items = problems(2, seed=77)
        rounds = run_device(draft, srv.addr, tmp_path / "dev", items, max_new=32)
    finally:
        sock.close()
        srv.stop()
    assert rounds and all(r["mode"] == "verified" for r in rounds)
    assert_targets_greedy_output(target, tmp_path / "dev", items, 32)
    written = {r["reason"] for r in read_records(tmp_path / "server" / "refusals.jsonl")}
    assert {"bad_tag", "replay", "token_out_of_vocab"} <= written
