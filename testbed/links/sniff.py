"""Capture one link's UDP datagrams on both sides of an impaired hop, as pcap (scapy).

    python -m testbed.links.sniff --iface PORT [--iface PORT ...] --host IP --host IP --out DIR

Run at the forwarding point (a lab's bridge namespace) on the ports that face the two ends of
a link (the device's and the server's): each sees a datagram once as it enters the hop and once
as it leaves it, time-stamped by the kernel (scapy's PF_PACKET listen sockets, with a receive
buffer of BUFFER_BYTES so a busy CPU does not make the capture drop any). Keeps the IPv4 UDP
datagrams between the two `--host` addresses (told from the raw bytes, dissected only when
written); prints "ready" once every interface is listened on, and on SIGTERM writes one pcap
per interface, `DIR/<iface>.pcap` (ns time stamps), and prints one JSON line: the datagrams
each holds and the packets the kernel dropped from each socket (PACKET_STATISTICS), which a
reader must see as 0 for the capture to be whole. `testbed.links.capture` starts it and reads
what it wrote.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import select
import signal
import socket
import struct
from pathlib import Path

BUFFER_BYTES = 64 << 20
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SOL_PACKET, PACKET_STATISTICS = 263, 6
ETH_IPV4, UDP = b"\x08\x00", 17


def ours(frame: bytes, hosts: set[bytes]) -> bool:
    """An Ethernet frame carrying an IPv4 UDP datagram between two of `hosts` (4-byte addresses)."""
    return (
        len(frame) >= 34
        and frame[12:14] == ETH_IPV4
        and frame[23] == UDP
        and frame[26:30] in hosts
        and frame[30:34] in hosts
    )


def dropped(sock: socket.socket) -> int:
    """Packets the kernel dropped from this PF_PACKET socket since last asked."""
    try:
        return struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))[1]
    except OSError:
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iface", action="append", required=True)
    ap.add_argument("--host", action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from scapy.arch.linux import L2ListenSocket
    from scapy.layers.l2 import Ether  # also tells the sockets their link layer
    from scapy.utils import wrpcap

    hosts = {ipaddress.IPv4Address(h).packed for h in args.host}
    listeners = {iface: L2ListenSocket(iface=iface, nofilter=1) for iface in args.iface}
    for s in listeners.values():
        s.ins.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BUFFER_BYTES)
        dropped(s.ins)  # from now on
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    seen: dict[str, list[tuple[bytes, float]]] = {iface: [] for iface in listeners}
    by_fd = {s.ins.fileno(): (iface, s) for iface, s in listeners.items()}
    print("ready", flush=True)
    while True:
        try:
            ready, _, _ = select.select(list(by_fd), [], [], 0.1)
        except InterruptedError:
            ready = []
        for fd in ready:
            iface, s = by_fd[fd]
            _, frame, at = s.recv_raw()
            if frame is not None and ours(frame, hosts):
                seen[iface].append((frame, at))
        if stop and not ready:
            break
    drops = {iface: dropped(s.ins) for iface, s in listeners.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    for iface, frames in seen.items():
        packets = []
        for frame, at in frames:
            pkt = Ether(frame)
            pkt.time = at
            packets.append(pkt)
        wrpcap(str(args.out / f"{iface}.pcap"), packets, nano=True)
    for s in listeners.values():
        s.close()
    print(json.dumps({"datagrams": {i: len(f) for i, f in seen.items()}, "dropped": drops}),
          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
