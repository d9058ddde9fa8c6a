"""`testbed report RUN`: every figure as PNG and SVG plus `report.md`, written into the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from testbed.report.charts import Chart, Skipped
from testbed.report.data import RunData
from testbed.report.figures import all_figures
from testbed.report.plots import save_chart
from testbed.report.summary import summary_markdown

REPORT_DIR = "report"


@dataclass
class ReportFiles:
    """What a report wrote, and which figures it left out."""

    summary: Path
    figures: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def write_report(run: RunData) -> ReportFiles:
    """Write <run>/report/: one PNG and one SVG per figure, and report.md."""
    folder = run.root / REPORT_DIR
    folder.mkdir(exist_ok=True)
    figures = all_figures(run)
    out = ReportFiles(folder / "report.md")
    for fig in figures:
        if isinstance(fig, Chart):
            out.figures += save_chart(fig, folder)
        else:
            out.skipped.append(fig)
    out.summary.write_text(summary_markdown(run, figures), encoding="utf-8")
    return out
