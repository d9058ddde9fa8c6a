"""The device's UDP link to the verification server: request with timeout and retries."""

from __future__ import annotations

import contextlib
import select
import socket
from collections.abc import Callable
from dataclasses import dataclass

from agents.emulation import clock
from agents.protocol import wire
from agents.protocol.auth import LabKey
from agents.sled.retry import RetryPolicy


@dataclass
class Exchange:
    """Outcome of one request: the reply (None after all attempts failed) and its cost."""

    reply: wire.Message | None
    attempts: int
    rtt_ms: float | None  # from the last send to the reply
    waited_ms: float  # from the first send to the reply or the give-up


class ServerLink:
    """A UDP socket to the server with request/retry semantics; replies must carry the key's tag."""

    def __init__(
        self, server: tuple[str, int], key: LabKey, bind: tuple[str, int] = ("0.0.0.0", 0)
    ) -> None:
        self.server = server
        self.key = key
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.sock.setblocking(False)

    def send(self, msg: wire.Message, copies: int = 1) -> None:
        """Send (copies times) without waiting; a send error (unreachable network) is like a
        lost datagram."""
        data = msg.encode(self.key)
        for _ in range(copies):
            with contextlib.suppress(OSError):
                self.sock.sendto(data, self.server)

    def poll(self, wanted: Callable[[wire.Message], bool], timeout_s: float = 0.0):
        """The first wanted message to arrive within timeout_s, or None; others are dropped."""
        deadline = clock.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - clock.monotonic())
            if not select.select([self.sock], [], [], clock.to_real(left))[0]:
                return None
            try:
                data, _ = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except (BlockingIOError, ConnectionRefusedError):
                continue
            try:
                msg = wire.decode(data, self.key)
            except wire.ProtocolError:
                continue
            if wanted(msg):
                return msg
            if clock.monotonic() >= deadline:
                return None

    def request(
        self,
        msg: wire.Message,
        wanted: Callable[[wire.Message], bool],
        policy: RetryPolicy,
        retries: int = 3,
        idle: Callable[[], bool] | None = None,
        resend: wire.Message | None = None,
    ) -> Exchange:
        """Send msg and wait up to the policy's timeout for a wanted reply; resend up to
        `retries` times (`resend` in its place, if given: a shorter form of the same request).
        A reply to the first attempt is an RTT sample for the policy.

        While waiting, `idle` is called for one small unit of other work (look-ahead
        drafting) as long as it returns True, with a non-blocking check for the reply after
        each unit; once it returns False the wait blocks."""
        first = clock.monotonic()
        for attempt in range(1, retries + 2):
            sent = clock.monotonic()
            deadline = sent + policy.timeout_s()
            out = resend if resend is not None and attempt > 1 else msg
            self.send(out, getattr(out, "copies", 1))
            while True:
                busy = idle is not None and idle()
                left = 0.0 if busy else max(0.0, deadline - clock.monotonic())
                reply = self.poll(wanted, left)
                now = clock.monotonic()
                if reply is not None:
                    rtt_ms = (now - sent) * 1000
                    if attempt == 1:  # Karn: a retried exchange's RTT is ambiguous
                        policy.observe(rtt_ms)
                    return Exchange(reply, attempt, rtt_ms, (now - first) * 1000)
                if now >= deadline:
                    policy.expired()
                    break
        return Exchange(None, retries + 1, None, (clock.monotonic() - first) * 1000)

    def close(self) -> None:
        self.sock.close()
