"""Tables and printed summaries of a run, built from its journal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from testbed.results.store import RunStore
from testbed.results.tables import write_parquet

# (column, header, format) of the printed summary
SUMMARY_COLUMNS = [
    ("label", "condition", "{}"),
    ("status", "status", "{}"),
    ("backend", "backend", "{}"),
    ("rtt_measured_ms", "RTT ms", "{:.2f}"),
    ("loss_up_measured", "loss up", "{:.3f}"),
    ("loss_down_measured", "loss down", "{:.3f}"),
    ("system_tok_s", "sys tok/s", "{:.1f}"),
    ("device_tok_s_mean", "dev tok/s", "{:.1f}"),
    ("acceptance_rate", "accept", "{:.2f}"),
    ("fallback_share", "fallback", "{:.2f}"),
    ("strict_accuracy", "acc strict", "{:.2f}"),
    ("flexible_accuracy", "acc flex", "{:.2f}"),
    ("target_match_share", "=target", "{:.2f}"),
]


def flatten(entry: dict[str, Any]) -> dict[str, Any]:
    """One journal entry -> one table row (swept values and metrics as columns)."""
    row: dict[str, Any] = {
        "condition": entry["condition"],
        "index": entry.get("index"),
        "status": entry["status"],
        "reason": entry.get("reason", ""),
        "label": ", ".join(f"{k}={v}" for k, v in entry.get("values", {}).items()) or "base",
    }
    for key, value in entry.get("values", {}).items():
        row[f"sweep.{key}"] = value
    link = entry.get("link") or {}
    row["backend"] = link.get("backend")
    for key, value in (link.get("requested") or {}).items():
        row[f"link_requested.{key}"] = value
    for key, value in (link.get("summary") or {}).items():
        row[key] = value
    row.update(entry.get("metrics") or {})
    return row


def condition_frame(store: RunStore) -> pd.DataFrame:
    """One row per condition, from the journal."""
    return pd.DataFrame([flatten(e) for e in store.journal()])


def write_condition_table(store: RunStore) -> Path:
    """(Re)write `conditions.parquet` from the journal; return its path."""
    path = store.root / "conditions.parquet"
    write_parquet(condition_frame(store), path)
    return path


def summary_rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the printed summary."""
    cols = [c for c in SUMMARY_COLUMNS if c[0] in df.columns]
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

    console = Console(width=max(Console().width, 150))
    headers, rows = summary_rows(df)
    table = Table(title=title)
    for h in headers:
        table.add_column(
            h, justify="right" if h not in ("condition", "status", "backend") else "left"
        )
    for cells in rows:
        table.add_row(*cells)
    console.print(table)
    if "reason" in df.columns:
        for _, r in df[df["status"] != "done"].iterrows():
            console.print(f"[red]{r['condition']} failed:[/red] {r['reason']}")
