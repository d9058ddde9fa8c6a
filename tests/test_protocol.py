"""The SLED wire protocol: round trips, tags, and clear errors on bad datagrams."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from agents.protocol import wire
from agents.protocol.auth import TAG_BYTES, KeyFileError, LabKey, new_key_text

KEY = LabKey(b"k" * 32)


def signed(header: bytes, body: bytes, key: LabKey = KEY) -> bytes:
    """A datagram with a correct tag around an arbitrary header and body."""
    return header + key.tag(header + body) + body


@pytest.mark.parametrize(
    "msg",
    [
        wire.Hello(dev="d1", tokenizer="ab" * 32, rid=5),
        wire.HelloAck(rid=5, ok=False, tokenizer="cd", reason="mismatch", epoch="e1"),
        wire.Verify(dev="d1", rid=7, sid="p3", pos=12, ctx=[1, 2], draft=[3, 4, 5], epoch="e"),
        wire.Verdict(rid=7, sid="p3", accepted=2, token=9, length=17, batch=3, queue_ms=0.5),
        wire.Resync(rid=7, sid="p3", have=0),
        wire.Ping(dev="d1", rid=8),
        wire.Pong(rid=8),
        wire.End(dev="d1", sid="p3", epoch="e"),
        wire.Error(rid=1, reason="nope", code="bad_tag"),
    ],
)
def test_round_trip(msg):
    data = msg.encode(KEY)
    assert data[:2] == wire.MAGIC and data[2] == wire.VERSION
    assert wire.decode(data, KEY) == msg


def test_tag_is_hmac_sha256_of_header_and_body():
    data = wire.Ping(dev="d1", rid=8).encode(KEY)
    header, tag, body = data[:4], data[4 : 4 + TAG_BYTES], data[4 + TAG_BYTES :]
    expected = hmac.new(b"k" * 32, header + body, hashlib.sha256).digest()[:TAG_BYTES]
    assert tag == expected


def test_a_datagram_signed_with_another_key_or_altered_is_refused():
    data = wire.Verify("d1", 7, "p3", 0, [1, 2], [3]).encode(KEY)
    with pytest.raises(wire.ProtocolError, match="bad authentication tag") as err:
        wire.decode(data, LabKey(b"x" * 32))
    assert err.value.code == "bad_tag"
    altered = data.replace(b'"draft":[3]', b'"draft":[4]')
    assert altered != data
    with pytest.raises(wire.ProtocolError, match="bad authentication tag"):
        wire.decode(altered, KEY)


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        (b"XX\x02\x03" + b"\0" * 16 + b"{}", "bad_magic", "bad magic"),
        (b"SL\x02", "bad_magic", "too short"),
        (signed(b"SL\x09\x03", b"{}"), "bad_version", "version 9 not supported"),
        (signed(b"SL\x02\x63", b"{}"), "unknown_kind", "unknown message type 99"),
        (signed(b"SL\x02\x03", b"not json"), "bad_json", "Verify: body is not JSON"),
        (signed(b"SL\x02\x03", b"[1]"), "bad_body", "must be a JSON object"),
        (signed(b"SL\x02\x03", b"[" * 100000), "bad_json", "not JSON"),
        (
            signed(b"SL\x02\x03", b'{"extra":' + b"[" * 50 + b"]" * 50 + b"}"),
            "bad_body",
            "nested deeper",
        ),  # fmt: skip
        (
            signed(b"SL\x02\x03", b'{"dev":"d","rid":1,"sid":"s","pos":0,"ctx":[1]}'),
            "bad_body",
            "draft",
        ),  # fmt: skip
        (
            signed(b"SL\x02\x03", b'{"dev":"d","rid":"1","sid":"s","pos":0,"ctx":[],"draft":[]}'),
            "bad_field",
            "Verify.rid",
        ),  # fmt: skip
        (
            signed(b"SL\x02\x03", b'{"dev":"d","rid":1,"sid":"s","pos":0,"ctx":["a"],"draft":[]}'),
            "bad_field",
            "ctx",
        ),  # fmt: skip
    ],
)
def test_bad_datagrams_are_named_with_a_code(data, code, needle):
    with pytest.raises(wire.ProtocolError, match=needle) as err:
        wire.decode(data, KEY)
    assert err.value.code == code


def test_oversized_message_is_refused():
    with pytest.raises(wire.ProtocolError, match="exceeds a datagram"):
        wire.Verify("d", 1, "s", 0, list(range(20000)), []).encode(KEY)


def test_key_files(tmp_path):
    good = tmp_path / "lab.key"
    good.write_text(new_key_text())
    assert LabKey.from_file(good).tag(b"x") == LabKey(good.read_bytes().strip()).tag(b"x")
    short = tmp_path / "short.key"
    short.write_text("abc\n")
    with pytest.raises(KeyFileError, match=r"short\.key: the lab key must be one line of at least"):
        LabKey.from_file(short)
    with pytest.raises(KeyFileError, match=r"missing\.key: cannot read"):
        LabKey.from_file(tmp_path / "missing.key")


def test_agent_address_arguments():
    import argparse

    from agents.protocol.address import parse_address

    assert parse_address("10.77.0.1:7000") == ("10.77.0.1", 7000)
    for bad in ("10.77.0.1", ":7000", "host:port", "h:70000"):
        with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
            parse_address(bad)
