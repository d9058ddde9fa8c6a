"""End to end on the emulated lab: `testbed run experiments/smoke.yaml`, resume, dry run.

These bring up real namespaces, sshd per host, the NFQUEUE link emulation and the agents
through Fabric; they need root (CI runs them as root).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import require_root_netns

from testbed.lab.clean import leftovers
from testbed.results.store import RunStore
from testbed.runner.run import execute

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]


def run_dirs(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if (p / "manifest.json").exists())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, tiny_pair):
    """One real run of experiments/smoke.yaml, shared by the assertions below."""
    require_root_netns()
    out = tmp_path_factory.mktemp("results")
    proc = subprocess.run(
        [*TESTBED, "run", str(REPO / "experiments" / "smoke.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = run_dirs(out)
    df = pd.read_parquet(run / "conditions.parquet").set_index("sweep.link.loss")
    return run, df, proc.stdout


def test_one_done_row_per_condition(smoke_run):
    run, df, stdout = smoke_run
    assert sorted(df.index) == [0.0, 0.1, 1.0]
    assert (df["status"] == "done").all(), df[["status", "reason"]]
    assert "results:" in stdout and str(run) in stdout.replace("\n", "")
    journal = RunStore(run).journal()
    assert len(journal) == 3 and len({e["condition"] for e in journal}) == 3


def test_link_measures_as_requested(smoke_run):
    _, df, _ = smoke_run
    for loss in (0.0, 0.1):
        assert abs(df.loc[loss, "rtt_measured_ms"] - 85.0) <= 1.0
    assert df.loc[0.0, "loss_up_measured"] <= 0.02
    assert df.loc[0.0, "loss_down_measured"] <= 0.02
    assert 0.02 <= df.loc[0.1, "loss_up_measured"] <= 0.2
    assert 0.02 <= df.loc[0.1, "loss_down_measured"] <= 0.2
    assert df.loc[1.0, "loss_up_measured"] == 1.0
    assert set(df["backend"]) <= {"nfqueue", "netem"}


def test_verified_answers_equal_target_greedy_at_zero_loss(smoke_run):
    run, df, _ = smoke_run
    row = df.loc[0.0]
    cond = RunStore(run).condition_dir(row["condition"])
    req = pd.read_parquet(cond / "requests.parquet")
    assert len(req) == 6  # 2 devices x 3 problems
    assert (req["verified_tokens"] == req["tokens"]).all()
    assert req["matches_target"].all(), req[["text", "target_text"]]
    assert row["fallback_share"] == 0 and row["acceptance_rate"] > 0


def test_total_loss_completes_on_fallback(smoke_run):
    run, df, _ = smoke_run
    row = df.loc[1.0]
    assert row["fallback_share"] == 1.0
    assert row["system_tok_s"] > 0 and row["tokens"] > 0
    rounds = pd.read_parquet(RunStore(run).condition_dir(row["condition"]) / "rounds.parquet")
    assert (rounds["mode"] == "fallback").all()
    req = pd.read_parquet(RunStore(run).condition_dir(row["condition"]) / "requests.parquet")
    assert len(req) == 6 and (req["fallback_tokens"] == req["tokens"]).all()


def test_manifest_and_tables_are_complete(smoke_run):
    run, df, _ = smoke_run
    manifest = json.loads((run / "manifest.json").read_text())
    for key in ("playbook", "git", "packages", "host", "seeds", "lab", "models"):
        assert key in manifest, key
    assert manifest["playbook"]["name"] == "smoke"
    for cond in df["condition"]:
        folder = RunStore(run).condition_dir(cond)
        for name in ("rounds", "requests", "agents"):
            assert (folder / f"{name}.parquet").exists(), (cond, name)
        link = json.loads((folder / "link.json").read_text())
        assert link["requested"]["rtt_ms"] == 85.0 and link["backend"]
        assert set(link["probes"]) == {"dev1", "dev2"}


def test_lab_is_gone_after_the_run(smoke_run):
    assert leftovers() == []


def test_interrupted_run_resumes_without_loss_or_duplicates(root_netns, tmp_path, tiny_pair):
    playbook = tmp_path / "two.yaml"
    playbook.write_text(
        "name: two\nlab: {devices: 1}\nworkload: {problems_per_device: 1, max_new_tokens: 24}\n"
        "link: {probe_packets: 50}\nsweep:\n  link.loss: [0.0, 1.0]\n"
    )
    out = tmp_path / "results"

    def crash(entry: dict) -> None:
        raise KeyboardInterrupt  # the operator presses Ctrl-C after the first condition

    with pytest.raises(KeyboardInterrupt):
        execute(playbook, out=out, say=lambda _m: None, on_condition=crash)
    (run,) = run_dirs(out)
    assert len(RunStore(run).journal()) == 1
    assert leftovers() == []  # the lab came down on the interrupt

    outcome = execute(None, resume=run, say=lambda _m: None)
    assert (outcome.done, outcome.failed, outcome.skipped) == (1, 0, 1)
    journal = RunStore(run).journal()
    assert [e["status"] for e in journal] == ["done", "done"]
    assert len({e["condition"] for e in journal}) == 2
    assert not list((run / "conditions").glob(".*partial"))
    assert len(pd.read_parquet(run / "conditions.parquet")) == 2
    again = execute(None, resume=run, say=lambda _m: None)
    assert (again.done, again.skipped) == (0, 2)


def test_dry_run_prints_actions_and_changes_nothing(tmp_path):
    proc = subprocess.run(
        [*TESTBED, "run", str(REPO / "experiments" / "smoke.yaml"), "--dry-run",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    for needle in ("ip netns add", "NFQUEUE", "agents.sled.server", "agents.sled.device",
                   "statistic"):  # fmt: skip
        assert needle in text, needle
    assert list(tmp_path.iterdir()) == []
    assert leftovers() == []


def test_a_failed_condition_is_journaled_and_the_sweep_goes_on(root_netns, tmp_path, tiny_pair):
    playbook = tmp_path / "strict.yaml"
    playbook.write_text(
        "name: strict\nlab: {devices: 1}\nworkload: {problems_per_device: 1, max_new_tokens: 16}\n"
        "link: {probe_packets: 50}\n"
        # no emulated link holds 85 ms to within a microsecond: the guard must refuse it
        "sweep:\n  link.rtt_tolerance_ms: [0.001, 1.0]\n"
    )
    outcome = execute(playbook, out=tmp_path / "results", say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (1, 1)
    first, second = RunStore(outcome.store.root).journal()
    assert first["status"] == "failed"
    assert "link does not measure as requested" in first["reason"]
    assert first["link"]["summary"]["rtt_measured_ms"] > 0  # what was measured is kept
    assert second["status"] == "done"
    assert leftovers() == []
