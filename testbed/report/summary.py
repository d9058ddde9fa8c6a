"""The Markdown summary of a run: what ran, the headline figures per condition, the figures
(and the ones left out, with why)."""

from __future__ import annotations

import pandas as pd

from testbed.report.charts import Chart, Skipped
from testbed.report.crossover import CROSSOVER_NOTE, crossover_rows, crossovers
from testbed.report.data import RunData
from testbed.results.condition_table import (
    SUMMARY_COLUMNS,
    SUMMARY_NOTES,
    paper_rows,
    summary_rows,
)
from testbed.results.marks import mark_lines, shown_status, status_counts
from testbed.results.policy_comparison import COMPARISON_NOTE, compare_policies, comparison_rows

# (column of RunData.metric_rows, header, format): the terminal summary's columns of a finished
# condition, and its latency percentiles
HEADLINE = (
    *SUMMARY_COLUMNS,
    ("e2e_p50_ms", "e2e p50 ms", "{:.0f}"),
    ("e2e_p99_ms", "e2e p99 ms", "{:.0f}"),
)


SIMULATED = "**simulated** by the twin (`testbed simulate`), not measured on a lab"


def headline_cells(rows: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells of the headline table (columns the rows lack are left out),
    the status with its marks (`shown_status`)."""
    if not rows.empty:
        rows = rows.assign(status=[shown_status(r) for r in rows.to_dict("records")])
    return summary_rows(rows, HEADLINE)


def markdown_table(headers: list[str], cells: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in cells]


def summary_markdown(run: RunData, figures: list[Chart | Skipped]) -> str:
    m = run.manifest
    pb = m.get("playbook") or {}
    commit = (m.get("git") or {}).get("commit", "?")
    lines = [
        f"# Run {run.name}",
        "",
        f"{pb.get('description') or pb.get('name', '')}",
        "",
        f"- created {m.get('created', '?')}, commit `{str(commit)[:12]}`",
        f"- lab: {(m.get('lab') or {}).get('kind', '?')}, "
        f"{(m.get('lab') or {}).get('devices', '?')} devices",
    ]
    if m.get("simulated"):
        lines.append(f"- {SIMULATED}")
    df = run.conditions
    if df.empty:
        return "\n".join([*lines, "", "No condition has finished."]) + "\n"
    unfinished = df[df["status"] != "done"]
    lines.append(f"- conditions: {status_counts(df)}")
    lines += ["", "## Conditions", ""]
    if not run.finished.empty:
        lines += markdown_table(*headline_cells(run.metric_rows()))
    else:
        lines.append("(none finished)")
    for row in unfinished.to_dict("records"):
        reason = str(row["reason"] or "").splitlines()[:1]
        lines.append(f"\n- `{row['condition']}` {row['status']}: {''.join(reason)}")
    for line in mark_lines(run.metric_rows()):
        lines.append(f"\n- {line}")
    paper = (pb or {}).get("paper")
    if paper:
        lines += ["", "## Against the paper", "", f"Source: {paper.get('source', '')}", ""]
        lines += markdown_table(*paper_rows(df, paper))
    crossed = crossovers(run.done)
    if crossed:
        lines += ["", "## Where SLED wins", ""]
        lines += [*markdown_table(*crossover_rows(crossed)), "", CROSSOVER_NOTE]
    points = compare_policies(df)
    if points:
        lines += ["", "## BALANCE: the hybrid against the better single mode", ""]
        lines += [*markdown_table(*comparison_rows(points)), "", COMPARISON_NOTE]
    lines += [
        "",
        *(f"- {note}" for note in SUMMARY_NOTES.values()),
        "- Loss is per direction: a round trip survives with (1-p)^2.",
        "",
        "## Figures",
        "",
    ]
    for fig in figures:
        if isinstance(fig, Chart):
            lines += [f"### {fig.title}", "", f"![{fig.title}]({fig.key}.svg)", ""]
            if fig.note:
                lines += [f"_{fig.note}_", ""]
    skipped = [f for f in figures if isinstance(f, Skipped)]
    if skipped:
        lines += ["## Figures left out", ""]
        lines += [f"- {f.title}: {f.reason}" for f in skipped]
    return "\n".join(lines) + "\n"
