"""Calibrate a lab's links: apply each profile, count packets on both sides, compare to the model.

Counting is independent of the agents and of the impairment backend: a UDP sender in the
device's namespace and an echo responder in the server's (`agents.link_probe`) number every packet,
so the server side counts what crossed the hop up, and the device side what came back down.
For every profile it reports RTT median and p99 with their error, jitter, loss per direction
with its 95 % intervals, Gilbert-Elliott mean loss and burst length against the model, and the
echo throughput when the profile limits the rate; and the realized RTT distribution against
the one the holder's model gives for the same packets (`testbed.links.expect`): quantiles side
by side and their two-sample Kolmogorov-Smirnov distance, and for a profile that changes (a
schedule, a trace) the RTT and loss of each step or trace row the probe met. A changing
profile is probed for `span_s` seconds from when it is applied (its first steps or rows).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats as sps

from testbed.core import stats
from testbed.core.errors import BadInputError
from testbed.core.fanout import fan_out, raise_failures
from testbed.core.loading import read_yaml
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.links.api import apply, clear
from testbed.links.expect import LinkClock, LinkFit, fit_probe
from testbed.links.probe import RawProbe, link_clock, probe_packets
from testbed.topo.profile import GilbertElliott, LinkProfile, ScheduleStep
from testbed.topo.schedule import duration_s

BLAST_SIZE = 1200  # bytes per datagram when measuring throughput
TRACES = Path("topologies/traces")  # the shipped traces, from the repository root
SPAN_S = 5.0  # how long a changing profile is probed, from when it is applied

DEFAULT_PROFILES: dict[str, LinkProfile] = {
    "85ms": LinkProfile(rtt_ms=85),
    "85ms-loss1": LinkProfile(rtt_ms=85, loss=0.01, seed=1),
    "85ms-loss10": LinkProfile(rtt_ms=85, loss=0.1, seed=2),
    "85ms-loss50": LinkProfile(rtt_ms=85, loss=0.5, seed=3),
    "85ms-loss100": LinkProfile(rtt_ms=85, loss=1.0),
    "85ms-gilbert": LinkProfile(rtt_ms=85, loss=GilbertElliott(p=0.02, r=0.25), seed=4),
    "85ms-jitter2-normal": LinkProfile(rtt_ms=85, jitter_ms=2, jitter_dist="normal", seed=5),
    "85ms-10mbit": LinkProfile(rtt_ms=85, rate_mbit=10),
    **{
        f"95ms-jitter6-{dist}{'-reorder' if order == 'reorder' else ''}": LinkProfile(
            rtt_ms=95, jitter_ms=6, jitter_dist=dist, order=order, seed=6
        )
        for order in ("keep", "reorder")
        for dist in ("uniform", "normal", "pareto", "paretonormal")
    },  # fmt: skip
    "85ms-step-2s": LinkProfile(
        rtt_ms=85, seed=7, schedule=(ScheduleStep(at_s=2, rtt_ms=140, loss=0.1),)
    ),
    "wifi-trace": LinkProfile(trace=TRACES / "wifi-synthetic.csv", seed=8),
    "5g-trace": LinkProfile(trace=TRACES / "5g-synthetic.csv", seed=9),
}


class LossCheck(BaseModel):
    """Loss in one direction: measured count, its 95 % interval, and the request's interval."""

    requested: float
    lost: int
    of: int
    rate: float | None
    rate_ci95: tuple[float, float]  # Clopper-Pearson interval of the measured rate
    accept95: tuple[int, int] | None  # central 95 % of Binomial(of, requested) lost counts
    within: bool | None  # None for Gilbert-Elliott loss (not binomial: see BurstCheck)


class BurstCheck(BaseModel):
    """Gilbert-Elliott figures of one direction: the model's and the measured."""

    model_mean_loss: float
    model_mean_burst: float
    measured_mean_loss: float | None
    measured_mean_burst: float | None
    bursts: int


class Calibration(BaseModel):
    """One profile on one device link, as measured."""

    profile: str
    device: str
    backend: str
    requested: LinkProfile
    sent: int
    rtt_p50_ms: float | None
    rtt_p99_ms: float | None
    rtt_error_p50_ms: float | None  # median of |rtt - requested rtt|
    rtt_error_p99_ms: float | None  # p99 of |rtt - requested rtt|
    jitter_std_ms: float | None
    jitter_ipdv_ms: float | None  # mean |rtt_i - rtt_(i-1)| of consecutive echoes
    loss_up: LossCheck
    loss_down: LossCheck
    bursts_up: BurstCheck | None
    bursts_down: BurstCheck | None
    throughput_mbit: float | None  # echo payload throughput (rate-limited profiles)
    holder_generation: int | None = None  # the packet holder's config while it was measured
    started_at: float | None = None  # wall clock (s): the profile's probes began ...
    ended_at: float | None = None  # ... and every link's probes had ended
    fit: LinkFit | None = None  # the RTT distribution expected beside the measured, per window
    # per echo: (when it left the device, when its echo left the server) on CLOCK_MONOTONIC
    # in ns, and its |RTT error| in ms; to tell which round trips a stall of the holder met
    echo_legs: list[tuple[int, int, float]] = Field(default_factory=list, exclude=True, repr=False)

    @property
    def echoes(self) -> int:
        """Round trips measured: the RTT figures rest on this many samples."""
        return self.loss_down.of - self.loss_down.lost

    @property
    def ok(self) -> bool:
        """No random loss outside its 95 % interval."""
        return self.loss_up.within is not False and self.loss_down.within is not False


@dataclass(frozen=True)
class LossVerdict:
    """The random-loss checks of many calibrations, read together.

    A 95 % interval misses 5 % of the time by construction, so among many links a few fall
    outside it even when the emulation is exact. The verdict is therefore: each profile's and
    direction's count pooled over all links inside its 95 % interval, and no more single-link
    misses than 95 % intervals allow (one-sided binomial test at 5 %).
    """

    inside: int  # single link x profile x direction checks inside their interval
    checks: int
    misses_p: float  # p-value of this many misses if each check missed 5 % of the time
    pooled: dict[str, tuple[int, int, float, bool]]  # "profile dir": lost, of, asked, inside

    @property
    def ok(self) -> bool:
        return self.misses_p >= 0.05 and all(inside for *_, inside in self.pooled.values())


def loss_verdict(rows: list[Calibration]) -> LossVerdict:
    """Read the random-loss checks of `rows` together (Gilbert-Elliott loss is left out)."""
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    asked: dict[str, float] = {}
    inside = checks = 0
    for r in rows:
        for direction, c in (("up", r.loss_up), ("down", r.loss_down)):
            if c.within is None:
                continue
            checks += 1
            inside += c.within
            key = f"{r.profile} {direction}"
            sums[key][0] += c.lost
            sums[key][1] += c.of
            asked[key] = c.requested
    misses = checks - inside
    p = sps.binomtest(misses, checks, 0.05, alternative="greater").pvalue if checks else 1.0
    pooled = {
        key: (lost, of, asked[key], stats.loss_within(lost, of, asked[key]))
        for key, (lost, of) in sums.items()
    }
    return LossVerdict(inside, checks, float(p), pooled)


@dataclass(frozen=True)
class Distance:
    """One jittered profile over its links: how far the realized RTT distribution lies from the
    model's (two-sample Kolmogorov-Smirnov distance, per link), and the medians side by side."""

    profile: str
    jitter_dist: str
    order: str
    links: int
    echoes: int  # the fewest echoes a link's distance rests on
    ks_median: float
    ks_max: float
    rejected: int  # links whose KS p-value is below 0.01
    expected_p50_ms: float
    measured_p50_ms: float


def distances(rows: list[Calibration]) -> list[Distance]:
    """Per profile with jitter (in the order first met), its `Distance`."""
    by: dict[str, list[Calibration]] = defaultdict(list)
    for r in rows:
        if r.requested.jitter_ms > 0 and r.fit and r.fit.ks_distance is not None:
            by[r.profile].append(r)
    out = []
    for name, group in by.items():
        fits = [r.fit for r in group if r.fit is not None]
        ks = [f.ks_distance for f in fits if f.ks_distance is not None]
        out.append(
            Distance(
                profile=name,
                jitter_dist=group[0].requested.jitter_dist,
                order=group[0].requested.order,
                links=len(fits),
                echoes=min(f.echoes for f in fits),
                ks_median=float(np.median(ks)),
                ks_max=max(ks),
                rejected=sum(1 for f in fits if f.ks_p is not None and f.ks_p < 0.01),
                expected_p50_ms=float(np.median([f.expected.p50 for f in fits if f.expected])),
                measured_p50_ms=float(np.median([f.measured.p50 for f in fits if f.measured])),
            )
        )
    return out


def load_profiles(path: Path) -> dict[str, LinkProfile]:
    """A YAML mapping of profile name -> link profile fields."""
    data = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise BadInputError(f"{path}: expected a mapping of profile name -> link profile")
    out = {}
    for name, fields in data.items():
        if not isinstance(fields, dict):
            raise BadInputError(f"{path}: {name}: expected a mapping of link profile fields")
        out[str(name)] = LinkProfile.build(f"{path}: {name}", **fields)
    return out


def _loss_check(lost: list[bool], requested: float, binomial: bool) -> LossCheck:
    n, k = len(lost), sum(lost)
    accept = stats.binomial_interval(n, requested) if binomial else None
    return LossCheck(
        requested=requested,
        lost=k,
        of=n,
        rate=k / n if n else None,
        rate_ci95=stats.rate_interval(k, n),
        accept95=accept,
        within=None if accept is None else n == 0 or accept[0] <= k <= accept[1],
    )


def _is_random(profile: LinkProfile, direction: str) -> bool:
    return not isinstance(profile.loss_model(direction), GilbertElliott)  # type: ignore[arg-type]


def _bursts(lost: list[bool], profile: LinkProfile, direction: str) -> BurstCheck | None:
    model = profile.loss_model(direction)  # type: ignore[arg-type]
    if not isinstance(model, GilbertElliott):
        return None
    runs = stats.loss_runs(lost)
    return BurstCheck(
        model_mean_loss=model.mean_loss,
        model_mean_burst=model.mean_burst,
        measured_mean_loss=sum(lost) / len(lost) if lost else None,
        measured_mean_burst=sum(runs) / len(runs) if runs else None,
        bursts=len(runs),
    )


def analyse(
    name: str,
    backend: str,
    profile: LinkProfile,
    raw: RawProbe,
    clock: LinkClock | None = None,
    interval_ms: float = 5.0,
) -> Calibration:
    """The figures of one probe against the profile it measured (`clock`, `interval_ms`: see
    `fit_probe`); each RTT's error is against the RTT in force when its packet was sent."""
    fit = fit_probe(profile, raw.sent, raw.at_server, raw.rtt_ms, raw.sent_ns,
                    raw.echo_sent_ns, clock, interval_ms)  # fmt: skip
    reached = set(raw.at_server)
    lost_up = [seq not in reached for seq in range(raw.sent)]
    lost_down = [seq not in raw.rtt_ms for seq in raw.at_server]
    rtts = np.array(list(raw.rtt_ms.values()))
    asked = np.array([fit.rtt_in_force_ms.get(s, profile.rtt_ms) for s in raw.rtt_ms])
    have = len(rtts) > 0
    err = np.abs(rtts - asked)
    up_loss = fit.loss_up_expected if profile.varies else profile.up_loss
    down_loss = fit.loss_down_expected if profile.varies else profile.down_loss
    return Calibration(
        profile=name,
        device=raw.device,
        backend=backend,
        requested=profile,
        sent=raw.sent,
        rtt_p50_ms=float(np.median(rtts)) if have else None,
        rtt_p99_ms=float(np.percentile(rtts, 99)) if have else None,
        rtt_error_p50_ms=float(np.median(err)) if have else None,
        rtt_error_p99_ms=float(np.percentile(err, 99)) if have else None,
        jitter_std_ms=float(rtts.std()) if have else None,
        jitter_ipdv_ms=float(np.abs(np.diff(rtts)).mean()) if len(rtts) > 1 else None,
        loss_up=_loss_check(lost_up, up_loss, _is_random(profile, "up")),
        loss_down=_loss_check(lost_down, down_loss, _is_random(profile, "down")),
        bursts_up=_bursts(lost_up, profile, "up"),
        bursts_down=_bursts(lost_down, profile, "down"),
        throughput_mbit=None,
        fit=fit,
        echo_legs=[
            (raw.sent_ns[seq], raw.echo_sent_ns[seq], abs(rtt - profile.rtt_ms))
            for seq, rtt in raw.rtt_ms.items()
            if seq in raw.sent_ns and seq in raw.echo_sent_ns
        ],
    )


def _measure(
    site: LinkSite,
    name: str,
    backend: str,
    profile: LinkProfile,
    dev: LabHost,
    count: int,
    interval_ms: float,
    span_s: float = SPAN_S,
) -> Calibration:
    if profile.varies:  # from its start, for `span_s` (or to just after its last change)
        count = max(count, math.ceil(min(duration_s(profile) + 1, span_s) * 1000 / interval_ms))
    raw = probe_packets(site, dev, profile, count=count, interval_ms=interval_ms)
    clock = link_clock(site, dev.name, raw, interval_ms)
    cal = analyse(name, backend, profile, raw, clock, interval_ms)
    if profile.rate_mbit is not None:
        # enough back-to-back datagrams for about one second at the limit, then count echoes
        n = int(min(5000, max(200, profile.rate_mbit * 1e6 / 8 / BLAST_SIZE)))
        blast = probe_packets(site, dev, profile, count=n, interval_ms=0, size=BLAST_SIZE)
        cal.throughput_mbit = blast.echo_mbit_s
    return cal


def calibrate(
    site: LinkSite,
    profiles: dict[str, LinkProfile],
    devices: list[str] | None = None,
    count: int = 500,
    interval_ms: float = 5.0,
    parallel: int = 16,
    backend: Literal["auto", "netem", "nfqueue"] = "auto",
    span_s: float = SPAN_S,
) -> list[Calibration]:
    """Apply each profile to `devices` (default all), probe them together, then clear; a
    profile that changes is probed for `span_s` from when it is applied (through the packet
    holder where `backend` is auto)."""
    targets = [site.host(d) for d in devices] if devices else list(site.devices)
    out: list[Calibration] = []
    try:
        for name, profile in profiles.items():
            # a changing profile runs in the packet holder alone (netem has no schedules)
            how = "nfqueue" if profile.varies and backend == "auto" else backend
            imp = apply(site, profile, [t.name for t in targets], backend=how)
            used = imp.backend + (f"/{imp.holder}" if imp.holder else "")
            generation = imp.backend_state.get("holder_generation")
            started = time.time()
            measured = fan_out(
                lambda d, name=name, used=used, profile=profile: _measure(
                    site, name, used, profile, d, count, interval_ms, span_s
                ),
                targets,
                max_workers=parallel,
            )
            rows = list(raise_failures(f"calibrating {name}", measured).values())
            ended = time.time()
            for row in rows:
                row.holder_generation, row.started_at, row.ended_at = generation, started, ended
            out += rows
    finally:
        clear(site, [t.name for t in targets])
    return out
