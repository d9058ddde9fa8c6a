"""What a probe should have measured, packet by packet, beside what it did (`LinkFit`).

Each probe packet meets the profile in force when it reached the holder: its up leg the phase
(schedule step or trace row) in force when it was sent, its echo's down leg the phase in force
when the echo was sent, each counted from when the holder loaded that direction's phases (its
`LinkClock`). Those per-packet delays, jitter and losses go through the holder's own model
(`testbed.links.model`, seeded with the profile's seed, with its ordering policy and the
probe's own send times, so the upward shift of jittered delays kept in order is in it) many
times over: the pooled RTTs of the packets that came back are the expected distribution.

The fit holds the expected and measured quantiles (p10, p50, p90) side by side, and where each
measured quantile may lie given the probe's own sample size: a quantile q of n echoes lies,
but for a chance below 1 in 15,000, between the expected quantiles at q -/+ 4 sqrt(q(1-q)/n)
(the rank of an order statistic is binomial). The link guard widens that by its timing
allowance (`impairment.rtt_tolerance_ms`): a link without jitter expects one RTT, and the
probe's timing adds hundredths of a millisecond. The median is always judged; p10 and p90
where the expected spread is wider than twice the allowance (jitter the probe can see). The
two-sample Kolmogorov-Smirnov distance of measured and expected RTTs is recorded (scipy); it
says little for a link without jitter, where the expected RTTs are one value. Loss per
direction is expected at each packet's phase's mean rate. For a profile that changes, each
phase the probe met is one window with its own figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats as sps

from testbed.links.model import REPLICAS, Leg, round_trips
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import Phase, timeline

QUANTILES = (0.1, 0.5, 0.9)
LABELS = {"p10": "p10 RTT", "p50": "median RTT", "p90": "p90 RTT"}
Z = 4.0  # standard deviations of a quantile's rank the guard allows (as the loss guard's band)


@dataclass(frozen=True)
class LinkClock:
    """When one link's phases began to count, per direction, on the probe's CLOCK_MONOTONIC
    (ns): `holder`, as the holder wrote it, or `estimated` from the controller's clock (a
    holder on another machine)."""

    up_ns: int
    down_ns: int
    source: Literal["holder", "estimated"] = "holder"


class Quantiles(BaseModel):
    p10: float
    p50: float
    p90: float

    @classmethod
    def of(cls, values: np.ndarray) -> Quantiles:
        p10, p50, p90 = (float(v) for v in np.quantile(values, QUANTILES))
        return cls(p10=p10, p50=p50, p90=p90)

    def scaled(self, factor: float) -> Quantiles:
        return Quantiles(p10=self.p10 * factor, p50=self.p50 * factor, p90=self.p90 * factor)


class Window(BaseModel):
    """One phase of a changing profile, as the probe met it (times from when it was applied;
    RTT and loss as asked in it, the rest per packet sent in it)."""

    at_s: float
    rtt_ms: float
    jitter_ms: float
    loss_up: float
    loss_down: float
    sent: int
    echoes: int
    rtt_expected_p50_ms: float | None
    rtt_measured_p50_ms: float | None
    loss_expected: float  # round trip, at each packet's phases
    loss_measured: float | None

    def scaled(self, factor: float) -> Window:
        def f(v: float | None) -> float | None:
            return None if v is None else v * factor

        return self.model_copy(update={
            "at_s": self.at_s * factor, "rtt_ms": self.rtt_ms * factor,
            "jitter_ms": self.jitter_ms * factor,
            "rtt_expected_p50_ms": f(self.rtt_expected_p50_ms),
            "rtt_measured_p50_ms": f(self.rtt_measured_p50_ms),
        })  # fmt: skip


class LinkFit(BaseModel):
    """A probe's RTTs and losses beside the model's (see the module docstring); ms."""

    order: str
    jitter_dist: str
    clock: str  # holder | estimated | start (the probe's first packet taken for the apply)
    echoes: int
    expected: Quantiles | None
    measured: Quantiles | None
    accept: dict[str, tuple[float, float]]  # per quantile: where the measured one may lie
    ks_distance: float | None
    ks_p: float | None
    loss_up_expected: float
    loss_down_expected: float
    windows: list[Window] = Field(default_factory=list)
    # per echo: the RTT asked for when it was sent (not stored)
    rtt_in_force_ms: dict[int, float] = Field(default_factory=dict, exclude=True, repr=False)

    def scaled(self, factor: float) -> LinkFit:
        """The same figures with every time multiplied by `factor` (1 / time dilation)."""
        return self.model_copy(update={
            "expected": self.expected and self.expected.scaled(factor),
            "measured": self.measured and self.measured.scaled(factor),
            "accept": {k: (lo * factor, hi * factor) for k, (lo, hi) in self.accept.items()},
            "windows": [w.scaled(factor) for w in self.windows],
            "rtt_in_force_ms": {k: v * factor for k, v in self.rtt_in_force_ms.items()},
        })  # fmt: skip

    @property
    def model(self) -> str:
        """The model's name in a line: jitter and order."""
        if self.expected is not None and self.expected.p90 == self.expected.p10:
            return "no jitter"
        return f"{self.jitter_dist} jitter, order {self.order}"

    def rtt_problems(self, allowance_ms: float) -> list[str]:
        """What of the measured RTTs lies outside where the model puts it, `allowance_ms` of
        timing error allowed (empty: as expected)."""
        if self.expected is None or self.measured is None:
            return []
        spread = self.expected.p90 - self.expected.p10
        judged = ["p50"] + (["p10", "p90"] if spread > 2 * allowance_ms else [])
        out = []
        for name in judged:
            lo, hi = self.accept[name]
            got = getattr(self.measured, name)
            if not lo - allowance_ms <= got <= hi + allowance_ms:
                out.append(
                    f"{LABELS[name]} {got:.2f} ms, expected {getattr(self.expected, name):.2f} "
                    f"ms ({lo - allowance_ms:.2f}-{hi + allowance_ms:.2f} ms for {self.echoes} "
                    f"echoes with {allowance_ms:g} ms timing allowance; {self.model})"
                )
        return out


def phase_at(phases: list[Phase], seconds: np.ndarray) -> np.ndarray:
    """Index of the phase in force at each time (s from apply; before 0: the first)."""
    starts = np.array([p.at_s for p in phases])
    return np.clip(np.searchsorted(starts, seconds, side="right") - 1, 0, len(phases) - 1)


def send_times(sent: int, sent_ns: dict[int, int], interval_ms: float) -> np.ndarray | None:
    """When each of `sent` packets left (ns), from the kernel stamps of those that came back
    and the nominal spacing for the rest; None when none came back."""
    if not sent_ns:
        return None
    seqs = np.fromiter(sent_ns, dtype=np.int64)
    stamps = np.fromiter(sent_ns.values(), dtype=np.float64)
    start = float(np.median(stamps - seqs * interval_ms * 1e6))
    times = start + np.arange(sent) * interval_ms * 1e6
    times[seqs[seqs < sent]] = stamps[seqs < sent]
    return times


def _leg(phases: list[Phase], index: np.ndarray, at_ms: np.ndarray, direction: str) -> Leg:
    profiles = [phases[i].profile for i in index]
    loss = [p.up_loss if direction == "up" else p.down_loss for p in profiles]
    return Leg(
        at_ms=at_ms,
        delay_ms=np.array([p.one_way_ms for p in profiles]),
        jitter_ms=np.array([p.jitter_ms for p in profiles]),
        loss=np.array(loss),
    )


def _accept(expected: np.ndarray, n: int) -> dict[str, tuple[float, float]]:
    out = {}
    for q in QUANTILES:
        half = Z * math.sqrt(q * (1 - q) / n)
        lo, hi = np.quantile(expected, [max(0.0, q - half), min(1.0, q + half)])
        out[f"p{round(q * 100)}"] = (float(lo), float(hi))
    return out


def fit_probe(
    profile: LinkProfile,
    sent: int,
    at_server: list[int],
    rtt_ms: dict[int, float],
    sent_ns: dict[int, int] | None = None,
    echo_sent_ns: dict[int, int] | None = None,
    clock: LinkClock | None = None,
    interval_ms: float = 10.0,
    replicas: int = REPLICAS,
) -> LinkFit:
    """The fit of one probe of a link applied with `profile` (real time): `sent` packets, those
    the server saw, each echo's RTT, and when each packet and echo left (ns; where missing, the
    packets are taken `interval_ms` apart); without a `clock` the first packet counts as sent
    when the profile was applied."""
    phases = timeline(profile)
    times = send_times(sent, sent_ns or {}, interval_ms)
    if times is None:
        times = np.arange(sent) * interval_ms * 1e6
    up0 = clock.up_ns if clock else times[0]
    down0 = clock.down_ns if clock else times[0]
    up_index = phase_at(phases, (times - up0) / 1e9)
    echo_at = times + np.array([phases[i].profile.one_way_ms * 1e6 for i in up_index])
    for seq, ns in (echo_sent_ns or {}).items():
        if 0 <= seq < sent:
            echo_at[seq] = ns
    down_index = phase_at(phases, (echo_at - down0) / 1e9)
    at_ms = (times - times[0]) / 1e6
    up, down = _leg(phases, up_index, at_ms, "up"), _leg(phases, down_index, at_ms, "down")
    sims = round_trips(profile.seed, up, down, profile.jitter_dist, profile.order, replicas)
    echoed = np.array(sorted(s for s in rtt_ms if 0 <= s < sent), dtype=np.int64)
    measured = np.array([rtt_ms[s] for s in echoed])
    pool = sims[:, echoed].ravel()
    pool = pool[~np.isnan(pool)]
    reached = np.array(sorted({s for s in at_server if 0 <= s < sent}), dtype=np.int64)
    have = len(measured) > 0 and len(pool) > 0
    ks = sps.ks_2samp(measured, pool) if have else None
    return LinkFit(
        order=profile.order,
        jitter_dist=profile.jitter_dist,
        clock=clock.source if clock else "start",
        echoes=len(measured),
        expected=Quantiles.of(pool) if have else None,
        measured=Quantiles.of(measured) if len(measured) else None,
        accept=_accept(pool, len(measured)) if have else {},
        ks_distance=float(ks.statistic) if ks is not None else None,
        ks_p=float(ks.pvalue) if ks is not None else None,
        loss_up_expected=float(up.loss.mean()) if sent else 0.0,
        loss_down_expected=float(down.loss[reached].mean()) if len(reached) else 0.0,
        windows=_windows(phases, up_index, up, down, sims, rtt_ms) if profile.varies else [],
        rtt_in_force_ms={int(s): phases[up_index[s]].profile.rtt_ms for s in echoed},
    )


def _windows(
    phases: list[Phase],
    up_index: np.ndarray,
    up: Leg,
    down: Leg,
    sims: np.ndarray,
    rtt_ms: dict[int, float],
) -> list[Window]:
    """Per phase the probe sent packets in: its figures (see `Window`)."""
    out = []
    survive = (1 - up.loss) * (1 - down.loss)
    for i in sorted(set(up_index.tolist())):
        seqs = np.flatnonzero(up_index == i)
        back = [s for s in seqs if s in rtt_ms]
        pool = sims[:, back].ravel() if back else np.array([])
        pool = pool[~np.isnan(pool)]
        prof = phases[i].profile
        out.append(
            Window(
                at_s=phases[i].at_s,
                rtt_ms=prof.rtt_ms,
                jitter_ms=prof.jitter_ms,
                loss_up=prof.up_loss,
                loss_down=prof.down_loss,
                sent=len(seqs),
                echoes=len(back),
                rtt_expected_p50_ms=float(np.median(pool)) if len(pool) else None,
                rtt_measured_p50_ms=float(np.median([rtt_ms[s] for s in back])) if back else None,
                loss_expected=float(1 - survive[seqs].mean()),
                loss_measured=1 - len(back) / len(seqs) if len(seqs) else None,
            )
        )
    return out
