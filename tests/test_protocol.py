"""The SLED wire protocol: round trips and clear errors on bad datagrams."""

from __future__ import annotations

import pytest

from agents.protocol import wire


@pytest.mark.parametrize(
    "msg",
    [
        wire.Hello(dev="d1", tokenizer="ab" * 32, rid=5),
        wire.HelloAck(rid=5, ok=False, tokenizer="cd", reason="mismatch"),
        wire.Verify(dev="d1", rid=7, sid="p3", pos=12, ctx=[1, 2], draft=[3, 4, 5]),
        wire.Verdict(rid=7, sid="p3", accepted=2, token=9, length=17, batch=3, queue_ms=0.5),
        wire.Resync(rid=7, sid="p3", have=0),
        wire.Ping(dev="d1", rid=8),
        wire.Pong(rid=8),
        wire.End(dev="d1", sid="p3"),
        wire.Error(rid=1, reason="nope"),
    ],
)
def test_round_trip(msg):
    data = msg.encode()
    assert data[:2] == wire.MAGIC and data[2] == wire.VERSION
    assert wire.decode(data) == msg


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"XX\x01\x03{}", "bad magic"),
        (b"SL\x09\x03{}", "version 9 not supported"),
        (b"SL\x01\x63{}", "unknown message type 99"),
        (b"SL\x01\x03not json", "Verify: body is not JSON"),
        (b"SL\x01\x03[1]", "must be a JSON object"),
        (b'SL\x01\x03{"dev":"d","rid":1,"sid":"s","pos":0,"ctx":[1]}', "draft"),
        (b'SL\x01\x03{"dev":"d","rid":"1","sid":"s","pos":0,"ctx":[],"draft":[]}', "Verify.rid"),
        (b'SL\x01\x03{"dev":"d","rid":1,"sid":"s","pos":0,"ctx":["a"],"draft":[]}', "ctx"),
    ],
)
def test_bad_datagrams_are_named(data, needle):
    with pytest.raises(wire.ProtocolError, match=needle):
        wire.decode(data)


def test_oversized_message_is_refused():
    with pytest.raises(wire.ProtocolError, match="exceeds a datagram"):
        wire.Verify("d", 1, "s", 0, list(range(20000)), []).encode()


def test_agent_address_arguments():
    import argparse

    from agents.protocol.address import parse_address

    assert parse_address("10.77.0.1:7000") == ("10.77.0.1", 7000)
    for bad in ("10.77.0.1", ":7000", "host:port", "h:70000"):
        with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
            parse_address(bad)
