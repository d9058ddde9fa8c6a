"""The SLED datagram protocol between device drafters and the verification server.

One UDP datagram per message: a 4-byte header (magic b"SL", version, message type) and a
compact JSON body. Every request carries an id unique per device (`rid`); the server answers a
repeated id with the verdict it already computed, so a device can retry a request safely.

Context synchronisation: the device is authoritative over its own sequence (it may have
emitted unverified fallback tokens). A VERIFY says "my sequence is your first `pos` tokens of
session `sid` followed by `ctx`; verify `draft` after it". The server keeps each session's
committed tokens; if it holds fewer than `pos` (it restarted, or evicted the session) it
answers RESYNC with how many it has and the device resends from there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from enum import IntEnum
from typing import Any, ClassVar

MAGIC = b"SL"
VERSION = 1
MAX_DATAGRAM = 65000


class ProtocolError(ValueError):
    """A datagram that is not a valid message of this protocol version."""


class Kind(IntEnum):
    HELLO = 1
    HELLO_ACK = 2
    VERIFY = 3
    VERDICT = 4
    RESYNC = 5
    PING = 6
    PONG = 7
    END = 8
    ERROR = 9


@dataclass
class Message:
    """Base of all messages; subclasses set `kind` and their fields."""

    kind: ClassVar[Kind]

    def encode(self) -> bytes:
        body = json.dumps(asdict(self), separators=(",", ":")).encode()
        data = MAGIC + bytes([VERSION, int(self.kind)]) + body
        if len(data) > MAX_DATAGRAM:
            raise ProtocolError(f"{type(self).__name__} of {len(data)} bytes exceeds a datagram")
        return data


@dataclass
class Hello(Message):
    """Device -> server at start: who it is and which tokenizer it drafts with."""

    kind: ClassVar[Kind] = Kind.HELLO
    dev: str
    tokenizer: str
    rid: int = 0


@dataclass
class HelloAck(Message):
    kind: ClassVar[Kind] = Kind.HELLO_ACK
    rid: int
    ok: bool
    tokenizer: str
    reason: str = ""


@dataclass
class Verify(Message):
    """Device -> server: verify `draft` after (server's first `pos` tokens of sid) + ctx."""

    kind: ClassVar[Kind] = Kind.VERIFY
    dev: str
    rid: int
    sid: str
    pos: int
    ctx: list[int]
    draft: list[int]


@dataclass
class Verdict(Message):
    """Server -> device: how many drafts were accepted and the next token."""

    kind: ClassVar[Kind] = Kind.VERDICT
    rid: int
    sid: str
    accepted: int
    token: int
    length: int  # the server's committed length of sid after this verdict
    batch: int = 1  # how many requests were verified in the same forward
    queue_ms: float = 0.0  # time from arrival to the start of the forward
    compute_ms: float = 0.0  # duration of the batched forward


@dataclass
class Resync(Message):
    """Server -> device: I hold only `have` tokens of sid; resend from there."""

    kind: ClassVar[Kind] = Kind.RESYNC
    rid: int
    sid: str
    have: int


@dataclass
class Ping(Message):
    kind: ClassVar[Kind] = Kind.PING
    dev: str
    rid: int


@dataclass
class Pong(Message):
    kind: ClassVar[Kind] = Kind.PONG
    rid: int


@dataclass
class End(Message):
    """Device -> server: session sid is finished; its cache can be freed."""

    kind: ClassVar[Kind] = Kind.END
    dev: str
    sid: str
    rid: int = 0


@dataclass
class Error(Message):
    kind: ClassVar[Kind] = Kind.ERROR
    rid: int
    reason: str
    extra: dict[str, Any] = field(default_factory=dict)


MESSAGES: dict[Kind, type[Message]] = {
    cls.kind: cls for cls in (Hello, HelloAck, Verify, Verdict, Resync, Ping, Pong, End, Error)
}


def _check_field(cls: type[Message], name: str, value: Any, expected: Any) -> None:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "list[int]": isinstance(value, list)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "dict[str, Any]": isinstance(value, dict),
    }.get(str(expected), True)
    if not ok:
        raise ProtocolError(f"{cls.__name__}.{name}: expected {expected}, got {value!r:.60}")


def decode(data: bytes) -> Message:
    """Parse one datagram; raise ProtocolError naming what is wrong."""
    if len(data) < 4 or data[:2] != MAGIC:
        raise ProtocolError("not a SLED datagram (bad magic)")
    if data[2] != VERSION:
        raise ProtocolError(
            f"protocol version {data[2]} not supported (this side speaks {VERSION})"
        )
    try:
        cls = MESSAGES[Kind(data[3])]
    except ValueError:
        raise ProtocolError(f"unknown message type {data[3]}") from None
    try:
        body = json.loads(data[4:])
    except ValueError as exc:
        raise ProtocolError(f"{cls.__name__}: body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"{cls.__name__}: body must be a JSON object")
    kwargs = {}
    for f in fields(cls):
        if f.name in body:
            _check_field(cls, f.name, body[f.name], f.type)
            kwargs[f.name] = body[f.name]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from None
