"""Self-contained HTML dashboards: one page per run, and an index over a results folder with
each metric's history and regressions flagged. Pages open from disk: the chart renderer
(`dashboard.js`) and the data are inlined, nothing is fetched."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from testbed.report.capacity_searches import HEADERS as CAPACITY_HEADERS
from testbed.report.capacity_searches import capacity_rows, capacity_searches
from testbed.report.charts import Chart, Series, Skipped
from testbed.report.compare import Tolerances, Verdict, compare_runs
from testbed.report.crossover import CROSSOVER_NOTE, crossover_rows, crossovers
from testbed.report.data import RunData
from testbed.report.figures import all_figures
from testbed.report.summary import headline_cells
from testbed.results.condition_table import SUMMARY_NOTES, paper_rows
from testbed.results.marks import mark_lines, status_counts
from testbed.results.policy_comparison import COMPARISON_NOTE, compare_policies, comparison_rows

RUN_PAGE = "dashboard.html"
INDEX_PAGE = "index.html"
SCRIPT = Path(__file__).with_name("dashboard.js")
# drawn in the index's history first, besides the metrics the tolerances judge
HISTORY_EXTRA = ("system_verified_tok_s", "system_tok_s")

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;
padding:0 16px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(480px,1fr));gap:18px}
figure{margin:0;border:1px solid #e4e4e4;border-radius:6px;padding:8px}
figcaption{font-weight:600}.note{color:#666;font-size:12px}
svg.chart{width:100%;height:auto}.grid{stroke:#eee}.axis{stroke:#999}
.tick{font-size:10px;fill:#555}.label{font-size:11px;fill:#333}
.legend span{display:inline-block;border-left:12px solid;padding:0 10px 0 4px;font-size:12px}
.bad{color:#b00020;font-weight:600}.ok{color:#2e7d32}
"""


def _page(title: str, body: str, charts: list[Chart]) -> str:
    """A whole page: style, body, the charts' data and the inlined renderer."""
    data = json.dumps([c.as_json() for c in charts]).replace("</", "<\\/")
    script = SCRIPT.read_text(encoding="utf-8")
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n{body}\n"
        f"<script type='application/json' id='charts'>{data}</script>\n"
        f"<script>{script}</script>\n</body></html>\n"
    )


def _figure(chart: Chart) -> str:
    note = f"<div class='note'>{html.escape(chart.note)}</div>" if chart.note else ""
    return (
        f"<figure id='chart-{chart.key}' data-title='{html.escape(chart.title)}'>"
        f"<figcaption>{html.escape(chart.title)}</figcaption>{note}</figure>"
    )


def html_table(headers: list[str], cells: list[list[str]], table_id: str) -> str:
    """Headers and cells as an HTML table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells
    )
    return f"<table id='{table_id}'><tr>{head}</tr>{body}</table>"


def headline_table(rows: pd.DataFrame) -> str:
    """The per-condition headline figures as an HTML table (the columns of report.md)."""
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in SUMMARY_NOTES.values())
    table = html_table(*headline_cells(rows), table_id="conditions")
    return f"{table}<ul class='note'>{notes}</ul>"


def run_page(run: RunData) -> str:
    """The dashboard of one run."""
    m = run.manifest
    figures = all_figures(run)
    charts = [f for f in figures if isinstance(f, Chart)]
    skipped = [f for f in figures if isinstance(f, Skipped)]
    df = run.conditions
    unfinished = df[df["status"] != "done"] if not df.empty else df
    finished = not run.finished.empty
    parts = [
        f"<h1>Run {html.escape(run.name)}</h1>",
        f"<p>{html.escape(str((m.get('playbook') or {}).get('description', '')))}</p>",
        f"<p>created {html.escape(str(m.get('created', '?')))}, commit "
        f"<code>{html.escape(str((m.get('git') or {}).get('commit'))[:12])}</code>, "
        f"conditions: {status_counts(df)}</p>",
        *(
            [
                "<p class='bad simulated'>simulated by the twin (testbed simulate), not measured "
                "on a lab</p>"
            ]
            if m.get("simulated")
            else []
        ),
        "<h2>Conditions</h2>",
        headline_table(run.metric_rows()) if finished else "<p>none finished</p>",
    ]
    parts += [
        f"<p class='bad {html.escape(r['status'])}'>{html.escape(r['condition'])} "
        f"{html.escape(r['status'])}: "
        f"{html.escape(str(r['reason']).splitlines()[0] if r['reason'] else '')}</p>"
        for r in unfinished.to_dict("records")
    ]
    marked = mark_lines(run.metric_rows()) if finished else []
    parts += [f"<p class='bad marked'>{html.escape(line)}</p>" for line in marked]
    paper = (m.get("playbook") or {}).get("paper")
    if paper:
        parts += [
            "<h2>Against the paper</h2>",
            f"<p>{html.escape(str(paper.get('source', '')))}</p>",
            html_table(*paper_rows(df, paper), table_id="paper"),
        ]
    crossed = crossovers(run.done)
    if crossed:
        parts += [
            "<h2>Where SLED wins</h2>",
            html_table(*crossover_rows(crossed), table_id="crossover"),
            f"<p class='note'>{html.escape(CROSSOVER_NOTE)}</p>",
        ]
    points = compare_policies(df)
    if points:
        parts += [
            "<h2>BALANCE: the hybrid against the better single mode</h2>",
            html_table(*comparison_rows(points), table_id="policies"),
            f"<p class='note'>{html.escape(COMPARISON_NOTE)}</p>",
        ]
    parts += ["<h2>Figures</h2>", "<div class='charts'>", *map(_figure, charts), "</div>"]
    if skipped:
        parts.append("<h2>Figures left out</h2><ul id='skipped'>")
        parts += [f"<li>{html.escape(s.title)}: {html.escape(s.reason)}</li>" for s in skipped]
        parts.append("</ul>")
    return _page(f"run {run.name}", "\n".join(parts), charts)


@dataclass
class RunEntry:
    """A run in the index, with its verdicts against the previous run of its playbook."""

    run: RunData
    baseline: RunData | None
    verdicts: list[Verdict]

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.regressed]


def index_entries(runs: list[RunData], tolerances: Tolerances) -> list[RunEntry]:
    """Each run (oldest first) judged against the previous run of the same playbook."""
    last: dict[str, RunData] = {}
    out = []
    for run in runs:
        name = str((run.manifest.get("playbook") or {}).get("name", run.name))
        base = last.get(name)
        verdicts = compare_runs(base, run, tolerances) if base is not None else []
        out.append(RunEntry(run, base, verdicts))
        if not run.done.empty:
            last[name] = run
    return out


def history_charts(entries: list[RunEntry], metrics: list[str]) -> list[Chart]:
    """One chart per metric: its value per condition label over the runs (x = run number),
    and a `regression` series marking each value flagged against its baseline."""
    frames = []
    for i, entry in enumerate(entries):
        run = entry.run
        rows = run.metric_rows()
        rows = rows[rows["status"] == "done"] if not rows.empty else rows
        if rows.empty:
            continue
        name = str((run.manifest.get("playbook") or {}).get("name", ""))
        rows["series"] = name + ": " + rows["label"].astype(str)
        rows["run_no"] = i + 1
        flagged = {(v.condition, v.metric) for v in entry.regressions}
        rows["flagged"] = [{m for c, m in flagged if c == label} for label in rows["label"]]
        frames.append(rows)
    if not frames:
        return []
    all_rows = pd.concat(frames, ignore_index=True)
    charts = []
    for metric in metrics:
        label = metric.replace("_tok_s", " tok/s").replace("_ms", " (ms)").replace("_", " ")
        if metric not in all_rows or all_rows[metric].isna().all():
            continue
        series = [
            Series(str(s), list(map(float, part["run_no"])), [
                None if pd.isna(v) else float(v) for v in part[metric]
            ])
            for s, part in all_rows.groupby("series")
        ]  # fmt: skip
        bad = all_rows[[metric in f for f in all_rows["flagged"]]]
        if not bad.empty:
            series.append(
                Series("regression", list(map(float, bad["run_no"])), list(bad[metric]), "points")
            )
        charts.append(Chart(f"history-{metric}", label, "run (oldest first)", label, series))
    return charts


def index_page(
    entries: list[RunEntry], metrics: list[str], searches: list[dict] | None = None
) -> str:
    """The page over every run of a results folder, with the history of `metrics` and the
    folder's capacity searches."""
    rows = []
    for n, e in enumerate(entries, start=1):
        df = e.run.conditions
        done = int((df["status"] == "done").sum()) if not df.empty else 0
        if e.baseline is None:
            verdict = "<span>first of its playbook</span>"
        elif e.regressions:
            items = "; ".join(f"{v.condition} {v.metric} ({v.why})" for v in e.regressions[:5])
            verdict = (
                f"<span class='bad'>{len(e.regressions)} regression(s) against "
                f"{html.escape(e.baseline.name)}: {html.escape(items)}</span>"
            )
        else:
            verdict = f"<span class='ok'>within tolerance of {html.escape(e.baseline.name)}</span>"
        rows.append(
            f"<tr data-run='{html.escape(e.run.name)}' data-regressions='{len(e.regressions)}'>"
            f"<td>{n}</td><td><a href='{html.escape(e.run.name)}/{RUN_PAGE}'>"
            f"{html.escape(e.run.name)}</a></td>"
            f"<td>{html.escape(str(e.run.manifest.get('created', '')))}</td>"
            f"<td>{done}/{len(df)}</td><td style='text-align:left'>{verdict}</td></tr>"
        )
    charts = history_charts(entries, metrics)
    body = "\n".join(
        [
            "<h1>Testbed runs</h1>",
            "<table id='runs'><tr><th>#</th><th>run</th><th>created</th><th>done</th>"
            "<th>against the previous run of its playbook</th></tr>",
            *rows,
            "</table>",
            *(
                [
                    "<h2>Capacity searches</h2>",
                    html_table(CAPACITY_HEADERS, capacity_rows(searches), table_id="capacity"),
                ]
                if searches
                else []
            ),
            "<h2>History</h2><div class='charts'>",
            *map(_figure, charts),
            "</div>",
        ]
    )
    return _page("testbed runs", body, charts)


def write_run_page(run: RunData) -> Path:
    path = run.root / RUN_PAGE
    path.write_text(run_page(run), encoding="utf-8")
    return path


def write_index(results: Path, runs: list[RunData], tolerances: Tolerances) -> Path:
    """results/index.html: every run judged against the previous one of its playbook, and the
    history of every metric the tolerances judge (plus the system throughputs)."""
    metrics = [*HISTORY_EXTRA, *(m for m in tolerances.metrics if m not in HISTORY_EXTRA)]
    path = Path(results) / INDEX_PAGE
    page = index_page(index_entries(runs, tolerances), metrics, capacity_searches(results))
    path.write_text(page, encoding="utf-8")
    return path
