"""The SLED datagram protocol between device drafters and the verification server.

One UDP datagram per message: a 4-byte header (magic b"SL", version, message type), a 16-byte
HMAC tag over header and body keyed by the lab secret (`auth.LabKey`), and a compact JSON
body. A datagram with a wrong tag is dropped before its body is parsed. Every request carries
an id (`rid`) that increases per device across restarts; the server answers a repeated id with
the reply it already computed (a retry), and refuses an older one (a replay).

Sessions: HELLO_ACK carries the server's `epoch`, a random id of the server process; VERIFY
and END carry it back, so a datagram recorded before a server restart is refused as stale
and the device says HELLO again.

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

from agents.protocol.auth import TAG_BYTES, LabKey

MAGIC = b"SL"
VERSION = 2
HEADER = 4
MAX_DATAGRAM = 65000
MAX_JSON_DEPTH = 8


class ProtocolError(ValueError):
    """A datagram that is not a valid message of this protocol version.

    `code` is a short reason (bad_magic, bad_version, unknown_kind, bad_tag, bad_json,
    bad_body, bad_field, oversized) by which refusals are counted.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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
    GENERATE = 10
    RESULT = 11
    ASK = 12
    ANSWER = 13


@dataclass
class Message:
    """Base of all messages; subclasses set `kind` and their fields."""

    kind: ClassVar[Kind]

    def encode(self, key: LabKey) -> bytes:
        body = json.dumps(asdict(self), separators=(",", ":")).encode()
        header = MAGIC + bytes([VERSION, int(self.kind)])
        data = header + key.tag(header + body) + body
        if len(data) > MAX_DATAGRAM:
            raise ProtocolError(
                "oversized", f"{type(self).__name__} of {len(data)} bytes exceeds a datagram"
            )
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
    epoch: str = ""  # the server process's random id; VERIFY and END carry it back


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
    epoch: str = ""
    temp: float = 0.0  # 0: greedy; > 0: drafts sampled at this temperature from q below
    q_ids: list[list[int]] = field(default_factory=list)  # per draft token: q's support
    q_probs: list[list[float]] = field(default_factory=list)  # and its probabilities
    conf: list[float] = field(default_factory=list)  # each draft's probability (confidence)
    copies: int = 1  # the device sends each VERIFY this many times; the verdict goes back as often


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
    epoch: str = ""


@dataclass
class Error(Message):
    """A refusal: `code` is machine-readable (the server's refusal counters use it)."""

    kind: ClassVar[Kind] = Kind.ERROR
    rid: int
    reason: str
    code: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Generate(Message):
    """Device -> server, centralized mode: generate up to max_new tokens after prompt
    (exactly max_new, past EOS, when `hold`: an answer held to its length)."""

    kind: ClassVar[Kind] = Kind.GENERATE
    dev: str
    rid: int
    sid: str
    prompt: list[int]
    max_new: int
    epoch: str = ""
    hold: bool = False


@dataclass
class Result(Message):
    """Server -> device, centralized mode: the target's tokens for a GENERATE."""

    kind: ClassVar[Kind] = Kind.RESULT
    rid: int
    sid: str
    tokens: list[int]
    steps: int  # decoding steps (batched forwards) the session took part in
    queue_ms: float = 0.0  # from arrival to the first step
    gen_ms: float = 0.0  # from the first step to the last
    first_ms: float = 0.0  # from the first step's start to the end of the first token's step


@dataclass
class Ask(Message):
    """Device -> BALANCE server: user `uid` of device `dev` wants `output` tokens after
    `prompt` within `deadline_ms` of when it was first sent, `age_ms` ago. The device says
    what it knows of its link: the smoothed RTT of its exchanges and the share of its
    requests that needed a retry. A repeated ASK (a retry) is answered with the user's
    latest ANSWER."""

    kind: ClassVar[Kind] = Kind.ASK
    dev: str
    rid: int
    uid: int
    prompt: list[int]
    output: int  # tokens the user asks for
    deadline_ms: float  # from the first send to the last token on the device
    age_ms: float = 0.0  # since the first send of this user's ASK
    srtt_ms: float = 0.0  # the device's smoothed RTT (0: none measured yet)
    loss: float = 0.0  # the device's estimate of per-direction loss
    copies: int = 1  # each ANSWER goes back this many times


@dataclass
class Answer(Message):
    """BALANCE server -> device: user `uid`'s tokens so far (all of them, so a lost ANSWER is
    repaired by the next), whether it is finished, and how it is served: its mode, or
    "refused" with admission's reason, or "waiting" before a decision."""

    kind: ClassVar[Kind] = Kind.ANSWER
    rid: int
    uid: int
    tokens: list[int]
    done: bool
    mode: str
    reason: str = ""


MESSAGES: dict[Kind, type[Message]] = {
    cls.kind: cls
    for cls in (
        Hello, HelloAck, Verify, Verdict, Resync, Ping, Pong, End, Error, Generate, Result,
        Ask, Answer,
    )
}  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_field(cls: type[Message], name: str, value: Any, expected: Any) -> None:
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "list[int]": isinstance(value, list)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "dict[str, Any]": isinstance(value, dict),
        "list[float]": isinstance(value, list) and all(_is_float(v) for v in value),
        "list[list[int]]": isinstance(value, list)
        and all(isinstance(r, list) and all(_is_int(v) for v in r) for r in value),
        "list[list[float]]": isinstance(value, list)
        and all(isinstance(r, list) and all(_is_float(v) for v in r) for r in value),
    }.get(str(expected), True)
    if not ok:
        raise ProtocolError(
            "bad_field", f"{cls.__name__}.{name}: expected {expected}, got {value!r:.60}"
        )


def _too_deep(value: Any, limit: int) -> bool:
    """True if a parsed JSON value nests lists/objects deeper than limit (iteratively)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
    return False


def decode(data: bytes, key: LabKey) -> Message:
    """Check and parse one datagram; raise ProtocolError naming what is wrong.

    Order: header, tag (nothing of an unauthenticated body is parsed), JSON, fields.
    """
    if len(data) < HEADER + TAG_BYTES or data[:2] != MAGIC:
        raise ProtocolError("bad_magic", "not a SLED datagram (bad magic or too short)")
    if data[2] != VERSION:
        raise ProtocolError(
            "bad_version",
            f"protocol version {data[2]} not supported (this side speaks {VERSION})",
        )
    try:
        cls = MESSAGES[Kind(data[3])]
    except ValueError:
        raise ProtocolError("unknown_kind", f"unknown message type {data[3]}") from None
    header, tag, body_bytes = (
        data[:HEADER],
        data[HEADER : HEADER + TAG_BYTES],
        data[HEADER + TAG_BYTES :],
    )
    if not key.check(header + body_bytes, tag):
        raise ProtocolError("bad_tag", f"{cls.__name__}: bad authentication tag")
    try:
        body = json.loads(body_bytes)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("bad_json", f"{cls.__name__}: body is not JSON ({exc})"[:200]) from None
    if not isinstance(body, dict):
        raise ProtocolError("bad_body", f"{cls.__name__}: body must be a JSON object")
    if _too_deep(body, MAX_JSON_DEPTH):
        raise ProtocolError("bad_body", f"{cls.__name__}: body nested deeper than {MAX_JSON_DEPTH}")
    kwargs = {}
    for f in fields(cls):
        if f.name in body:
            _check_field(cls, f.name, body[f.name], f.type)
            kwargs[f.name] = body[f.name]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError("bad_body", f"{cls.__name__}: {exc}") from None
