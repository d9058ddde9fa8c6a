"""The HTML dashboards, opened in real headless chromium (Debian's `chromium` package): they
load from disk with no console message, the charts' DOM holds the run's numbers, and a
screenshot of each is kept under results/test-artifacts/ (or $TESTBED_ARTIFACTS)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from conftest import require_root_netns
from test_report_runs import REPO, real_runs, run_testbed, synthetic_run

from testbed.report.charts import Chart
from testbed.report.compare import load_tolerances
from testbed.report.dashboard import write_index, write_run_page
from testbed.report.data import load_run, run_folders
from testbed.report.figures import all_figures

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(os.environ.get("TESTBED_ARTIFACTS", REPO / "results" / "test-artifacts"))
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]? ?(.*)")


def need_chromium() -> str:
    """The chromium binary; a missing one fails under CI (TESTBED_REQUIRE_ROOT_TESTS=1)."""
    if CHROMIUM:
        return CHROMIUM
    reason = "chromium is not installed (make system-packages installs it)"
    if os.environ.get("TESTBED_REQUIRE_ROOT_TESTS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless chromium on a file URL, with the page's console messages logged to stderr."""
    return subprocess.run(
        [need_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", *args, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def open_page(page: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(DOM after the scripts ran, console messages) of a page; optionally a screenshot."""
    proc = chromium(page, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [m.group(1) for m in CONSOLE.finditer(proc.stderr)]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        shot = chromium(page, f"--screenshot={screenshot}", "--window-size=1200,2400")
        assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    return proc.stdout, console


class Points(HTMLParser):
    """chart key -> series name -> [(x, y)] of the drawn points; ref lines; figures."""

    def __init__(self) -> None:
        super().__init__()
        self.chart: str | None = None
        self.series: str | None = None
        self.points: dict[str, dict[str, list[tuple[float, float]]]] = {}
        self.refs: dict[str, dict[str, float]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure" and (a.get("id") or "").startswith("chart-"):
            self.chart = a["id"].removeprefix("chart-")
        elif tag == "g" and a.get("data-series") is not None and self.chart:
            self.series = a["data-series"]
        elif tag == "circle" and self.chart and self.series and "data-y" in a:
            pts = self.points.setdefault(self.chart, {}).setdefault(self.series, [])
            pts.append((float(a["data-x"]), float(a["data-y"])))
        elif tag == "line" and self.chart and a.get("data-ref"):
            self.refs.setdefault(self.chart, {})[a["data-ref"]] = float(a["data-y"])


def flat(points: list[tuple[float, float]]) -> list[float]:
    return [v for point in points for v in point]


def drawn(dom: str) -> Points:
    parser = Points()
    parser.feed(dom)
    return parser


def test_run_page_is_self_contained(tmp_path):
    page = write_run_page(load_run(synthetic_run(tmp_path)))
    text = page.read_text()
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", text)  # nothing fetched
    assert "<script>" in text and "function draw" in text  # the renderer is inlined


def test_console_check_catches_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><body><script>undefinedFunction();</script></body>")
    _, console = open_page(bad)
    assert any("undefinedFunction" in m for m in console), console


def test_run_dashboard_in_chromium_holds_every_charts_numbers(tmp_path):
    run = load_run(synthetic_run(tmp_path))
    page = write_run_page(run)
    dom, console = open_page(page, ARTIFACTS / "dashboard-synthetic.png")
    assert console == []
    got = drawn(dom)
    charts = [f for f in all_figures(run) if isinstance(f, Chart)]
    assert set(got.points) == {c.key for c in charts}
    for chart in charts:
        for s in chart.series:
            want = [(x, y) for x, y in zip(s.x, s.y) if y is not None]
            got_xy = flat(got.points[chart.key].get(s.name, []))
            assert got_xy == pytest.approx(flat(want)), (chart.key, s)
        assert got.refs.get(chart.key, {}) == pytest.approx({r.name: r.y for r in chart.refs})
    assert "c03-link.loss=0.5 failed" in dom


def test_index_flags_a_regression_in_chromium(tmp_path):
    a = synthetic_run(tmp_path, "synth-20260101-000000", failed=False)
    b = synthetic_run(tmp_path, "synth-20260102-000000", failed=False)
    (b / "manifest.json").write_text((b / "manifest.json").read_text().replace("01-01", "01-02"))
    # each answer takes 3x as long: device spans 2 s -> 4 s
    for path in b.glob("conditions/*/requests.parquet"):
        df = pd.read_parquet(path)
        df["t_end"] = df["t_start"] + 3 * (df["t_end"] - df["t_start"])
        df.to_parquet(path)
    runs = run_folders(tmp_path)
    assert [r.root for r in runs] == [a, b]
    for run in runs:
        write_run_page(run)
    index = write_index(tmp_path, runs, load_tolerances())
    dom, console = open_page(index, ARTIFACTS / "index-synthetic.png")
    assert console == []
    assert re.search(r"data-run=\"synth-20260102-000000\" data-regressions=\"[1-9]", dom)
    assert 'data-run="synth-20260101-000000" data-regressions="0"' in dom
    history = drawn(dom).points["history-system_verified_tok_s"]
    assert flat(history["synth: link.loss=0.0"]) == pytest.approx([1.0, 30.0, 2.0, 15.0])
    # the regressed values of run 2 are marked on the history
    assert (2.0, 15.0) in drawn(dom).points["history-system_verified_tok_s"]["regression"]


@pytest.mark.slow
def test_dashboard_of_a_real_run_shows_its_loss_curves(tmp_path):
    """What `make demo` ends with: `testbed dashboard` prints the page of the last run; the
    page's throughput curve holds the per-device rates computed here from its Parquet."""
    require_root_netns()
    runs = real_runs()
    proc = run_testbed("dashboard", str(runs[-1].parent))
    assert proc.returncode == 0, proc.stderr
    page = Path(re.search(r"^dashboard: (.+)$", proc.stdout, re.M).group(1))
    assert page == runs[-1] / "dashboard.html"
    dom, console = open_page(page, ARTIFACTS / "dashboard-real-run.png")
    assert console == []
    curve = drawn(dom).points["throughput_vs_loss"]["verified tokens/s"]
    want = []
    for cond in sorted((runs[-1] / "conditions").iterdir()):
        req = pd.read_parquet(cond / "requests.parquet")
        per_dev = req.groupby("dev").agg(
            v=("verified_tokens", "sum"), start=("t_start", "min"), end=("t_end", "max")
        )
        hosts = next(cond / n for n in ("hosts.parquet", "agents.parquet") if (cond / n).exists())
        began = pd.read_parquet(hosts).groupby("dev")["t_start"].min()
        start = pd.concat([per_dev["start"], began.reindex(per_dev.index)], axis=1).min(axis=1)
        loss = float(cond.name.split("link.loss=")[1].split("-")[0])
        want.append((100 * loss, float((per_dev["v"] / (per_dev["end"] - start)).mean())))
    assert flat(curve) == pytest.approx(flat(sorted(want)), rel=1e-6)


def test_dashboard_command_writes_every_page_and_names_the_last(tmp_path):
    synthetic_run(tmp_path, "synth-20260101-000000")
    synthetic_run(tmp_path, "synth-20260102-000000")
    (tmp_path / "not-a-run").mkdir()
    proc = run_testbed("dashboard", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"index: {tmp_path / 'index.html'} (2 runs)" in proc.stdout
    assert f"dashboard: {tmp_path / 'synth-20260102-000000' / 'dashboard.html'}" in proc.stdout
    assert (tmp_path / "synth-20260101-000000" / "dashboard.html").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_testbed("dashboard", str(empty)).returncode == 2
