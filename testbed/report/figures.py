"""The report's figures as `Chart`s built from a `RunData`; a figure whose data the run lacks
comes back as `Skipped` with the reason."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pandas as pd
from pandas.api.typing import DataFrameGroupBy

from testbed.core.stats import mean_ci
from testbed.report.charts import Chart, RefLine, Series, Skipped
from testbed.report.crossover import crossovers
from testbed.report.data import RunData
from testbed.report.lab_overlay import lab_points

Figure = Chart | Skipped
WINDOW = 20  # rounds per point of the over-time curves
MAX_NAMED = 6  # crossovers named in the figure's note (all of them: the report's table)


def _values(s: pd.Series) -> list[float | None]:
    return [None if pd.isna(v) else float(v) for v in s]


def _loss_sweep(run: RunData, key: str, title: str) -> pd.DataFrame | Skipped:
    """Finished conditions sorted by requested loss; Skipped unless loss takes 2+ values."""
    df = run.done
    if df.empty:
        return Skipped(key, title, "the run has no finished condition")
    df = df[df["loss"].notna()]
    if df["loss"].nunique() < 2:
        return Skipped(key, title, "the run does not sweep the link loss (needs 2+ loss values)")
    return df.sort_values("loss")


def device_rates(run: RunData, cid: str) -> dict[str, list[float]]:
    """Per device tokens/s of a condition, verified and total (device tokens / device span,
    the stats object's counts)."""
    s = run.stats(cid)
    spans = {d: t for d, t in s.device_spans_s.items() if t > 0}
    return {
        "verified": [s.device_verified_tokens.get(d, 0) / t for d, t in spans.items()],
        "total": [s.device_tokens.get(d, 0) / t for d, t in spans.items()],
    }


def throughput_vs_loss(run: RunData) -> Figure:
    key, title = "throughput_vs_loss", "Throughput against loss"
    df = _loss_sweep(run, key, title)
    if isinstance(df, Skipped):
        return df
    x = [100 * v for v in df["loss"]]
    series = []
    for kind in ("verified", "total"):
        cis = [mean_ci(device_rates(run, cid)[kind]) for cid in df["condition"]]
        series.append(
            Series(
                f"{kind} tokens/s",
                x,
                [c.mean for c in cis],
                [c.low for c in cis],
                [c.high for c in cis],
            )
        )
    return Chart(
        key, title, "per-direction loss (%)", "tokens/s per device", series,
        note="mean over devices with its 95 % t-interval; verified tokens came out of the "
        "target's verdicts, total adds the draft tokens kept during fallback",
    )  # fmt: skip


def accuracy_vs_loss(run: RunData) -> Figure:
    key, title = "accuracy_vs_loss", "Answer accuracy against loss"
    df = _loss_sweep(run, key, title)
    if isinstance(df, Skipped):
        return df
    stats = [run.stats(cid) for cid in df["condition"]]
    if not any(s.scored for s in stats):
        return Skipped(key, title, "no answers were scored (the workload has no references)")
    x = [100 * v for v in df["loss"]]
    series = []
    for name in ("strict", "flexible"):
        cis = [getattr(s, f"{name}_ci") or (None, None) for s in stats]
        series.append(
            Series(
                f"{name} match",
                x,
                [getattr(s, f"{name}_accuracy") for s in stats],
                [c[0] for c in cis],
                [c[1] for c in cis],
            )
        )
    refs, notes = reference_levels(run, df)
    return Chart(key, title, "per-direction loss (%)", "accuracy", series, refs, notes)


def reference_levels(run: RunData, df: pd.DataFrame) -> tuple[list[RefLine], str]:
    """Target-only: the target's own greedy answers to the same problems (the stats'
    target_flexible_accuracy, averaged over conditions); draft-only: a condition whose answers
    are all draft tokens (device-only mode, or total loss). Each is left out, with a note,
    when the run cannot give it."""
    refs, notes = [], []
    target = [run.stats(c).target_flexible_accuracy for c in df["condition"]]
    target = [v for v in target if v is not None]
    if target:
        refs.append(RefLine("target only", float(np.mean(target))))
    else:
        notes.append("no target-only line: the run did not score the target's own answers")
    draft_only = [
        cid
        for cid, mode in zip(df["condition"], df["mode"])
        if mode == "device-only" or run.stats(cid).fallback_share == 1.0
    ]
    if draft_only:
        values = [run.stats(c).flexible_accuracy for c in draft_only]
        values = [v for v in values if v is not None]
        if values:
            refs.append(RefLine("draft only", float(np.mean(values))))
    else:
        notes.append("no draft-only line: no condition ran on the draft alone")
    notes.insert(0, "95 % Wilson intervals; reference lines use the flexible match")
    return refs, "; ".join(notes)


def _by_devices(run: RunData, key: str, title: str) -> pd.DataFrame | Skipped:
    """Finished conditions with their device count; Skipped unless it takes 2+ values."""
    df = run.done
    if df.empty or df["devices"].dropna().nunique() < 2:
        return Skipped(key, title, "the run does not sweep the device count (needs 2+ counts)")
    return df[df["devices"].notna()].sort_values("devices")


def _per_mode(run: RunData, df: pd.DataFrame, figure: str) -> list[Series]:
    return [
        Series(
            f"{mode}",
            [float(n) for n in part["devices"]],
            [getattr(run.stats(c), figure) for c in part["condition"]],
        )
        for mode, part in df.groupby("mode")
    ]


def sled_vs_centralized(run: RunData) -> Figure:
    key, title = "sled_vs_centralized", "Throughput against device count, per mode"
    df = _by_devices(run, key, title)
    if isinstance(df, Skipped):
        return df
    modes = set(df["mode"])
    note = "" if {"sled", "centralized"} <= modes else f"modes in this run: {sorted(modes)}"
    series = _per_mode(run, df, "system_verified_tok_s")
    return Chart(key, title, "devices", "system verified tokens/s", series, note=note)


def where_sled_wins(run: RunData) -> Figure:
    """SLED against centralized over device count, one pair of curves per other swept
    setting (RTT, target, ...); the crossovers and capacities are the report's "Where SLED
    wins" table (testbed.report.crossover)."""
    key, title = "where_sled_wins", "Where SLED wins: verified throughput over device count"
    df = _by_devices(run, key, title)
    if isinstance(df, Skipped):
        return df
    if not {"sled", "centralized"} <= set(df["mode"]):
        return Skipped(key, title, "the run does not sweep both sled and centralized")
    points = crossovers(df)
    series = [
        Series(f"{mode} {p.setting}".strip(), [float(n) for n in curve.index],
               [float(v) for v in curve.to_numpy()])
        for p in points for mode, curve in p.curves.items()
    ]  # fmt: skip
    won = [p for p in points if p.wins_from is not None]
    notes = [f"SLED overtakes centralized in {len(won)} of {len(points)} settings"
             + "".join(f"; {p.setting or 'all'}: from {p.wins_from:g} devices"
                       for p in won[:MAX_NAMED])
             + ("; ..." if len(won) > MAX_NAMED else "")
             + " (capacities: the Where SLED wins table)"]  # fmt: skip
    simulated = " (simulated by the twin)" if run.manifest.get("simulated") else ""
    if simulated:
        overlay = lab_points(run.root.parent)
        series += overlay
        if overlay:
            notes.append(f"points: the lab's validation runs ({len(overlay)} series), loss <= 5 %")
    return Chart(key, title + simulated, "devices", "system verified tokens/s", series,
                 note="; ".join(notes))  # fmt: skip


def capacity_vs_devices(run: RunData) -> Figure:
    """The figure capacity is defined on (testbed.metrics.capacity): the slowest device's
    verified rate against the device count; where the run is a probe of `testbed capacity`,
    the target rate is drawn and the capacity found is named."""
    key, title = "capacity_vs_devices", "Slowest device's verified rate against device count"
    df = _by_devices(run, key, title)
    if isinstance(df, Skipped):
        return df
    series = _per_mode(run, df, "device_verified_tok_s_min")
    refs, note = [], "capacity at rate R: the largest count whose curve stays above R"
    search = run.root.parent.parent / "capacity.json"
    if search.is_file():
        found = json.loads(search.read_text())
        refs.append(RefLine(f"rate {found['rate']} tok/s", float(found["rate"])))
        note = f"testbed capacity found {found['capacity']} devices at {found['rate']} tok/s"
    return Chart(key, title, "devices", "verified tokens/s, slowest device", series, refs, note)


def _rounds(run: RunData) -> pd.DataFrame:
    """Every finished condition's device rounds, with t = seconds on the device's own clock
    since that device's first round of the run."""
    parts = [run.table(c, "rounds") for c in run.done["condition"]] if not run.done.empty else []
    parts = [p for p in parts if not p.empty and "t_end" in p]
    if not parts:
        return pd.DataFrame()
    rounds = pd.concat(parts, ignore_index=True).sort_values(["dev", "t_end"])
    rounds["t"] = rounds["t_end"] - rounds.groupby("dev")["t_start"].transform("min")
    return rounds


def host_classes(run: RunData) -> dict[str, str]:
    """device -> host class, from the hosts tables (empty when the run does not say)."""
    out: dict[str, str] = {}
    for cid in run.done["condition"] if not run.done.empty else []:
        hosts = run.table(cid, "hosts")
        if {"dev", "host_class"} <= set(hosts.columns):
            out.update({str(d): str(c) for d, c in zip(hosts["dev"], hosts["host_class"]) if c})
    return out


def _over_time(
    run: RunData, key: str, title: str, ylabel: str, by_class: bool,
    value: Callable[[DataFrameGroupBy], pd.Series],
) -> Figure:  # fmt: skip
    rounds = _rounds(run)
    if rounds.empty:
        return Skipped(key, title, "the run has no device rounds")
    if by_class:
        classes = host_classes(run)
        if not classes:
            return Skipped(key, title, "the run does not record the devices' host classes")
        rounds["group"] = rounds["dev"].map(classes).fillna("unknown")
    else:
        rounds["group"] = rounds["dev"]
    series = []
    for group, part in rounds.groupby("group"):
        part = part.sort_values("t")
        bins = np.arange(len(part)) // WINDOW
        agg = part.assign(bin=bins).groupby("bin")
        y = value(agg)
        series.append(Series(str(group), _values(agg["t"].max()), _values(y)))
    if all(all(v is None for v in s.y) for s in series):
        return Skipped(key, title, "no verified round to measure")
    return Chart(
        key, title, "seconds (each device's own clock, conditions in run order)", ylabel,
        series, note=f"one point per {WINDOW} rounds of a {'class' if by_class else 'device'}",
    )  # fmt: skip


def _acceptance(agg: DataFrameGroupBy) -> pd.Series:
    """accepted / drafted over the verified rounds of each window (the acceptance rate)."""
    from testbed.metrics import acceptance_rate

    rates = {
        b: acceptance_rate(
            int(g.loc[g["mode"] == "verified", "accepted"].sum()),
            int(g.loc[g["mode"] == "verified", "drafted"].sum()),
        )
        for b, g in agg
    }  # a window with no draft has no rate (None): `apply` would turn all-None into a frame
    return pd.Series(rates, dtype=float)


def acceptance_over_time(run: RunData, by_class: bool = False) -> Figure:
    suffix = "host class" if by_class else "device"
    return _over_time(
        run, f"acceptance_by_{suffix.replace(' ', '_')}", f"Acceptance over time per {suffix}",
        "acceptance rate", by_class, _acceptance,
    )  # fmt: skip


def draft_length_over_time(run: RunData, by_class: bool = False) -> Figure:
    suffix = "host class" if by_class else "device"
    return _over_time(
        run, f"draft_length_by_{suffix.replace(' ', '_')}", f"Draft length over time per {suffix}",
        "drafted tokens per round", by_class, lambda agg: agg["drafted"].mean(),
    )  # fmt: skip


def latency_percentiles(run: RunData) -> Figure:
    key, title = "latency_percentiles", "Latency percentiles per condition"
    df = run.done
    if df.empty:
        return Skipped(key, title, "the run has no finished condition")
    sweep_loss = df["loss"].notna().all() and df["loss"].nunique() > 1
    df = df.sort_values("loss") if sweep_loss else df
    x = [100 * v for v in df["loss"]] if sweep_loss else list(map(float, range(len(df))))
    series = []
    for kind, qs in (("e2e", (50, 90, 99)), ("ttft", (50, 99))):
        for q in qs:
            y = [run.stats(c).latency_ms(kind, q) for c in df["condition"]]
            if any(v is not None for v in y):
                series.append(Series(f"{kind} p{q}", x, y, style="points"))
    if not series:
        return Skipped(key, title, "no request finished")
    xlabel = "per-direction loss (%)" if sweep_loss else "condition (run order)"
    return Chart(
        key, title, xlabel, "milliseconds", series, note="e2e: whole answer; ttft: first token"
    )


def link_over_time(run: RunData) -> Figure:
    key, title = "link_over_time", "Measured against requested link"
    df = run.conditions
    rows = []
    for i, cond in enumerate(df.to_dict("records") if not df.empty else []):
        summary = (run.link(cond["condition"]).get("summary")) or {}
        rows.append(
            {
                "t": float(i if pd.isna(cond["started"]) else cond["started"]),
                "rtt_req": cond.get("link_requested.rtt_ms"),
                "rtt_meas": summary.get("rtt_measured_ms"),
                "loss_req": cond["loss"],
                "loss_meas": summary.get("loss_measured", summary.get("loss_up_measured")),
            }
        )
    frame = pd.DataFrame(rows)
    if frame.empty or frame["rtt_meas"].isna().all():
        return Skipped(key, title, "no condition has a link probe")
    t0 = frame["t"].min()
    x = list(frame["t"] - t0)
    series = [
        Series("RTT requested (ms)", x, _values(frame["rtt_req"]), style="step"),
        Series("RTT measured (ms)", x, _values(frame["rtt_meas"]), style="points"),
        Series("loss requested (%)", x, _values(frame["loss_req"] * 100), style="step"),
        Series("loss measured (%)", x, _values(frame["loss_meas"] * 100), style="points"),
    ]
    changes = [
        run.table(c, "link_changes") for c in df["condition"]
    ]  # schedule steps, cuts, failovers
    changes = [c for c in changes if not c.empty and "t" in c]
    if changes:
        ch = pd.concat(changes)
        series.append(
            Series(
                "link change (RTT ms)", list(ch["t"] - t0), _values(ch["rtt_ms"]), style="points"
            )
        )
    note = "controller clock; one probe per condition" + (
        "" if changes else "; the run records no schedule steps or failovers"
    )
    return Chart(key, title, "seconds since the first condition", "ms / %", series, note=note)


def balance_throughput_by_policy(run: RunData) -> Figure:
    """BALANCE runs: users finished within deadline per second against the user count, one
    curve per policy and memory budget (the journal's `task_throughput`), the mean over
    repetitions with its 95 % t-interval."""
    key, title = "balance_throughput_by_policy", "Task throughput by policy"
    df = run.done
    if df.empty or "task_throughput" not in df or df["task_throughput"].isna().all():
        return Skipped(key, title, "not a BALANCE run (no task throughput)")
    df = df[df["task_throughput"].notna()].sort_values("users")
    series = []
    for (name, gb), part in df.groupby(["policy", "memory_budget_gb"]):
        by_users = list(part.groupby("users")["task_throughput"])
        cis = [mean_ci(list(values)) for _, values in by_users]
        series.append(
            Series(
                f"{name}, {gb:g} GB",
                [float(n) for n, _ in by_users],
                [c.mean for c in cis],
                [c.low for c in cis],
                [c.high for c in cis],
            )
        )
    return Chart(
        key, title, "users", "users finished within deadline per second", series,
        note="users whose every token reached their device in time, per second of the "
        "workload's span; mean over repetitions with its 95 % t-interval",
    )  # fmt: skip


def all_figures(run: RunData) -> list[Figure]:
    """Every figure of the report, in reading order."""
    return [
        throughput_vs_loss(run),
        accuracy_vs_loss(run),
        sled_vs_centralized(run),
        where_sled_wins(run),
        capacity_vs_devices(run),
        acceptance_over_time(run),
        acceptance_over_time(run, by_class=True),
        draft_length_over_time(run),
        draft_length_over_time(run, by_class=True),
        latency_percentiles(run),
        link_over_time(run),
        balance_throughput_by_policy(run),
    ]
