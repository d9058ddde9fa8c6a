"""Summaries of link probes and the guard that refuses a link that does not measure as asked.

The guard catches an impairment that silently failed (no delay, no jitter, no loss, everything
lost, a schedule not followed), not statistical noise. It judges each probe packet against the
profile in force when it was sent (a schedule step, a trace row) through the holder's own model
(`testbed.links.expect`): the measured median RTT, and for a jittered link p10 and p90, must
lie where the model puts them for the probe's number of echoes, widened by the playbook's
timing allowance (`ImpairmentSection.rtt_tolerance`: wider where the probe timed echoes in
user space); each direction's loss within four binomial standard deviations of the loss its
packets met (at least 2 points). A link
that fails is probed again (`impairment.probe_retries` times) before the condition fails: a
probe lasts about a second, and a stall of the machine meanwhile (a paused VM, a busy CPU
delaying a probe that times its echoes in user space) moves its median, where a broken
impairment fails every probe. Each failed try is kept in the record. The 95 % binomial
verdicts of the probe are stored beside it for the record.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from testbed.config.playbook import ImpairmentSection
from testbed.core.errors import ImpairmentError
from testbed.links.probe import LossFigure, ProbeResult
from testbed.topo.profile import LinkProfile


def loss_guard_ok(fig: LossFigure) -> bool:
    """Measured loss close enough to the request to trust the link (see module docstring)."""
    if fig.requested is None or not fig.of or fig.rate is None:
        return True
    p = fig.requested
    band = max(0.02, 4 * math.sqrt(p * (1 - p) / fig.of))
    return abs(fig.rate - p) <= band


def check_links(probes: dict[str, ProbeResult], tolerance_ms: float) -> None:
    """Raise ImpairmentError naming each device link that does not measure as the profile it
    was probed against (`ProbeResult.fit`: RTT quantiles where the model puts them,
    `tolerance_ms` of timing allowed; loss within the band above)."""
    problems = []
    for dev, r in probes.items():
        asked = r.loss_round_trip.requested
        if r.rtt_ms is not None and r.fit is not None:
            problems += [f"{dev}: {p}" for p in r.fit.rtt_problems(tolerance_ms)]
        elif r.rtt_ms is None and asked is not None and asked < 1:
            problems.append(f"{dev}: no probe came back at expected round-trip loss {asked:.3g}")
        for name, fig in (("up", r.loss_up), ("down", r.loss_down)):
            if not loss_guard_ok(fig):
                problems.append(
                    f"{dev}: {name} loss measured {fig.rate:.3f} ({fig.lost}/{fig.of}), "
                    f"requested {fig.requested}"
                )
    if problems:
        raise ImpairmentError("link does not measure as requested: " + "; ".join(problems))


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_links(probes: dict[str, ProbeResult]) -> dict[str, Any]:
    """Condition-level figures: median RTT over devices, pooled per-direction loss."""

    def pooled(attr: str) -> float | None:
        figs = [getattr(r, attr) for r in probes.values()]
        total = sum(f.of for f in figs)
        return sum(f.lost for f in figs) / total if total else None

    rtts = [r.rtt_ms.p50 for r in probes.values() if r.rtt_ms is not None]
    expected = [r.fit.expected.p50 for r in probes.values() if r.fit and r.fit.expected]
    p99 = [r.rtt_error_ms["p99"] for r in probes.values() if r.rtt_error_ms]
    up, down = pooled("loss_up"), pooled("loss_down")
    return {
        "rtt_expected_ms": statistics.median(expected) if expected else None,
        "rtt_measured_ms": statistics.median(rtts) if rtts else None,
        "rtt_error_p99_ms": max(p99) if p99 else None,
        "loss_up_measured": up,
        "loss_down_measured": down,
        "loss_measured": _mean([x for x in (up, down) if x is not None]),
        "loss_within_95": all(r.ok for r in probes.values()),
    }


def probe_checked(
    record: dict[str, Any],
    probe: Callable[[], dict[str, ProbeResult]],
    profiles: dict[str, LinkProfile],
    knobs: ImpairmentSection,
    save: Callable[[], None],
    say: Callable[[str], None],
    dilation: float = 1.0,
    requested: dict[str, LinkProfile] | None = None,
) -> None:
    """Probe the links into `record` (`rtt_tolerance_ms`, `summary`, `probes`, and each failed
    try's problem and summary under `failed_tries`), `save` it, and check them (the tolerance
    for how the probe timed echoes: `ProbeResult.timed_in_user_space`); a failed check probes
    again up to `knobs.probe_retries` times, then raises its ImpairmentError.

    With time dilation the links carry `profiles` dilated (real time) and are checked against
    them; `summary` and `probes` are kept in emulated time, against `requested` (the profiles
    as the playbook asked for them)."""
    for attempt in range(knobs.probe_retries + 1):
        probes = probe()
        in_user_space = any(r.timed_in_user_space for r in probes.values())
        tolerance = record["rtt_tolerance_ms"] = knobs.rtt_tolerance(in_user_space)
        shown = {
            d: r.in_emulated_time(dilation, (requested or profiles).get(d))
            for d, r in probes.items()
        }
        record["summary"] = summarize_links(shown)
        record["probes"] = {d: r.model_dump(mode="json") for d, r in shown.items()}
        save()
        try:
            check_links(probes, tolerance)
            return
        except ImpairmentError as exc:
            if attempt == knobs.probe_retries:
                raise
            record.setdefault("failed_tries", []).append(
                {"problem": str(exc), "summary": record["summary"]}
            )
            say(f"  {exc}; probing again ({attempt + 1} of {knobs.probe_retries})")
