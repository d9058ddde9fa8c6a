"""BALANCE runs with repetitions: policies compared in pairs per sweep point, and the figure's
mean and interval over repetitions (hand-built numbers, no lab)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed.report.charts import Chart
from testbed.report.data import RunData
from testbed.report.figures import balance_throughput_by_policy
from testbed.report.summary import summary_markdown
from testbed.results.policy_comparison import compare_policies, comparison_rows

# users in time per (memory, repetition, policy): at 18.65 GB the better single mode changes
# between repetitions (AD in 0 and 2, SD in 1); at 7 MiB the hybrid loses one in repetition 2
IN_TIME = {
    (18.65, 0): {"ad-only": 20, "sd-only": 18, "hybrid": 23},
    (18.65, 1): {"ad-only": 17, "sd-only": 21, "hybrid": 23},
    (18.65, 2): {"ad-only": 21, "sd-only": 19, "hybrid": 24},
    (40.0, 0): {"ad-only": 20, "sd-only": 30, "hybrid": 30},
    (40.0, 1): {"ad-only": 19, "sd-only": 31, "hybrid": 31},
    (40.0, 2): {"ad-only": 20, "sd-only": 30, "hybrid": 29},
}


def _frame() -> pd.DataFrame:
    rows = []
    for (gb, rep), counts in IN_TIME.items():
        for policy, n in counts.items():
            sd_full = policy == "sd-only" and gb < 20  # SD-only filled the tight budget only
            rows.append(
                {
                    "status": "done", "sweep.balance.memory_gb": gb,
                    "sweep.balance.policy": policy, "sweep.repetition": rep,
                    "served_in_time": n, "policy": policy, "memory_budget_gb": gb,
                    "users": 40, "task_throughput": n / 10.0,
                    "ttft_p90_ms": {"ad-only": 200.0, "sd-only": 120.0, "hybrid": 150.0}[policy]
                    + rep, "tpot_p90_ms": 40.0, "peak_held_gb": 18.6 if sd_full else 16.2,
                    "peak_reserved_gb": 18.64 if sd_full else 16.3,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_hybrid_is_compared_with_the_better_single_mode_of_each_repetition():
    tight, loose = compare_policies(_frame())
    assert tight.point == {"balance.memory_gb": 18.65} and loose.point == {"balance.memory_gb": 40}
    assert tight.in_time == pytest.approx({"ad-only": 58 / 3, "sd-only": 58 / 3, "hybrid": 70 / 3})
    # per repetition: 23 - 20, 23 - 21, 24 - 21 (not 23 - 58/3: the pairs share their users)
    assert tight.margin.mean == pytest.approx(8 / 3) and tight.margin.n == 3
    assert tight.margin.low > 0 and tight.verdict == "above"
    assert loose.margin.mean == pytest.approx(-1 / 3) and loose.verdict == "below"
    assert loose.margin.low < 0 < loose.margin.high  # one lost user in three is within noise
    # memory binds where SD-only reserved its budget: the goal there is strictly above
    assert tight.binds is True and tight.goal_met is True
    assert loose.binds is False and loose.goal_met is False  # below on average, not bound
    assert tight.ttft_p90_ms == pytest.approx({"ad-only": 201, "sd-only": 121, "hybrid": 151})
    assert tight.peak_gb["sd-only"] == pytest.approx(18.6) and tight.budget_gb == 18.65
    headers, rows = comparison_rows([tight, loose])
    cells = dict(zip(headers, rows[1], strict=True))
    assert cells["point"] == "balance.memory_gb=40.0" and cells["hybrid is"] == "below"
    assert cells["hybrid - better (95 % CI)"].startswith("-0.3 [")
    assert cells["memory binds"] == "no" and cells["goal"] == "missed"
    first = dict(zip(headers, rows[0], strict=True))
    assert first["TTFT p90 ms AD / SD / hyb"] == "201 / 121 / 151"


def test_a_repetition_with_a_failed_policy_is_left_out_of_its_points_pairs():
    df = _frame()
    failed = (df["sweep.repetition"] == 2) & (df["sweep.balance.policy"] == "sd-only")
    df.loc[failed, "status"] = "failed"
    df.loc[failed, "served_in_time"] = None
    tight, loose = compare_policies(df)
    assert tight.margin.n == loose.margin.n == 2
    assert loose.margin.mean == 0 and loose.verdict == "equal"


def test_no_comparison_unless_all_three_policies_are_swept():
    df = _frame()
    assert compare_policies(df[df["sweep.balance.policy"] != "ad-only"]) == []
    assert compare_policies(df.drop(columns=["sweep.balance.policy"])) == []


def test_figure_draws_the_mean_over_repetitions_with_its_interval(tmp_path: Path):
    root = tmp_path / "bal-20260101-000000"
    (root / "conditions").mkdir(parents=True)
    manifest = {"run_id": root.name, "playbook": {"name": "bal", "mode": "balance"}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    for i, row in enumerate(_frame().to_dict("records")):
        values = {k.removeprefix("sweep."): row[k] for k in row if k.startswith("sweep.")}
        metrics = {k: row[k] for k in ("policy", "memory_budget_gb", "users", "task_throughput")}
        metrics["served_in_time"] = row["served_in_time"]
        lines.append(
            {"condition": f"c{i:02d}", "index": i, "values": values, "status": "done",
             "metrics": metrics}
        )  # fmt: skip
    (root / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    chart = balance_throughput_by_policy(RunData(root))
    assert isinstance(chart, Chart)
    hybrid = {s.name: s for s in chart.series}["hybrid, 18.65 GB"]
    assert hybrid.x == [40.0] and hybrid.y == [pytest.approx(7 / 3)]  # (23 + 23 + 24) / 30
    assert hybrid.low[0] < 7 / 3 < hybrid.high[0]
    assert len(chart.series) == 6
    text = summary_markdown(RunData(root), [chart])
    table = text.split("## BALANCE: the hybrid against the better single mode")[1]
    assert "| balance.memory_gb=40.0 | 19.7 | 30.3 | 30.0 | 3 | -0.3 [" in table
    assert table.count("| above |") == 1 and table.count("| below |") == 1
