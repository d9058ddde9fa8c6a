"""UDP link probe, run inside the lab's namespaces (standalone: no `testbed` imports).

    udp_probe.py echo --bind IP --port P [--tag T] [--rt-prio N]
        Echo every datagram back. Prints "ready" once bound; on SIGTERM prints a JSON line
        with the measurement sequence numbers it received (forward-direction count).
    udp_probe.py send --dst IP --port P [--count N] [--interval-ms I] [--size B] [--tag T]
        [--rt-prio N]
        Warm the link up (ARP), then send N numbered datagrams every I ms and time the echoes;
        prints one JSON line: {"sent": N, "rtt_ms": {seq: rtt}, "warmup_s": ...}.

Datagram: 1 byte kind (W warm-up, M measurement), 8 bytes sequence number, 8 bytes send time,
padding. RTT uses the kernel receive timestamp (SO_TIMESTAMPNS) when available, taken as the
packet reaches the sender's interface, i.e. after the bridge-side holder released it.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import struct
import sys
import time

from testbed.netem.realtime import set_realtime

HEADER = struct.Struct("!cQQ")
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def arp_complete(ip: str) -> bool:
    """True once this namespace has a resolved neighbour entry for `ip`."""
    try:
        with open("/proc/net/arp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts and parts[0] == ip and int(parts[2], 16) & 0x2:
                    return True
    except OSError:
        pass
    return False


def echo(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((args.bind, args.port))
    seen: list[int] = []
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)
    while not stop:
        ready, _, _ = select.select([sock], [], [], 0.2)
        if not ready:
            continue
        data, addr = sock.recvfrom(65536)
        if len(data) < HEADER.size:
            continue
        kind, seq, _ = HEADER.unpack_from(data)
        if kind == b"M":
            seen.append(seq)
        sock.sendto(data, addr)
    print(json.dumps({"received": sorted(set(seen))}), flush=True)
    return 0


def _recv_time(anc: list[tuple[int, int, bytes]]) -> int:
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = struct.unpack("qq", payload[:16])
            if sec:
                return sec * 1_000_000_000 + nsec
    return time.time_ns()


def send(args: argparse.Namespace) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setblocking(False)
    pad = b"\0" * max(0, args.size - HEADER.size)
    dst = (args.dst, args.port)
    rtt: dict[int, float] = {}

    def drain() -> None:
        while True:
            try:
                data, anc, _, _ = sock.recvmsg(65536, 256)
            except BlockingIOError:
                return
            rx = _recv_time(anc)
            if len(data) < HEADER.size:
                continue
            kind, seq, tx = HEADER.unpack_from(data)
            if kind == b"M":
                rtt[seq] = (rx - tx) / 1e6

    # Warm-up: resolve the server's address (ARP is never impaired) before measuring.
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.warmup_max_s:
        sock.sendto(HEADER.pack(b"W", 0, time.time_ns()), dst)
        time.sleep(0.02)
        if arp_complete(args.dst) and time.monotonic() - t0 >= args.warmup_min_s:
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
        sock.sendto(HEADER.pack(b"M", seq, time.time_ns()) + pad, dst)
    linger_end = time.monotonic() + args.linger_s
    while len(rtt) < args.count and time.monotonic() < linger_end:
        select.select([sock], [], [], 0.02)
        drain()
    out = {"sent": args.count, "rtt_ms": rtt, "warmup_s": round(warmup_s, 3)}
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
    args = ap.parse_args(argv)
    set_realtime(args.rt_prio)
    return echo(args) if args.mode == "echo" else send(args)


if __name__ == "__main__":
    sys.exit(main())
