"""Tables and printed summaries of a run, built from its journal."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config.playbook import shown_value
from testbed.results.marks import mark_lines, shown_status
from testbed.results.policy_comparison import COMPARISON_NOTE, compare_policies, comparison_rows
from testbed.results.store import RunStore
from testbed.results.tables import typed_table, write_parquet

# (column, header, format) of the printed summary; the notes below the table say what each
# header counts
SUMMARY_COLUMNS = [
    ("label", "condition", "{}"),
    ("status", "status", "{}"),
    ("backend", "backend", "{}"),
    ("rtt_measured_ms", "RTT ms", "{:.2f}"),
    ("loss_up_measured", "loss up", "{:.3f}"),
    ("loss_down_measured", "loss down", "{:.3f}"),
    ("system_verified_tok_s", "verified tok/s", "{:.1f}"),
    ("system_unverified_tok_s", "unverified tok/s", "{:.1f}"),
    ("system_tok_s", "total tok/s", "{:.1f}"),
    ("acceptance_rate", "accept", "{:.2f}"),
    ("mean_accepted_length", "acc len", "{:.2f}"),
    ("fallback_share", "fallback", "{:.2f}"),
    ("strict_accuracy", "acc strict", "{:.2f}"),
    ("flexible_accuracy", "acc flex", "{:.2f}"),
    ("target_strict_accuracy", "target acc", "{:.2f}"),
    ("target_match_share", "=target", "{:.2f}"),
    ("served_in_time", "in time", "{:.0f}"),
    ("predicted_served_in_time", "sim in time", "{:.1f}"),
    ("servable_alone", "ceiling", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("tpot_p50_ms", "TPOT p50 ms", "{:.1f}"),
    ("completion_mean_s", "completion s", "{:.2f}"),
    ("completion_mean_error", "sim err", "{:+.0%}"),
    ("peak_held_gb", "peak GB", "{:.3f}"),
    ("memory_budget_gb", "budget GB", "{:g}"),
    ("time_dilation", "dilation", "{:g}"),
    ("behind_share", "behind", "{:.1%}"),
]
# the terminal's table: the headline figures, narrow enough for a 120-column terminal (the full
# table is in `testbed report`'s report.md and on the dashboard)
TERMINAL_WIDTH = 120
TERMINAL_COLUMNS = [
    c
    for c in SUMMARY_COLUMNS
    if c[0]
    in {
        "label", "status", "system_verified_tok_s", "system_unverified_tok_s",
        "acceptance_rate", "strict_accuracy", "target_match_share",
        "served_in_time", "servable_alone", "ttft_p50_ms", "tpot_p50_ms", "behind_share",
    }
]  # fmt: skip
SUMMARY_NOTES = {  # column header -> its note, printed when the table shows that column
    "verified tok/s": "verified tok/s: tokens that came out of the target (its verdicts, or its "
    "own generation in the centralized and server-* modes); unverified tok/s: draft tokens kept "
    "while the server was unreachable (fallback) or the draft's alone (mode device-only); "
    "total = both. Rates divide by the longest device's own span (one clock per device).",
    "accept": "accept: accepted / drafted drafts; acc len: (accepted + rounds) / rounds over "
    "verified rounds (the bonus or correction token included).",
    "acc strict": "acc strict / flex: GSM8K-format exact match (lm-eval strict `#### N` / last "
    "number); target acc: the target's own greedy answers to the same problems, strict; "
    "=target: share of ALL answers equal to the target's own greedy answer.",
    "behind": "behind: forwards whose real computation took longer than the modelled time of "
    "the hardware their host stands for (a condition over 1 % is unfaithful: raise "
    "lab.time_dilation); dilation: lab.time_dilation, every figure in emulated time.",
    "in time": "BALANCE (mode balance): in time: users whose every token reached their device "
    "within the deadline (from the first send: the network is inside it), measured and "
    "simulated (mean of 10 simulated runs over the same link); ceiling: users some mode could "
    "serve in time alone, which no policy exceeds; TTFT / TPOT: time to first token and per "
    "output token after it, on the device; completion: mean first send to last token, sim "
    "err: the simulator's mean against it; peak GB: most memory the server's caches and "
    "models held, in GB of the hardware it stands for, against the budget.",
}


def flatten(entry: dict[str, Any]) -> dict[str, Any]:
    """One journal entry -> one table row (swept values and metrics as columns)."""
    row: dict[str, Any] = {
        "condition": entry["condition"],
        "index": entry.get("index"),
        "status": entry["status"],
        "reason": entry.get("reason", ""),
        "seconds": entry.get("seconds"),
        "label": ", ".join(f"{k}={shown_value(v)}" for k, v in entry.get("values", {}).items())
        or "base",
    }
    for key, value in entry.get("values", {}).items():
        row[f"sweep.{key}"] = shown_value(value)
    link = entry.get("link") or {}
    row["backend"] = link.get("backend")
    row["time_dilation"] = link.get("time_dilation")
    for key, value in (link.get("requested") or {}).items():
        row[f"link_requested.{key}"] = value
    for key, value in (link.get("summary") or {}).items():
        row[key] = value
    faults = entry.get("faults") or []
    row["faults"] = sum(not f.get("injected") for f in faults)
    row["faults_injected"] = sum(bool(f.get("injected")) for f in faults)
    if "devices" in entry:  # a hardware run that lost devices: how many this one had
        row["devices"] = len(entry["devices"])
    row.update(entry.get("metrics") or {})
    return row


PAPER_GAP = 0.2  # a figure of ours further than this from the paper's needs its reason


def paper_rows(df: pd.DataFrame, paper: dict[str, Any] | None) -> tuple[list[str], list[list[str]]]:
    """The playbook's published figures (its `paper` section) beside ours: per figure, the
    mean of its metric over the done conditions whose swept values match its `where`, the
    ratio, and the reason for a gap over PAPER_GAP (or a note that one is missing)."""
    headers = ["figure", "metric", "paper", "ours", "ours / paper", "why they differ"]
    rows: list[list[str]] = []
    done = df[df["status"] == "done"] if "status" in df else df
    for fig in (paper or {}).get("figures") or []:
        match = done
        for key, value in (fig.get("where") or {}).items():
            col = f"sweep.{key}"
            match = match[match[col].astype(str) == str(value)] if col in match else match.iloc[0:0]
        metric = fig["metric"]
        values = match[metric].dropna() if metric in match else pd.Series(dtype=float)
        ours = float(values.mean()) if len(values) else None
        ratio = ours / fig["value"] if ours is not None and fig["value"] else None
        gap = ratio is not None and abs(ratio - 1) > PAPER_GAP
        why = fig.get("why") or ("(no reason given)" if gap else "")
        rows.append([
            fig["label"], metric, f"{fig['value']:g}", "-" if ours is None else f"{ours:.3g}",
            "-" if ratio is None else f"{ratio:.2f}", why if gap or fig.get("why") else "",
        ])  # fmt: skip
    return headers, rows


def condition_frame(store: RunStore) -> pd.DataFrame:
    """One row per condition, from the journal."""
    return pd.DataFrame([flatten(e) for e in store.journal()])


def write_condition_table(store: RunStore) -> Path:
    """(Re)write `conditions.parquet` (schema of `ConditionRecord`) from the journal."""
    path = store.root / "conditions.parquet"
    write_parquet(typed_table("conditions", condition_frame(store)), path)
    return path


def summary_rows(
    df: pd.DataFrame, columns: Sequence[tuple[str, str, str]] = SUMMARY_COLUMNS
) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the printed summary (or of other columns given)."""
    cols = [c for c in columns if c[0] in df.columns]
    rows = []
    for _, r in df.iterrows():
        cells = []
        for key, _, fmt in cols:
            v = r[key]
            cells.append(
                "-" if v is None or (isinstance(v, float) and pd.isna(v)) else fmt.format(v)
            )
        rows.append(cells)
    return [c[1] for c in cols], rows


def print_summary(df: pd.DataFrame, title: str) -> None:
    """A rich table per condition; failed conditions show their reason below."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=TERMINAL_WIDTH)
    swept = [c for c in df.columns if c.startswith("sweep.")]
    shown = df.assign(status=[shown_status(r) for r in df.to_dict("records")])
    if swept:  # the condition column shows the swept values under their keys
        shown = shown.assign(label=[", ".join(str(v) for v in row) for row in df[swept].values])
    present = [c for c in TERMINAL_COLUMNS if c[0] in shown and shown[c[0]].notna().any()]
    headers, rows = summary_rows(shown, present)
    if swept:
        headers[0] = ", ".join(c.removeprefix("sweep.") for c in swept)
    table = Table(title=title, collapse_padding=True, pad_edge=False)
    for i, h in enumerate(headers):
        left = i == 0 or h in ("status", "backend")
        table.add_column(
            h, justify="left" if left else "right", no_wrap=i == 0,
            max_width=None if left else 10,
        )  # fmt: skip
    for cells in rows:
        table.add_row(*cells)
    console.print(table)
    for header, note in SUMMARY_NOTES.items():
        if header in headers:
            console.print(f"[dim]{note}[/dim]")
    points = compare_policies(df)
    if points:
        headers, rows = comparison_rows(points)
        table = Table(title="BALANCE: users in time per policy (mean over repetitions)")
        for i, h in enumerate(headers):
            table.add_column(h, justify="left" if i == 0 else "right")
        for cells in rows:
            table.add_row(*cells)
        console.print(table)
        console.print(f"[dim]{COMPARISON_NOTE}[/dim]")
    for line in mark_lines(df):
        console.print(f"[yellow]{line}[/yellow]")
    if "reason" in df.columns:
        for _, r in df[df["status"] != "done"].iterrows():
            console.print(f"[red]{r['condition']} {r['status']}:[/red] {r['reason']}")
    console.print("[dim]the full table: testbed report RUN (report.md) and the dashboard[/dim]")


def describe_condition(entry: dict[str, Any]) -> str:
    """One line for the console after a condition."""
    m = entry.get("metrics") or {}
    s = (entry.get("link") or {}).get("summary") or {}
    parts = [entry["condition"], entry["status"]]
    if s.get("rtt_measured_ms") is not None:
        parts.append(f"rtt {s['rtt_measured_ms']:.2f} ms")
    if s.get("loss_measured") is not None:
        parts.append(f"loss {s['loss_measured']:.3f}")
    if m.get("system_tok_s") is not None:
        parts.append(
            f"verified {m['system_verified_tok_s']:.1f} + unverified "
            f"{m['system_unverified_tok_s']:.1f} tok/s"
        )
    if entry.get("reason"):
        parts.append(entry["reason"].splitlines()[0])
    return json.dumps(parts)[1:-1].replace('"', "")
