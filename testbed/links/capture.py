"""Packet truth from captures: both sides of an impaired hop as pcap, read with scapy.

While a probe crosses one device's link, a sniffer at the forwarding point (`testbed.links.sniff`,
in the lab's bridge namespace) records the device's port and the server's port: each datagram
once as it enters the hop and once as it leaves, stamped by the kernel on one clock. Read back
with scapy, independent of the probe's own timestamps, they give per packet and direction:
- the one-way delay (leave - enter), against the holder's model for the same packets (their
  captured arrival times, the phase in force, the profile's jitter and ordering policy);
- loss, and its bursts (runs of consecutive lost datagrams) against the Gilbert-Elliott
  chain's (random loss is a one-state chain): mean length, and the share of runs of 1, 2 and 3
  or more against the geometric law of the chain's run lengths;
- reordering: datagrams that left after one sent later, against what the model's order gives
  (none when it keeps order).
A lab whose links are impaired on its hosts, or at a middlebox, has no such port here.
"""

from __future__ import annotations

import json
import select
import signal
import struct
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from testbed.core import stats
from testbed.core.errors import ImpairmentError
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.links.expect import LinkClock, Quantiles, phase_at
from testbed.links.model import REPLICAS, Leg, hold
from testbed.links.probe import ended_output, link_clock, probe_packets
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import timeline

SNIFF = [sys.executable, "-m", "testbed.links.sniff"]
PROBE_HEADER = struct.Struct("!4sQcQ")  # agents.link_probe's datagram: magic, stamp, kind, seq
MAGIC, MEASURE = b"tbRX", b"M"
Direction = Literal["up", "down"]


class Bursts(BaseModel):
    """Runs of consecutive lost datagrams in one direction, against the loss chain's."""

    runs: int
    mean_measured: float | None
    mean_model: float
    shares_measured: tuple[float, float, float] | None  # runs of 1, 2, 3 or more
    shares_model: tuple[float, float, float]


class LegFigures(BaseModel):
    """One direction of the hop, from the captures (delays in ms)."""

    direction: str
    entered: int
    left: int
    loss_measured: float | None
    loss_expected: float
    delay_expected: Quantiles | None
    delay_measured: Quantiles | None
    delay_ks_distance: float | None
    bursts: Bursts
    reordered_measured: int
    reordered_expected: float  # mean over the model's runs of the same datagrams


class CaptureResult(BaseModel):
    """One link captured on both sides of its hop while a probe crossed it."""

    device: str
    requested: LinkProfile
    pcaps: list[str]
    dropped: dict[str, int]  # per port, packets the capture's socket missed (0: it is whole)
    up: LegFigures
    down: LegFigures


def read_legs(
    device_pcap: Path, server_pcap: Path, device_ip: str, server_ip: str
) -> dict[Direction, dict[int, tuple[float, float | None]]]:
    """Per direction, per probe measurement datagram (its sequence number) that entered the
    hop: (when it entered, when it left or None), wall-clock seconds. A port sees a datagram
    enter from the end it faces and leave towards it."""
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap

    seen: dict[tuple[Direction, str], dict[int, float]] = defaultdict(dict)
    for path, end_ip in ((device_pcap, device_ip), (server_pcap, server_ip)):
        for pkt in rdpcap(str(path)):
            if IP not in pkt or UDP not in pkt:
                continue
            payload = bytes(pkt[UDP].payload)
            if len(payload) < PROBE_HEADER.size:
                continue
            magic, _, kind, seq = PROBE_HEADER.unpack_from(payload)
            if magic != MAGIC or kind != MEASURE:
                continue
            direction: Direction = "up" if pkt[IP].src == device_ip else "down"
            side = "in" if pkt[IP].src == end_ip else "out"
            seen[(direction, side)].setdefault(int(seq), float(pkt.time))
    return {
        d: {s: (t, seen[(d, "out")].get(s)) for s, t in seen[(d, "in")].items()}
        for d in ("up", "down")
    }


def _reordered(seqs_by_leave: list[int]) -> int:
    """Datagrams that left after one sent later had left."""
    highest, count = -1, 0
    for s in seqs_by_leave:
        if s < highest:
            count += 1
        highest = max(highest, s)
    return count


def _bursts(lost: list[bool], mean_model: float) -> Bursts:
    runs = stats.loss_runs(lost)
    q = 1.0 if mean_model == float("inf") else 1 - 1 / mean_model
    model = (1 - q, q * (1 - q), q * q)
    shares = None
    if runs:
        n = len(runs)
        shares = (runs.count(1) / n, runs.count(2) / n, sum(r >= 3 for r in runs) / n)
    return Bursts(
        runs=len(runs),
        mean_measured=sum(runs) / len(runs) if runs else None,
        mean_model=mean_model,
        shares_measured=shares,
        shares_model=model,
    )


def leg_figures(
    direction: Direction,
    times: dict[int, tuple[float, float | None]],
    profile: LinkProfile,
    start_wall: float,
    replicas: int = REPLICAS,
) -> LegFigures:
    """The figures of one direction (`times`: see `read_legs`; seconds of wall clock) against
    `profile`, whose phases began at `start_wall`."""
    from scipy import stats as sps

    seqs = sorted(times)
    entered = np.array([times[s][0] for s in seqs])
    left = {s: out for s in seqs if (out := times[s][1]) is not None}
    phases = timeline(profile)
    index = phase_at(phases, entered - start_wall) if len(seqs) else np.array([], dtype=int)
    ge = [phases[i].profile.gilbert_elliott(direction) for i in index]
    leg = Leg(
        at_ms=(entered - (entered[0] if len(seqs) else 0.0)) * 1e3,
        delay_ms=np.array([phases[i].profile.one_way_ms for i in index]),
        jitter_ms=np.array([phases[i].profile.jitter_ms for i in index]),
        loss=np.array([g.mean_loss for g in ge]),
    )
    rng = np.random.default_rng(profile.seed)
    due = hold(rng, leg, profile.jitter_dist, profile.order, replicas) if len(seqs) else None
    measured = np.array([(left[s] - times[s][0]) * 1e3 for s in seqs if s in left])
    expected = np.array([])
    reordered_expected = 0.0
    if due is not None:
        delays = due - leg.at_ms
        kept = [i for i, s in enumerate(seqs) if s in left]
        expected = delays[:, kept].ravel()
        expected = expected[~np.isnan(expected)]
        counts = []
        for run in due:
            ok = ~np.isnan(run)
            order = np.argsort(run[ok], kind="stable")
            counts.append(_reordered([seqs[i] for i in np.flatnonzero(ok)[order]]))
        reordered_expected = float(np.mean(counts))
    by_leave = [s for s, _ in sorted(left.items(), key=lambda kv: (kv[1], kv[0]))]
    have = len(measured) > 0 and len(expected) > 0
    lost = [s not in left for s in seqs]
    return LegFigures(
        direction=direction,
        entered=len(seqs),
        left=len(left),
        loss_measured=sum(lost) / len(lost) if lost else None,
        loss_expected=float(leg.loss.mean()) if len(seqs) else 0.0,
        delay_expected=Quantiles.of(expected) if len(expected) else None,
        delay_measured=Quantiles.of(measured) if len(measured) else None,
        delay_ks_distance=float(sps.ks_2samp(measured, expected).statistic) if have else None,
        bursts=_bursts(lost, (ge[0] if ge else profile.gilbert_elliott(direction)).mean_burst),
        reordered_measured=_reordered(by_leave),
        reordered_expected=reordered_expected,
    )


def _start_wall(clock: LinkClock | None, direction: Direction, fallback: float) -> float:
    """When the link's phases began (wall clock), from its clock on CLOCK_MONOTONIC."""
    if clock is None:
        return fallback
    mono = clock.up_ns if direction == "up" else clock.down_ns
    return mono / 1e9 + (time.time() - time.monotonic())


def capture_link(
    lab: LinkSite,
    device: str,
    profile: LinkProfile,
    out: Path,
    count: int = 1000,
    interval_ms: float = 5.0,
) -> CaptureResult:
    """Capture `device`'s link on both sides of its hop while a probe of `count` datagrams
    `interval_ms` apart crosses it (the link impaired with `profile` now); pcaps in `out`."""
    if lab.bridge_netns is None or lab.impaired_on_hosts:
        raise ImpairmentError(
            f"lab {lab.name}: captures need the links' forwarding point on this machine (a "
            "namespace or Mininet lab); this lab impairs them on a middlebox or its hosts"
        )
    dev: LabHost = lab.host(device)
    out.mkdir(parents=True, exist_ok=True)
    ports = [dev.port, lab.server.port]
    argv = [*SNIFF, *(a for p in ports for a in ("--iface", p)), "--host", dev.ip,
            "--host", lab.server.ip, "--out", str(out)]  # fmt: skip
    sniffer = lab.runner.spawn(argv, netns=lab.bridge_netns, stdout=subprocess.PIPE, detach=False)
    if sniffer is None:  # dry run
        raise ImpairmentError("a capture cannot be a dry run")
    try:
        assert sniffer.stdout is not None
        ready, _, _ = select.select([sniffer.stdout], [], [], 30)
        if not ready or sniffer.stdout.readline().strip() != b"ready":
            raise ImpairmentError(f"the sniffer in {lab.bridge_netns} did not start")
        raw = probe_packets(lab, dev, profile, count=count, interval_ms=interval_ms)
    finally:
        sniffer.send_signal(signal.SIGTERM)
        told, _ = ended_output(sniffer, 60)
    try:
        said = json.loads(told.decode().strip().splitlines()[-1])
        dropped = {str(k): int(v) for k, v in said["dropped"].items()}
    except (IndexError, ValueError, KeyError, AttributeError) as exc:
        raise ImpairmentError(f"the sniffer in {lab.bridge_netns} wrote no capture") from exc
    pcaps = [out / f"{p}.pcap" for p in ports]
    legs = read_legs(pcaps[0], pcaps[1], dev.ip, lab.server.ip)
    clock = link_clock(lab, dev.name, raw, interval_ms)
    first = min((t[0] for v in legs.values() for t in v.values()), default=time.time())
    figures = {d: leg_figures(d, legs[d], profile, _start_wall(clock, d, first))
               for d in ("up", "down")}  # fmt: skip
    return CaptureResult(device=dev.name, requested=profile, pcaps=[str(p) for p in pcaps],
                         dropped=dropped, up=figures["up"], down=figures["down"])  # fmt: skip


def describe(c: CaptureResult) -> list[str]:
    """A few lines per captured link."""

    def q(x: Quantiles | None) -> str:
        return "-" if x is None else f"{x.p10:.2f}/{x.p50:.2f}/{x.p90:.2f}"

    missed = sum(c.dropped.values())
    whole = "whole" if not missed else f"INCOMPLETE: the capture missed {missed} packets"
    lines = [f"{c.device}: pcaps {', '.join(c.pcaps)} ({whole})"]
    for leg in (c.up, c.down):
        b = leg.bursts
        shares = "-" if b.shares_measured is None else "/".join(f"{x:.2f}" for x in
                                                                 b.shares_measured)  # fmt: skip
        lines.append(
            f"  {leg.direction}: {leg.left}/{leg.entered} crossed; one-way delay p10/p50/p90 "
            f"expected {q(leg.delay_expected)}, captured {q(leg.delay_measured)} ms (KS distance "
            f"{'-' if leg.delay_ks_distance is None else f'{leg.delay_ks_distance:.3f}'}); loss "
            f"{'-' if leg.loss_measured is None else f'{100 * leg.loss_measured:.2f}%'} "
            f"(expected {100 * leg.loss_expected:.2f}%) in {b.runs} bursts, mean length "
            f"{'-' if b.mean_measured is None else f'{b.mean_measured:.2f}'} (model "
            f"{b.mean_model:.2f}), runs of 1/2/3+ {shares} (model "
            f"{'/'.join(f'{x:.2f}' for x in b.shares_model)}); reordered "
            f"{leg.reordered_measured} (model {leg.reordered_expected:.1f})"
        )
    return lines
