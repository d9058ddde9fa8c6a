"""Sending one message as datagrams: a lost or unroutable datagram is the protocol's to
repair (by retries and copies), never an error of the sender."""

from __future__ import annotations

import contextlib
import socket


def send_copies(sock: socket.socket, data: bytes, addr: tuple[str, int], copies: int = 1) -> None:
    """Send `data` to `addr` `copies` times; a network that is down loses them silently."""
    for _ in range(copies):
        with contextlib.suppress(OSError):
            sock.sendto(data, addr)
