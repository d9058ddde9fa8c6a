"""The device's UDP link to the verification server: request with timeout and retries."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from agents.protocol import wire


@dataclass
class Exchange:
    """Outcome of one request: the reply (None after all attempts failed) and its cost."""

    reply: wire.Message | None
    attempts: int
    rtt_ms: float | None  # from the last send to the reply
    waited_ms: float  # from the first send to the reply or the give-up


class ServerLink:
    """A connected UDP socket to the server with request/retry semantics."""

    def __init__(self, server: tuple[str, int], bind: tuple[str, int] = ("0.0.0.0", 0)) -> None:
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.sock.setblocking(False)

    def send(self, msg: wire.Message) -> None:
        """Send without waiting; a send error (unreachable network) is like a lost datagram."""
        with contextlib.suppress(OSError):
            self.sock.sendto(msg.encode(), self.server)

    def poll(self, wanted: Callable[[wire.Message], bool], timeout_s: float = 0.0):
        """The first wanted message to arrive within timeout_s, or None; others are dropped."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                return None
            try:
                data, _ = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except (BlockingIOError, ConnectionRefusedError):
                continue
            try:
                msg = wire.decode(data)
            except wire.ProtocolError:
                continue
            if wanted(msg):
                return msg
            if time.monotonic() >= deadline:
                return None

    def request(
        self,
        msg: wire.Message,
        wanted: Callable[[wire.Message], bool],
        timeout_s: float = 0.2,
        retries: int = 3,
    ) -> Exchange:
        """Send msg and wait up to timeout_s for a wanted reply; resend up to `retries` times."""
        first = time.monotonic()
        for attempt in range(1, retries + 2):
            sent = time.monotonic()
            self.send(msg)
            reply = self.poll(wanted, timeout_s)
            if reply is not None:
                now = time.monotonic()
                return Exchange(reply, attempt, (now - sent) * 1000, (now - first) * 1000)
        return Exchange(None, retries + 1, None, (time.monotonic() - first) * 1000)

    def close(self) -> None:
        self.sock.close()
