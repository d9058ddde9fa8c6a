"""`testbed lab calibrate` and `testbed bench link`: measure what the emulated links do."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from testbed.commands.exits import exit_codes
from testbed.commands.lab_options import (
    INTERRUPTED,
    DevicesOpt,
    InventoryOpt,
    NameOpt,
    StateOpt,
    link_site,
)

if TYPE_CHECKING:
    from testbed.bench.link import ProfileTail
    from testbed.links.calibrate import Calibration, LossVerdict


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def describe(c: Calibration) -> str:
    """One line per link and profile."""
    parts = [f"{c.profile} {c.device} [{c.backend}]:"]
    if c.rtt_p50_ms is None:
        parts.append("no echo came back;")
    else:
        parts.append(
            f"rtt p50 {_fmt(c.rtt_p50_ms)} p99 {_fmt(c.rtt_p99_ms)} ms, |error| p50 "
            f"{_fmt(c.rtt_error_p50_ms)} p99 {_fmt(c.rtt_error_p99_ms)} ms, jitter std "
            f"{_fmt(c.jitter_std_ms)} ipdv {_fmt(c.jitter_ipdv_ms)} ms;"
        )
    for label, chk, ge in (("up", c.loss_up, c.bursts_up), ("down", c.loss_down, c.bursts_down)):
        if chk.rate is None:
            parts.append(f"loss {label} -;")
            continue
        lo, hi = chk.rate_ci95
        mark = {True: "ok", False: "OUTSIDE the request's 95% interval", None: "GE"}[chk.within]
        parts.append(
            f"loss {label} {100 * chk.rate:.2f}% (95% CI {100 * lo:.2f}-{100 * hi:.2f}, "
            f"asked {100 * chk.requested:.2f}%) {mark};"
        )
        if ge is not None:
            parts.append(
                f"GE {label} loss {_fmt(ge.measured_mean_loss)} vs model "
                f"{ge.model_mean_loss:.3f}, burst {_fmt(ge.measured_mean_burst, 2)} vs model "
                f"{ge.model_mean_burst:.2f} ({ge.bursts} bursts);"
            )
    if c.throughput_mbit is not None:
        parts.append(
            f"echo throughput {c.throughput_mbit:.2f} Mbit/s (limit {c.requested.rate_mbit:g})"
        )
    fit = c.fit
    if fit is not None and fit.expected is not None and fit.measured is not None:
        e, m = fit.expected, fit.measured
        parts.append(
            f"model ({fit.model}): p10/p50/p90 expected {e.p10:.2f}/{e.p50:.2f}/{e.p90:.2f}, "
            f"measured {m.p10:.2f}/{m.p50:.2f}/{m.p90:.2f} ms, KS distance "
            f"{_fmt(fit.ks_distance)} (p {_fmt(fit.ks_p)})"
        )
    lines = [" ".join(parts)]
    for w in fit.windows if fit is not None else []:
        lines.append(
            f"    from {w.at_s:g} s (rtt {w.rtt_ms:g} ms, loss up/down {w.loss_up:g}/"
            f"{w.loss_down:g}): {w.echoes}/{w.sent} back, rtt p50 expected "
            f"{_fmt(w.rtt_expected_p50_ms)} measured {_fmt(w.rtt_measured_p50_ms)} ms, "
            f"round-trip loss expected {100 * w.loss_expected:.1f}% measured "
            f"{'-' if w.loss_measured is None else f'{100 * w.loss_measured:.1f}%'}"
        )
    return "\n".join(lines)


def _print_distances(rows: list[Calibration]) -> None:
    """Per jittered profile: the KS distance of realized and expected RTTs over its links."""
    from testbed.links.calibrate import distances

    for d in distances(rows):
        typer.echo(
            f"  {d.profile}: {d.jitter_dist} jitter, order {d.order}: KS distance "
            f"{d.ks_median:.3f} median, {d.ks_max:.3f} worst over {d.links} links "
            f"({d.echoes} echoes each at least; p below 0.01 on {d.rejected}); median RTT "
            f"expected {d.expected_p50_ms:.2f}, measured {d.measured_p50_ms:.2f} ms"
        )


def _print(rows: list[Calibration], as_json: bool) -> None:
    for r in rows:
        sys.stdout.write((r.model_dump_json() if as_json else describe(r)) + "\n")


def _print_verdict(v: LossVerdict) -> None:
    for key, (lost, of, asked, ok) in v.pooled.items():
        typer.echo(
            f"  {key}: {lost}/{of} lost over all links ({100 * lost / max(of, 1):.2f}%, "
            f"asked {100 * asked:g}%) {'inside' if ok else 'OUTSIDE'} its 95 % interval"
        )
    typer.echo(
        f"single links inside their 95 % interval: {v.inside}/{v.checks} (misses against "
        f"the 5 % a 95 % interval allows: binomial p = {v.misses_p:.2f}); "
        f"loss {'as asked' if v.ok else 'NOT as asked'}"
    )


def calibrate(
    profiles: Annotated[
        Path | None,
        typer.Option(help="YAML mapping name -> link profile (default: a built-in set at 85 ms)."),
    ] = None,
    device: DevicesOpt = None,
    count: Annotated[int, typer.Option(help="Probe packets per link and profile.")] = 500,
    interval: Annotated[float, typer.Option(help="Interval between packets, ms.")] = 5.0,
    backend: Annotated[str, typer.Option(help="auto, netem or nfqueue.")] = "auto",
    span: Annotated[
        float,
        typer.Option(
            help="Seconds a profile that changes (schedule, trace) is probed from when it is "
            "applied; its windows are reported one by one."
        ),
    ] = 5.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON line per link and profile.")
    ] = False,
    inventory: InventoryOpt = None,
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
) -> None:
    """Apply each profile, count packets on both sides of the hop, compare with the model (on a
    namespace lab, or with --inventory a physical lab's links)."""
    from testbed.links.calibrate import (
        DEFAULT_PROFILES,
        calibrate,
        load_profiles,
        loss_verdict,
    )

    with exit_codes(INTERRUPTED):
        site = link_site(name, state_dir, inventory, False)
        chosen = load_profiles(profiles) if profiles else DEFAULT_PROFILES
        rows = calibrate(site, chosen, device, count, interval, backend=backend,  # type: ignore[arg-type]
                         span_s=span)  # fmt: skip
        _print(rows, as_json)
        verdict = loss_verdict(rows)
        if not as_json:
            typer.echo("distribution distance (realized against expected RTTs, per jitter "
                       "distribution and order):")  # fmt: skip
            _print_distances(rows)
            _print_verdict(verdict)
        if not verdict.ok:
            raise typer.Exit(4)


def _untouched(t: ProfileTail) -> str:
    """The profile's p99 over round trips no held-up spell met, when it differs from all."""
    if t.held_up == 0 or t.p99_untouched_ms is None:
        return ""
    share = 100 * t.untouched / t.echoes if t.echoes else 0.0
    return (
        f"; over the {share:.1f} % of round trips no spell met, worst p99 "
        f"{t.p99_untouched_ms:.3f} ms"
    )


def link(
    devices: Annotated[int, typer.Option(help="Devices of the temporary lab.")] = 16,
    rtt: Annotated[float, typer.Option(help="RTT of every link, ms.")] = 85.0,
    echoes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Round trips wanted per link and loss rate; lossy links are sent more packets "
            "(up to 4 times as many), so each link's p99 rests on about this many RTTs.",
        ),
    ] = 500,
    interval: Annotated[float, typer.Option(help="Interval between packets, ms.")] = 5.0,
    lab: Annotated[str | None, typer.Option(help="Use this running lab instead.")] = None,
    lab_name: Annotated[str, typer.Option(help="Name of the temporary lab.")] = "blink",
    subnet: Annotated[str, typer.Option(help="Subnet of the temporary lab.")] = "10.79.211.0/24",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write rows here.")] = None,
    compare_backup: Annotated[
        bool,
        typer.Option(
            help="Measure each loss rate also with the holder's main thread releasing alone "
            "(no backup releaser), right after, side by side."
        ),
    ] = False,
) -> None:
    """Link fidelity at every loss rate, all devices loaded at once (userspace backend)."""
    import time

    from testbed.bench.link import (
        CYCLE_MS,
        CYCLE_WINDOW_MS,
        GOAL_MEDIAN_MS,
        GOAL_P99_MS,
        run_link_bench,
    )
    from testbed.labs import EmulatedLab, LabSetup

    with exit_codes(INTERRUPTED):
        t0 = time.monotonic()
        if lab:
            site, own = EmulatedLab.find(lab), False
        else:
            setup = LabSetup.build("bench link", name=lab_name, devices=devices, subnet=subnet)
            site, own = EmulatedLab.up(setup), True
        up_s = time.monotonic() - t0
        try:
            res = run_link_bench(
                site, rtt, echoes=echoes, interval_ms=interval, compare_backup=compare_backup
            )
        finally:
            if own:
                site.down()
        _print(res.rows, False)
        typer.echo(
            f"RTT {rtt:g} ms, {res.devices} devices at once: worst median |error| "
            f"{res.worst_median_error_ms:.3f} ms (goal <= {GOAL_MEDIAN_MS}), worst p99 "
            f"{res.worst_p99_error_ms:.3f} ms (goal <= {GOAL_P99_MS}); lab up {up_s:.1f} s"
        )
        if (untouched := res.worst_p99_untouched_ms) is not None:
            typer.echo(
                f"worst p99 over the round trips no held-up spell met (shown, not judged): "
                f"{untouched:.3f} ms"
            )
        if (cycle := res.spell_cycle) is not None:
            listed, share, start = cycle
            typer.echo(
                f"held-up spells by when they began in each {CYCLE_MS:g} ms: {100 * share:.0f} % "
                f"of {listed} in {start:.1f}-{start + CYCLE_WINDOW_MS:.1f} ms "
                f"(about {100 * CYCLE_WINDOW_MS / CYCLE_MS:.0f} % at random times)"
            )
        if res.steal_ms is not None:
            typer.echo(f"CPU time the hypervisor took from this VM during the run (steal): "
                       f"{res.steal_ms:.0f} ms")  # fmt: skip
        if res.holder:
            released, late, latest = res.holder_late
            typer.echo(
                f"packet holder: {released} packets released, {late} of them more than 0.5 ms "
                f"after their due time (its releasers held up), the latest {latest:.3f} ms late; "
                f"{res.holder_unstamped} held from when it read them (no kernel arrival time); "
                f"its backup read {res.holder_read_by_backup} that the main thread had not"
            )
            for t in res.tails():
                typer.echo(
                    f"  {t.profile}: p99 |error| over {GOAL_P99_MS} ms on {t.missed} of "
                    f"{t.links} links; the holder released {t.late_all} of {t.released} "
                    f"packets late, {t.late_missed} of them on those links; its backup "
                    f"released {t.by_backup}; both releasers held up at once {t.held_up} times"
                    + (
                        f" (the longest {t.held_up_longest_ms:.1f} ms; "
                        f"{100 * t.held_up_share:.2f} % of {t.probed_s:.1f} s)"
                        if t.held_up
                        else ""
                    )
                    + (
                        f"; p99 over at least {t.fewest_echoes} round trips a link"
                        if t.fewest_echoes
                        else ""
                    )
                    + _untouched(t)
                    + ("" if t.steal_ms is None else f"; steal {t.steal_ms:.0f} ms")
                )
        _print_verdict(res.loss)
        if json_out:
            json_out.write_text(json.dumps([r.model_dump(mode="json") for r in res.rows]))
        if not res.meets_goals:
            raise typer.Exit(1)
