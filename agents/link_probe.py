"""UDP link probe, run inside the lab's namespaces or on a lab's hosts.

    python -m agents.link_probe echo --bind IP --port P [--tag T] [--rt-prio N] [--stop-on-eof]
        Echo every datagram back. Prints "ready" once bound; on SIGTERM (or, with
        --stop-on-eof, at the end of its input: how a caller over SSH stops it) prints a JSON line
        with the measurement sequence numbers it received, in arrival order ("received"), and
        per sequence number how long its echo took to leave after the turnaround was taken
        ("send_lag_ns": to the kernel's transmit timestamp) and when it left ("sent_ns": that
        timestamp, monotonic ns), and with --rx-after-hold the ones it timed in user space
        ("user_rx") and, per one the holder stamped, how much later user space read it
        ("wake_ms").
    python -m agents.link_probe send --dst IP --port P [--count N] [--interval-ms I]
        [--size B] [--tag T] [--rt-prio N] [--via IFACE --src IP]
        Warm the link up (ARP), then send N numbered datagrams every I ms and time the echoes;
        prints one JSON line: {"sent": N, "rtt_ms": {seq: rtt}, "sent_ns": {seq: when the
        datagram left, monotonic ns}, "warmup_s": ..., "rx_span_s": first to last echo,
        "rx_bytes": bytes echoed}, the echoes in arrival order; with --rx-after-hold also
        "user_rx" (echoes timed in user space here) and "wake_ms" (per echo the holder stamped:
        how much later user space read it). With I = 0 (a blast) each datagram waits for room
        in the socket, which a rate limit on this host's own egress keeps full.

Datagram: the 4 bytes "tbRX", 8 bytes release stamp (0: none; see below), 1 byte kind (W
warm-up, M measurement), 8 bytes sequence number, 8 bytes send time, 8 bytes the responder's
turnaround, padding. RTT is the link's: from the kernel's transmit
timestamp of the datagram (SO_TIMESTAMPING, software; the user-space send time where the kernel
gives none) to the kernel receive timestamp (SO_TIMESTAMPNS) of its echo, less the responder's
turnaround: its own kernel receive timestamp to the kernel transmit timestamp of the echo. The
echo carries the turnaround up to just before it is sent; the rest (the send itself, and any
preemption during it) is the echo's send lag, which the responder reports at the end and the
caller (`probe_packets`) subtracts. So how soon a busy CPU schedules the sender or the
responder is not counted as link delay. The kernel stamps wall-clock time; each stamp is moved to
the monotonic clock as soon as it is read, and every difference is taken there, so a wall clock
that is stepped or slewed meanwhile (time sync, or a VM catching up after a pause) does not
count either.

`--rx-after-hold` (both ends) is for packets held on the receiving host's ingress (a lab
impaired on its hosts by the packet holder): the kernel stamps them on arrival, before the hold,
so its timestamps would leave the hold out. The holder (run with --stamp-probes) writes the
CLOCK_MONOTONIC time it released each probe datagram into the release stamp, and that is the
receive time; a datagram without one is timed in user space when it is read (counted in
"user_rx"), which adds the CPU's wake-up to the link's delay.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any


def set_realtime(prio: int) -> None:
    """SCHED_FIFO at `prio` (else nice -10), so a busy CPU does not delay packet timing."""
    if prio <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -10)


HEADER = struct.Struct("!4sQcQQQ")
MAGIC = b"tbRX"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# SOF_TIMESTAMPING_TX_SOFTWARE | _SOFTWARE | _OPT_ID | _OPT_TSONLY (linux/net_tstamp.h)
TX_STAMP_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
IP_RECVERR = 11
EXTENDED_ERR = struct.Struct("=IBBBBII")  # struct sock_extended_err: ee_data is the OPT_ID


def arp_complete(ip: str, dev: str | None = None) -> bool:
    """True once this namespace has a resolved neighbour entry for `ip` (on interface `dev`)."""
    try:
        with open("/proc/net/arp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts and parts[0] == ip and int(parts[2], 16) & 0x2 and dev in (None, parts[5]):
                    return True
    except OSError:
        pass
    return False


def echo(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    with contextlib.suppress(OSError):  # else no send lag is reported (and none subtracted)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
    sock.bind((args.bind, args.port))
    seen: list[int] = []
    sent_ids: dict[int, tuple[int, int]] = {}  # OPT_ID -> (seq, time the turnaround was taken)
    send_lag: dict[int, int] = {}  # seq -> kernel transmit time less that time, ns
    sent_at: dict[int, int] = {}  # seq -> kernel transmit time, monotonic ns
    user_rx: list[int] = []  # --rx-after-hold: measurement datagrams with no release stamp
    wake_ms: dict[int, float] = {}  # ... and per stamped one, when it was read less the stamp
    ids = itertools.count()  # the kernel's OPT_ID: one per datagram sent
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    watched: list[Any] = [sock, sys.stdin] if args.stop_on_eof else [sock]
    while not stop:
        ready, _, _ = select.select(watched, [], [], 0.2)
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            break  # end of input
        if sock not in ready:
            continue
        try:  # select also wakes for a transmit stamp (a late one: a rate limit queued the echo)
            data, anc, _, addr = sock.recvmsg(65536, 256, socket.MSG_DONTWAIT)
        except BlockingIOError:
            _note_send_lags(sock, sent_ids, send_lag, sent_at)
            continue
        user = time.monotonic_ns()
        if len(data) < HEADER.size or data[:4] != MAGIC:
            continue
        _, released, kind, seq, tx, _ = HEADER.unpack_from(data)
        rx = _recv_time(anc, user, released if args.rx_after_hold else None)
        if args.rx_after_hold and kind == b"M":
            _note_rx(seq, user, released, user_rx, wake_ms)
        now = time.monotonic_ns()
        ident = next(ids)
        if kind == b"M":
            seen.append(seq)
            sent_ids[ident] = (seq, now)
        turnaround = max(0, now - rx)
        sock.sendto(HEADER.pack(MAGIC, 0, kind, seq, tx, turnaround) + data[HEADER.size :], addr)
        _note_send_lags(sock, sent_ids, send_lag, sent_at)
    time.sleep(0.01)  # the last echo's stamp
    _note_send_lags(sock, sent_ids, send_lag, sent_at)
    out = {  # arrival order
        "received": list(dict.fromkeys(seen)),
        "send_lag_ns": send_lag,
        "sent_ns": sent_at,
        "user_rx": user_rx,
        "wake_ms": wake_ms,
    }
    print(json.dumps(out), flush=True)
    return 0


def _note_rx(
    seq: int, user: int, released: int, user_rx: list[int], wake_ms: dict[int, float]
) -> None:
    """Note how measurement datagram `seq`, read at `user`, was timed: by its release stamp
    (how much later it was read, ms), or in user space (none)."""
    if released:
        wake_ms[seq] = (user - released) / 1e6
    else:
        user_rx.append(seq)


def _tx_stamps(sock: socket.socket) -> Iterator[tuple[int, int]]:
    """(OPT_ID, kernel transmit time in monotonic ns) of each datagram stamped since the last
    call, read from the socket's error queue without waiting."""
    while True:
        try:
            _, anc, _, _ = sock.recvmsg(0, 512, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except OSError:  # BlockingIOError: none left
            return
        ident, stamp = _tx_stamp(anc)
        if ident is not None and stamp is not None:
            yield ident, stamp


def _note_send_lags(
    sock: socket.socket,
    sent_ids: dict[int, tuple[int, int]],
    send_lag: dict[int, int],
    sent_at: dict[int, int],
) -> None:
    """Each measurement echo stamped since the last call: its send lag and transmit time."""
    for ident, stamp in _tx_stamps(sock):
        if ident in sent_ids:
            seq, taken = sent_ids.pop(ident)
            send_lag[seq] = max(0, stamp - taken)
            sent_at[seq] = stamp


def _monotonic(wall_ns: int) -> int:
    """A wall-clock (kernel) timestamp on the monotonic clock, by their offset now."""
    return wall_ns - (time.time_ns() - time.monotonic_ns())


def _recv_time(anc: list[tuple[int, int, bytes]], user: int, released: int | None) -> int:
    """The receive time (monotonic ns): the holder's release stamp when `released` is given
    (--rx-after-hold), `user` (when it was read) where that is 0; else the kernel receive
    timestamp in `anc`, `user` where it has none."""
    if released is not None:
        return released or user
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = struct.unpack("qq", payload[:16])
            if sec:
                return _monotonic(sec * 1_000_000_000 + nsec)
    return user


def _tx_stamp(anc: list[tuple[int, int, bytes]]) -> tuple[int | None, int | None]:
    """(OPT_ID counter, software transmit time in monotonic ns) of one error-queue message."""
    ident = stamp = None
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(payload) >= 16:
            sec, nsec = struct.unpack("qq", payload[:16])
            stamp = _monotonic(sec * 1_000_000_000 + nsec) if sec else None
        elif level == socket.SOL_IP and kind == IP_RECVERR and len(payload) >= EXTENDED_ERR.size:
            ident = EXTENDED_ERR.unpack_from(payload)[6]
    return ident, stamp


def send(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    with contextlib.suppress(OSError):  # else the user-space send time stands in
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_STAMP_FLAGS)
    if args.via:  # leave by this interface whatever the routes say (the destination is on link)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, args.via.encode())
    if args.src:
        sock.bind((args.src, 0))
    sock.setblocking(False)
    pad = b"\0" * max(0, args.size - HEADER.size)
    dst = (args.dst, args.port)
    echoes: dict[int, tuple[int, int, int]] = {}  # seq -> (user send, receive, turnaround) ns
    sent_ids: dict[int, int] = {}  # OPT_ID (datagrams sent so far) -> seq
    tx_kernel: dict[int, int] = {}  # seq -> kernel transmit time, ns
    rx_span = [0, 0, 0]  # first and last echo receive time (ns), bytes echoed
    user_rx: list[int] = []  # --rx-after-hold: echoes with no release stamp
    wake_ms: dict[int, float] = {}  # ... and per stamped echo, when it was read less the stamp

    ids = itertools.count()  # the kernel's OPT_ID: one per datagram sent
    room = select.poll()  # for room in the send buffer, or echoes and transmit stamps to read
    room.register(sock, select.POLLOUT | select.POLLIN)

    def send_one(kind: bytes, seq: int, payload: bytes = b"") -> None:
        # A rate limit on this host's own egress (a lab impaired on its hosts) backs its queue
        # up into the socket: wait until the socket has room for the datagram rather than try
        # and fail (a failed send may use up a timestamp ID on kernels before 6.8). poll, not
        # select: select counts a transmit stamp waiting in the error queue as writable.
        while not any(ev & select.POLLOUT for _, ev in room.poll(50)):
            drain()
        ident = next(ids)
        if kind == b"M":
            sent_ids[ident] = seq
        sock.sendto(HEADER.pack(MAGIC, 0, kind, seq, time.monotonic_ns(), 0) + payload, dst)

    def drain() -> None:
        for ident, stamp in _tx_stamps(sock):
            if ident in sent_ids:
                tx_kernel[sent_ids[ident]] = stamp
        while True:
            try:
                data, anc, _, _ = sock.recvmsg(65536, 256)
            except BlockingIOError:
                return
            user = time.monotonic_ns()
            if len(data) < HEADER.size or data[:4] != MAGIC:
                continue
            _, released, kind, seq, tx, turnaround = HEADER.unpack_from(data)
            rx = _recv_time(anc, user, released if args.rx_after_hold else None)
            if args.rx_after_hold and kind == b"M":
                _note_rx(seq, user, released, user_rx, wake_ms)
            if kind == b"M":
                echoes[seq] = (tx, rx, turnaround)
                rx_span[0] = rx_span[0] or rx
                rx_span[1] = rx
                rx_span[2] += len(data)

    # Warm-up: resolve the server's address (ARP is never impaired) before measuring.
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.warmup_max_s:
        send_one(b"W", 0)
        time.sleep(0.02)
        if arp_complete(args.dst, args.via) and time.monotonic() - t0 >= args.warmup_min_s:
            break
    warmup_s = time.monotonic() - t0
    drain()
    interval_ns = int(args.interval_ms * 1e6)
    start = time.monotonic_ns()
    for seq in range(args.count):
        due = start + seq * interval_ns
        while True:
            now = time.monotonic_ns()
            if now >= due:
                break
            select.select([sock], [], [], (due - now) / 1e9)
            drain()
        send_one(b"M", seq, pad)
    linger_end = time.monotonic() + args.linger_s
    while len(echoes) < args.count and time.monotonic() < linger_end:
        select.select([sock], [], [], 0.02)
        drain()
    rtt = {  # arrival order
        seq: (rx - tx_kernel.get(seq, tx) - turnaround) / 1e6
        for seq, (tx, rx, turnaround) in echoes.items()
    }
    out = {
        "sent": args.count,
        "rtt_ms": rtt,
        "sent_ns": {seq: tx_kernel.get(seq, tx) for seq, (tx, _, _) in echoes.items()},
        "kernel_tx_stamps": sum(seq in tx_kernel for seq in echoes),
        "warmup_s": round(warmup_s, 3),
        "rx_span_s": (rx_span[1] - rx_span[0]) / 1e9,
        "rx_bytes": rx_span[2],
        "user_rx": user_rx,
        "wake_ms": wake_ms,
    }
    print(json.dumps(out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="mode", required=True)
    e = sub.add_parser("echo")
    e.add_argument("--bind", required=True)
    e.add_argument("--port", type=int, required=True)
    e.add_argument("--tag", default="")
    e.add_argument("--rt-prio", type=int, default=0)
    e.add_argument("--stop-on-eof", action="store_true", help="end at the end of stdin")
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--count", type=int, default=200)
    s.add_argument("--interval-ms", type=float, default=10.0)
    s.add_argument("--size", type=int, default=64)
    s.add_argument("--warmup-min-s", type=float, default=0.2)
    s.add_argument("--warmup-max-s", type=float, default=3.0)
    s.add_argument("--linger-s", type=float, default=1.0)
    s.add_argument("--tag", default="")
    s.add_argument("--rt-prio", type=int, default=0)
    s.add_argument("--via", default=None, help="send over this interface (SO_BINDTODEVICE)")
    s.add_argument("--src", default=None, help="send from this address")
    for p in (e, s):
        p.add_argument(
            "--rx-after-hold", action="store_true", help="receive times from release stamps"
        )
    args = ap.parse_args(argv)
    set_realtime(args.rt_prio)
    return echo(args) if args.mode == "echo" else send(args)


if __name__ == "__main__":
    sys.exit(main())
