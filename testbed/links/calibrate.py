"""Calibrate a lab's links: apply each profile, count packets on both sides, compare to the model.

Counting is independent of the agents and of the impairment backend: a UDP sender in the
device's namespace and an echo responder in the server's (`agents.link_probe`) number every packet,
so the server side counts what crossed the hop up, and the device side what came back down.
For every profile it reports RTT median and p99 with their error, jitter, loss per direction
with its 95 % intervals, Gilbert-Elliott mean loss and burst length against the model, and the
echo throughput when the profile limits the rate.
"""

from __future__ import annotations

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
from testbed.links.probe import RawProbe, probe_packets
from testbed.topo.profile import GilbertElliott, LinkProfile

BLAST_SIZE = 1200  # bytes per datagram when measuring throughput

DEFAULT_PROFILES: dict[str, LinkProfile] = {
    "85ms": LinkProfile(rtt_ms=85),
    "85ms-loss1": LinkProfile(rtt_ms=85, loss=0.01, seed=1),
    "85ms-loss10": LinkProfile(rtt_ms=85, loss=0.1, seed=2),
    "85ms-loss50": LinkProfile(rtt_ms=85, loss=0.5, seed=3),
    "85ms-loss100": LinkProfile(rtt_ms=85, loss=1.0),
    "85ms-gilbert": LinkProfile(rtt_ms=85, loss=GilbertElliott(p=0.02, r=0.25), seed=4),
    "85ms-jitter2-normal": LinkProfile(rtt_ms=85, jitter_ms=2, jitter_dist="normal", seed=5),
    "85ms-10mbit": LinkProfile(rtt_ms=85, rate_mbit=10),
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


def analyse(name: str, backend: str, profile: LinkProfile, raw: RawProbe) -> Calibration:
    """The figures of one probe against the profile it measured."""
    reached = set(raw.at_server)
    lost_up = [seq not in reached for seq in range(raw.sent)]
    lost_down = [seq not in raw.rtt_ms for seq in raw.at_server]
    rtts = np.array(list(raw.rtt_ms.values()))
    have = len(rtts) > 0
    err = np.abs(rtts - profile.rtt_ms)
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
        loss_up=_loss_check(lost_up, profile.up_loss, _is_random(profile, "up")),
        loss_down=_loss_check(lost_down, profile.down_loss, _is_random(profile, "down")),
        bursts_up=_bursts(lost_up, profile, "up"),
        bursts_down=_bursts(lost_down, profile, "down"),
        throughput_mbit=None,
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
) -> Calibration:
    raw = probe_packets(site, dev, profile, count=count, interval_ms=interval_ms)
    cal = analyse(name, backend, profile, raw)
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
) -> list[Calibration]:
    """Apply each profile to `devices` (default all), probe them together, then clear."""
    targets = [site.host(d) for d in devices] if devices else list(site.devices)
    varying = sorted(name for name, prof in profiles.items() if prof.varies)
    if varying:
        raise BadInputError(f"calibrate takes static profiles; {varying} have a schedule")
    out: list[Calibration] = []
    try:
        for name, profile in profiles.items():
            imp = apply(site, profile, [t.name for t in targets], backend=backend)
            used = imp.backend + (f"/{imp.holder}" if imp.holder else "")
            generation = imp.backend_state.get("holder_generation")
            started = time.time()
            measured = fan_out(
                lambda d, name=name, used=used, profile=profile: _measure(
                    site, name, used, profile, d, count, interval_ms
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
