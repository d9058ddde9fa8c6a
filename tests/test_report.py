"""`testbed report`: figures hold the run's numbers, figures without data are left out with a
reason, PNG + SVG + report.md are written; checked on a hand-built run folder."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_report_runs import DEVICES, LOSSES, run_testbed, synthetic_run

from testbed.report.charts import Chart, Skipped
from testbed.report.data import RunData, load_run
from testbed.report.figures import (
    acceptance_over_time,
    accuracy_vs_loss,
    all_figures,
    capacity_vs_devices,
    sled_vs_centralized,
    throughput_vs_loss,
)
from testbed.report.write import write_report


@pytest.fixture
def run(tmp_path) -> RunData:
    return load_run(synthetic_run(tmp_path))


def test_throughput_curve_holds_each_devices_rate(run):
    chart = throughput_vs_loss(run)
    assert isinstance(chart, Chart)
    verified, total = chart.series
    assert verified.x == [100 * p for p in LOSSES]
    rates = [t * 2 / (2 * s) for t, s in DEVICES.values()]  # two requests back to back
    mean = sum(rates) / len(rates)
    assert verified.y[:2] == pytest.approx([mean, mean])
    assert verified.y[2] == pytest.approx(0.0)  # all fallback at 100 % loss
    assert total.y[2] == pytest.approx(mean)
    # a 95 % band around the mean that is wider than the devices' spread (n = 2)
    assert verified.low[0] < min(rates) and verified.high[0] > max(rates)


def test_accuracy_has_target_and_draft_reference_lines(run):
    chart = accuracy_vs_loss(run)
    assert isinstance(chart, Chart)
    refs = {r.name: r.y for r in chart.refs}
    assert refs["target only"] == pytest.approx(1.0)  # the target's answers are all right
    assert refs["draft only"] == pytest.approx(0.5)  # the 100 %-loss condition
    strict = chart.series[0]
    assert strict.y == pytest.approx([0.5, 0.5, 0.5])
    assert strict.low[0] < 0.5 < strict.high[0]


def test_missing_data_is_left_out_with_a_reason(run):
    figures = {f.key: f for f in all_figures(run)}
    assert isinstance(figures["sled_vs_centralized"], Skipped)
    assert "device count" in figures["sled_vs_centralized"].reason
    assert isinstance(figures["acceptance_by_host_class"], Skipped)
    assert "host class" in figures["acceptance_by_host_class"].reason


def test_device_count_sweep_gives_one_curve_per_mode(tmp_path):
    root = synthetic_run(tmp_path, failed=False)
    values = [{"mode": "sled", "lab.devices": 2}, {"mode": "sled", "lab.devices": 4},
              {"mode": "centralized", "lab.devices": 2}]  # fmt: skip
    lines = [json.loads(x) for x in (root / "journal.jsonl").read_text().splitlines()]
    for line, v in zip(lines, values):
        line["values"] = v
    (root / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = load_run(root)
    chart = sled_vs_centralized(run)
    assert isinstance(chart, Chart)
    curves = {s.name: (s.x, s.y) for s in chart.series}
    assert curves["sled"] == ([2.0, 4.0], [30.0, 30.0])  # 60 verified tokens / 2 s
    assert curves["centralized"] == ([2.0], [0.0])  # the third condition is all fallback
    capacity = capacity_vs_devices(run)
    slowest = {s.name: s.y for s in capacity.series}
    assert slowest["sled"] == [10.0, 10.0]  # dev1: 20 tokens in 2 s


def test_a_run_without_a_loss_sweep_has_no_loss_curves(tmp_path):
    root = synthetic_run(tmp_path, failed=False)
    journal = (root / "journal.jsonl").read_text().splitlines()
    (root / "journal.jsonl").write_text(journal[0] + "\n")
    fig = throughput_vs_loss(load_run(root))
    assert isinstance(fig, Skipped) and "loss" in fig.reason


def test_report_writes_png_svg_and_markdown(run):
    files = write_report(run)
    charts = [f for f in all_figures(run) if isinstance(f, Chart)]
    assert sorted(p.name for p in files.figures) == sorted(
        f"{c.key}.{ext}" for c in charts for ext in ("png", "svg")
    )
    for path in files.figures:
        head = path.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if path.suffix == ".png" else b"<?xml" in head
    text = files.summary.read_text()
    assert "c03-link.loss=0.5` failed: agents: server exited early" in text
    for skipped in files.skipped:
        assert f"{skipped.title}: {skipped.reason}" in text
        assert not (files.summary.parent / f"{skipped.key}.png").exists()
    table = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")]
    header, first = table[0], table[1]
    assert first[0] == "| link.loss=0.0"
    assert first[header.index("verified tok/s")] == "30.0"  # 60 verified tokens / 2 s


def test_report_command(tmp_path):
    root = synthetic_run(tmp_path)
    proc = run_testbed("report", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "left out Throughput against device count, per mode" in proc.stdout
    assert (root / "report" / "throughput_vs_loss.svg").is_file()


def test_acceptance_per_host_class_from_the_hosts_table(tmp_path):
    root = synthetic_run(tmp_path, failed=False)
    classes = {"dev1": "pi5", "dev2": "jetson-orin-nano"}
    for folder in (root / "conditions").iterdir():
        hosts = pd.DataFrame(
            {"dev": list(classes), "host_class": list(classes.values()),
             "t_start": [100.0, 100.0], "t_end": [102.0, 102.0]}
        )  # fmt: skip
        hosts.to_parquet(folder / "hosts.parquet")
    chart = acceptance_over_time(load_run(root), by_class=True)
    assert isinstance(chart, Chart)
    curves = {s.name: s.y for s in chart.series}
    assert set(curves) == {"pi5", "jetson-orin-nano"}
    # each class: 12 rounds, 8 verified with 3 of 4 drafts accepted, 4 fallback (100 % loss)
    assert curves["pi5"] == pytest.approx([0.75])


def test_a_run_without_drafts_leaves_the_acceptance_curve_out(tmp_path):
    """A centralized run records one round per token and drafts nothing: no window has an
    acceptance rate, and the figure is left out with its reason rather than failing the report."""
    root = synthetic_run(tmp_path, failed=False)
    for path in (root / "conditions").glob("*/rounds.parquet"):
        rounds = pd.read_parquet(path)
        rounds[["drafted", "accepted"]] = 0
        rounds.to_parquet(path)
    fig = acceptance_over_time(load_run(root))
    assert isinstance(fig, Skipped) and "no verified round" in fig.reason
    assert write_report(load_run(root)).summary.is_file()
