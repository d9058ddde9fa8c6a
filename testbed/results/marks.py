"""What a finished condition's figures are worth: the marks its status carries.

A `done` condition can still not stand for what it claims: its hosts computed slower than the
hardware they stand for on more than 1 % of their forwards (`unfaithful`), or its measured
per-token acceptance is further than 0.05 from the stood-for pair's published one
(`acceptance unmatched`). The terminal table, `testbed report` and the dashboard show the
status through `shown_status`, and the notes below their tables through `mark_lines`, so the
same figure reads the same everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from testbed.metrics.acceptance_match import MAX_ACCEPTANCE_GAP
from testbed.metrics.condition_stats import MAX_BEHIND_SHARE


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if pd.isna(number) else number


def _is(value: Any, truth: bool) -> bool:
    return (
        value is not None
        and not (isinstance(value, float) and pd.isna(value))
        and (bool(value) is truth)
    )


def condition_marks(row: Mapping[str, Any]) -> list[str]:
    """The short marks of one condition row (journal columns and metrics)."""
    marks: list[str] = []
    if _is(row.get("compute_faithful"), False):
        share = _number(row.get("behind_share"))
        marks.append("unfaithful" + ("" if share is None else f" {share:.1%} behind"))
    if _is(row.get("acceptance_unmatched"), True):
        got, want = _number(row.get("acceptance_alpha")), _number(row.get("acceptance_as"))
        figures = "" if got is None or want is None else f" {got:.2f} vs {want:.2f}"
        marks.append("acceptance unmatched" + figures)
    return marks


FINISHED = ("done", "faulted")
"""Statuses whose figures are kept and shown: `faulted` is a condition during which an agent
stopped before the runner stopped it (testbed.runner.watch); its figures are not SLED's."""


def status_counts(df: pd.DataFrame) -> str:
    """`5 done, 1 faulted, 0 failed` (faulted only where there is one)."""
    status = df["status"] if not df.empty and "status" in df else pd.Series(dtype=str)
    faulted = int((status == "faulted").sum())
    failed = int((~status.isin(FINISHED)).sum())
    return (f"{int((status == 'done').sum())} done, "
            + (f"{faulted} faulted, " if faulted else "") + f"{failed} failed")  # fmt: skip


def shown_status(row: Mapping[str, Any]) -> str:
    """The status as every table shows it: `done`, or `done, unfaithful 2.8% behind`, ..."""
    return ", ".join([str(row.get("status") or "done"), *condition_marks(row)])


def mark_lines(df: pd.DataFrame) -> list[str]:
    """One sentence per mark of a done condition, for the notes under a run's tables."""
    if df.empty or "status" not in df:
        return []
    lines: list[str] = []
    for r in df[df["status"] == "done"].to_dict("records"):
        if _is(r.get("compute_faithful"), False):
            lines.append(
                f"{r['condition']} is unfaithful: {r['behind_forwards']:.0f} of "
                f"{r['paced_forwards']:.0f} forwards ({r['behind_share']:.1%} behind) took "
                f"longer than the hardware they stand for (limit {MAX_BEHIND_SHARE:.0%}); raise "
                "lab.time_dilation"
            )
        if _is(r.get("acceptance_unmatched"), True):
            lines.append(
                f"{r['condition']} has its acceptance unmatched: {r['acceptance_alpha']:.2f} "
                f"measured against {r['acceptance_as']:.2f} published for the pair it stands "
                f"for ({r.get('acceptance_as_source') or 'workload catalogue'}); limit "
                f"{MAX_ACCEPTANCE_GAP:.2f}, "
                "set models.draft_grade (or auto) to a draft nearer it"
            )
    return lines
