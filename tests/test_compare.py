"""`testbed compare`: catches a run made worse past tolerance, passes runs within it; noisy
metrics are judged on a confidence interval of the difference."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import require_root_netns
from test_report_runs import copy_run, real_runs, run_testbed, synthetic_run

from testbed.core.errors import BadInputError, ExitCode
from testbed.report.compare import (
    Tolerance,
    compare_runs,
    difference_interval,
    judge,
    load_tolerances,
)
from testbed.report.data import load_run


def lower_verified_throughput(run_dir, factor: float = 0.5) -> None:
    """Inject a regression: every answer took 1/factor as long (same tokens)."""
    for path in run_dir.glob("conditions/*/requests.parquet"):
        df = pd.read_parquet(path)
        df["t_end"] = df["t_start"] + (df["t_end"] - df["t_start"]) / factor
        df.to_parquet(path)
    for path in run_dir.glob("conditions/*/hosts.parquet"):
        path.unlink()  # its spans would cap the stretched ones
    for path in run_dir.glob("conditions/*/agents.parquet"):
        path.unlink()


def test_noisy_metric_needs_the_whole_interval_past_the_margin():
    tol = Tolerance(better="higher", noisy=True, rel=0.05)
    base = [10.0, 11.0, 9.0, 10.5, 9.5]
    noisy_same = [9.0, 12.0, 8.5, 11.0, 9.0]  # mean 9.9: a small dip, inside the noise
    dropped = [x * 0.6 for x in base]
    assert not judge("m", tol, 10.0, 9.9, (base, noisy_same), 0.95)[0]
    assert judge("m", tol, 10.0, 6.0, (base, dropped), 0.95)[0]
    # the same drop in the good direction is no regression
    assert not judge("m", tol, 6.0, 10.0, (dropped, base), 0.95)[0]


def test_fixed_tolerance_respects_direction():
    lower = Tolerance(better="lower", rel=0.1, abs=5)
    assert judge("lat", lower, 100.0, 120.0, None, 0.95)[0]  # 20 > max(5, 10)
    assert not judge("lat", lower, 100.0, 108.0, None, 0.95)[0]
    assert not judge("lat", lower, 100.0, 50.0, None, 0.95)[0]


def test_difference_interval_covers_the_true_difference():
    lo, hi = difference_interval([1.0, 2.0, 3.0], [2.0, 3.0, 4.0], 0.95)
    assert lo < 1.0 < hi


def test_tolerance_file_overrides_defaults_and_bad_files_name_the_key(tmp_path):
    good = tmp_path / "tol.yaml"
    good.write_text("metrics:\n  acceptance_rate: {better: higher, abs: 0.2}\n")
    tol = load_tolerances(good)
    assert tol.metrics["acceptance_rate"].abs == 0.2
    assert "device_verified_tok_s_mean" in tol.metrics  # defaults kept
    bad = tmp_path / "bad.yaml"
    bad.write_text("metrics:\n  acceptance_rate: {better: sideways}\n")
    with pytest.raises(BadInputError, match=r"bad\.yaml.*acceptance_rate"):
        load_tolerances(bad)


def test_injected_regression_is_caught_and_a_copy_passes(tmp_path):
    a = synthetic_run(tmp_path, "a", failed=False)
    same = copy_run(a, tmp_path, "same")
    worse = copy_run(a, tmp_path, "worse")
    lower_verified_throughput(worse)
    tol = load_tolerances()
    assert not [v for v in compare_runs(load_run(a), load_run(same), tol) if v.regressed]
    regressed = {v.metric for v in compare_runs(load_run(a), load_run(worse), tol) if v.regressed}
    assert "system_verified_tok_s" in regressed
    proc = run_testbed("compare", str(a), str(worse))
    assert proc.returncode == ExitCode.REGRESSION, proc.stdout + proc.stderr
    assert "REGRESSION" in proc.stdout
    assert run_testbed("compare", str(a), str(same)).returncode == 0


def test_a_condition_failing_in_the_candidate_is_a_regression(tmp_path):
    a = synthetic_run(tmp_path, "a", failed=False)
    b = copy_run(a, tmp_path, "b")
    lines = (b / "journal.jsonl").read_text().splitlines()
    (b / "journal.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    verdicts = compare_runs(load_run(a), load_run(b), load_tolerances())
    assert [v.condition for v in verdicts if v.regressed] == ["link.loss=1.0"]


@pytest.mark.slow
def test_real_runs_of_the_same_code_pass_and_a_slowed_copy_fails(tmp_path):
    require_root_netns()
    first, second = real_runs()
    proc = run_testbed("compare", str(first), str(second))
    assert proc.returncode == 0, proc.stdout
    worse = copy_run(second, tmp_path, "worse")
    lower_verified_throughput(worse)
    proc = run_testbed("compare", str(first), str(worse))
    assert proc.returncode == ExitCode.REGRESSION, proc.stdout
    flagged = [line for line in proc.stdout.splitlines() if "REGRESSION" in line]
    assert any("system_verified_tok_s" in line for line in flagged), proc.stdout


def test_a_condition_faulted_in_the_candidate_is_flagged_with_its_fault(tmp_path):
    """A faulted condition's figures are kept, but compare names the fault as a regression."""
    a = synthetic_run(tmp_path, "a", failed=False)
    b = copy_run(a, tmp_path, "b")
    lines = [json.loads(x) for x in (b / "journal.jsonl").read_text().splitlines()]
    lines[0] |= {"status": "faulted", "reason": "sled-server on server killed by SIGKILL at 4 s"}
    (b / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    verdicts = compare_runs(load_run(a), load_run(b), load_tolerances())
    (flag,) = [v for v in verdicts if v.metric == "status"]
    assert flag.regressed and flag.condition == "link.loss=0.0"
    assert flag.why == "faulted in B: sled-server on server killed by SIGKILL at 4 s"
    proc = run_testbed("compare", str(a), str(b))
    assert proc.returncode == ExitCode.REGRESSION and "faulted in B" in proc.stdout, proc.stdout
