"""The backup path's link monitor: one process per lab (see `testbed.labs.backup`).

    python -m agents.failover --plan PLAN.json --log failovers.jsonl --tag tb-<lab>-failover

It runs in the root namespace and holds one UDP socket in each lab namespace (made there with
setns): an echo socket on the server's primary address, and per device a probe socket bound to
the primary interface alone (SO_BINDTODEVICE), so probes never follow the failover route.
Every `interval_ms` each device probes the server. A probe is lost once older than the RTO,
max(min_rto_ms, srtt + 4 rttvar) (RFC 6298 estimates); a late echo still gives an RTT sample.
Runs are counted in sequence order: `down_after` lost probes in a row move the device's traffic
to the backup link (route `<server ip>/32 dev eth1` in its namespace); `up_after` answered
probes in a row move it back (route deleted). Each move is one JSON line (`Failover`) in the log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PROBE = struct.Struct("!Qd")
LATE_S = 5.0
"""How long a lost probe's echo still counts as a sign of life."""


@dataclass(frozen=True)
class Endpoint:
    """One host of the plan: its name, namespace, primary address and backup interface."""

    name: str
    netns: str
    primary_ip: str
    iface: str  # its backup interface, where its route moves on a failover


@dataclass(frozen=True)
class MonitorPlan:
    """What the monitor needs of the lab's backup plan (the controller writes the plan)."""

    server: Endpoint
    devices: list[Endpoint]
    primary_iface: str  # each device's primary interface, the probes' only way out
    port: int
    interval_ms: float  # probe period per device
    down_after: int  # unanswered probes in a row: primary down
    up_after: int  # answered probes in a row: primary back
    min_rto_ms: float  # a probe is lost after max(this, srtt + 4 rttvar)

    @classmethod
    def from_json(cls, text: str) -> MonitorPlan:
        """The plan from the controller's JSON (keys it does not need are left aside)."""
        data = json.loads(text)

        def end(d: dict[str, Any]) -> Endpoint:
            return Endpoint(d["name"], d["netns"], d["primary_ip"], d["iface"])

        return cls(
            server=end(data["server"]),
            devices=[end(d) for d in data["devices"]],
            primary_iface=data["primary_iface"],
            port=int(data["port"]),
            interval_ms=float(data["interval_ms"]),
            down_after=int(data["down_after"]),
            up_after=int(data["up_after"]),
            min_rto_ms=float(data["min_rto_ms"]),
        )


@dataclass(frozen=True)
class Failover:
    """One switch of one device's traffic between its paths (a line of the failover log)."""

    t: float  # wall-clock time of the route change (time.time())
    device: str
    to: str  # "backup" or "primary"
    unanswered: int
    srtt_ms: float | None
    route_ms: float  # how long the route change itself took

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> Failover:
        return cls(**json.loads(line))


_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def socket_in(netns: str) -> socket.socket:
    """A UDP socket made inside namespace `netns` (it stays there after we switch back)."""
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if _libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {netns}")
        try:
            return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        finally:
            if _libc.setns(own, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back")
    finally:
        os.close(own)
        os.close(target)


@dataclass
class PrimaryPath:
    """What the monitor knows of one device's primary path."""

    end: Endpoint
    sock: socket.socket
    on_backup: bool = False
    pending: dict[int, float] = field(default_factory=dict)  # seq -> sent (monotonic)
    lost: dict[int, float] = field(default_factory=dict)  # past the RTO, echo still welcome
    unanswered: int = 0  # lost probes in a row (by sequence number)
    answered: int = 0  # answered probes in a row (by sequence number)
    newest_answered: int = 0
    newest_lost: int = 0
    srtt: float | None = None
    rttvar: float = 0.0

    def rto(self, plan: MonitorPlan, dilation: float = 1.0) -> float:
        floor = plan.min_rto_ms / 1000 * dilation
        return floor if self.srtt is None else max(floor, self.srtt + 4 * self.rttvar)

    def echo(self, seq: int, now: float) -> None:
        """An echo came back: an RTT sample, and the path is alive."""
        sent = self.pending.pop(seq, None)
        if sent is None:
            sent = self.lost.pop(seq, None)
        if sent is None:
            return
        rtt = now - sent
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:  # RFC 6298 gains
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        if seq > self.newest_lost:  # a late echo does not undo losses that came after it
            self.unanswered = 0
            self.answered += 1
        self.newest_answered = max(self.newest_answered, seq)

    def expire(self, plan: MonitorPlan, now: float, dilation: float = 1.0) -> None:
        """Count the probes that went past the RTO unanswered (times `dilation` slower)."""
        rto = self.rto(plan, dilation)
        for seq, sent in list(self.pending.items()):
            if now - sent > rto:
                self.lost[seq] = self.pending.pop(seq)
                if seq > self.newest_answered:  # nor an old loss answers that came after it
                    self.unanswered += 1
                    self.answered = 0
                self.newest_lost = max(self.newest_lost, seq)
        for seq, sent in list(self.lost.items()):
            if now - sent > LATE_S * dilation:
                del self.lost[seq]

    def decision(self, plan: MonitorPlan) -> str | None:
        """ "backup", "primary" or None (stay)."""
        if not self.on_backup and self.unanswered >= plan.down_after:
            return "backup"
        if self.on_backup and self.answered >= plan.up_after:
            return "primary"
        return None


def move_route(netns: str, server_ip: str, to: str, backup_iface: str) -> float:
    """Send the device's traffic to the server over `to`; returns how long it took (ms)."""
    t0 = time.monotonic()
    verb = "replace" if to == "backup" else "del"
    argv = ["ip", "-n", netns, "route", verb, f"{server_ip}/32", "dev", backup_iface]
    subprocess.run(argv, check=to == "backup", capture_output=True)
    return (time.monotonic() - t0) * 1000


def _drain(sock: socket.socket) -> list[tuple[bytes, tuple[str, int]]]:
    """Every datagram waiting on a non-blocking socket."""
    got = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recvfrom(64))
    return got


def read_dilation(path: Path | None) -> float:
    """The lab's current time dilation, as the runner wrote it (1 without a valid file)."""
    try:
        value = float(path.read_text()) if path is not None else 1.0
    except (OSError, ValueError):
        return 1.0
    return value if value > 0 else 1.0


def monitor(plan: MonitorPlan, log: Path, dilation_file: Path | None = None) -> None:
    """Probe every device's primary path and move its route on loss and recovery (forever).

    Probes go out, and paths are judged, once per `interval_ms`; in between the process sleeps
    in epoll and answers or records echoes as they come. The probe period, the RTO floor and
    how long a late echo counts are slowed by the time dilation in `dilation_file` (read at
    every probe), so the monitor judges a dilated link as the undilated one.
    """
    server_ip = plan.server.primary_ip
    echo = socket_in(plan.server.netns)
    echo.bind((server_ip, plan.port))
    echo.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(echo, selectors.EVENT_READ, None)
    paths = []
    for end in plan.devices:
        s = socket_in(end.netns)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, plan.primary_iface.encode())
        s.bind((end.primary_ip, 0))
        s.setblocking(False)
        path = PrimaryPath(end, s)
        sel.register(s, selectors.EVENT_READ, path)
        paths.append(path)
    print("ready", flush=True)
    seq = 0
    next_probe = time.monotonic()
    with log.open("a") as out:
        while True:
            now = time.monotonic()
            if now >= next_probe:
                seq += 1
                dilation = read_dilation(dilation_file)
                for p in paths:
                    p.expire(plan, now, dilation)
                    to = p.decision(plan)
                    if to is not None:
                        out.write(switch(p, server_ip, to).to_json() + "\n")
                        out.flush()
                    p.pending[seq] = now
                    with contextlib.suppress(OSError):
                        p.sock.sendto(PROBE.pack(seq, now), (server_ip, plan.port))
                next_probe += plan.interval_ms / 1000 * dilation
            for key, _ in sel.select(max(0.0, next_probe - time.monotonic())):
                now = time.monotonic()
                for data, addr in _drain(key.fileobj):  # type: ignore[arg-type]
                    if key.data is None:
                        echo.sendto(data, addr)
                    elif len(data) >= PROBE.size:
                        key.data.echo(PROBE.unpack(data[: PROBE.size])[0], now)


def switch(path: PrimaryPath, server_ip: str, to: str) -> Failover:
    """Move a device's traffic to path `to` and say so."""
    wall = time.time()
    took = move_route(path.end.netns, server_ip, to, path.end.iface)
    path.on_backup = to == "backup"
    return Failover(
        t=wall,
        device=path.end.name,
        to=to,
        unanswered=path.unanswered,
        srtt_ms=None if path.srtt is None else path.srtt * 1000,
        route_ms=took,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Backup-path link monitor of one lab.")
    ap.add_argument("--plan", type=Path, required=True, help="the lab's backup plan (JSON)")
    ap.add_argument("--log", type=Path, required=True, help="failover log (JSON lines)")
    ap.add_argument("--tag", help="process tag (lets `testbed lab clean` find it)")
    ap.add_argument("--dilation-file", type=Path, help="the lab's time dilation (runner-written)")
    args = ap.parse_args(argv)
    plan = MonitorPlan.from_json(args.plan.read_text())
    with contextlib.suppress(KeyboardInterrupt):
        monitor(plan, args.log, args.dilation_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
