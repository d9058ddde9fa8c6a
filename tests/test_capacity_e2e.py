"""`testbed capacity` for real: every probe is a whole run of a one-condition playbook on the
namespace lab (tiny models, one short answer per device), bisecting `--low 1 --high 2`.

The rate is chosen so that the verdict does not hang on the machine's speed: any device keeps
it if the target verified a single token of its answer, so the capacity is the highest count
probed and both counts are probed. The figures themselves are whatever this machine measured;
each must be the one in its probe run's condition row. (A probe costs a whole run, about a
minute here; the bisection between the ends and a capacity of 0 are tested with the runs
faked, in test_metrics_capacity.py.)

Needs root (CI runs it as root). Runs use lab `ecap` on 10.84.1.0/24 (TESTBED_LAB_NAME /
TESTBED_LAB_SUBNET), so they share a machine with other labs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.labs.clean import leftovers
from testbed.results.store import RunStore

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
LAB, SUBNET = "ecap", "10.84.1.0/24"
pytestmark = [pytest.mark.root, pytest.mark.slow]
PLAYBOOK = """\
name: cap
topology: topologies/star.yaml
lab: {kind: namespaces}
workload: {kind: arithmetic, problems_per_device: 1, max_new_tokens: 8}
link: {rtt_ms: 10}
impairment: {probe_packets: 20}
"""
KEPT = 0.001  # verified tokens/s per device


def capacity(tmp_path: Path, rate: float) -> tuple[subprocess.CompletedProcess, Path]:
    """`testbed capacity` of PLAYBOOK at `rate`, devices 1 to 2; (the process, its folder)."""
    playbook, out = tmp_path / "cap.yaml", tmp_path / "capacity"
    playbook.write_text(PLAYBOOK)
    proc = subprocess.run(
        [*TESTBED, "capacity", str(playbook), "--rate", str(rate), "--low", "1", "--high", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**os.environ, "TESTBED_LAB_NAME": LAB, "TESTBED_LAB_SUBNET": SUBNET},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, out


def probe_runs(out: Path) -> dict[int, tuple[Path, dict]]:
    """Each probe's run under `out`, by its device count: (run folder, its condition row)."""
    runs: dict[int, tuple[Path, dict]] = {}
    for run in sorted((out / "runs").iterdir()):
        playbook = json.loads((run / "manifest.json").read_text())["playbook"]
        (row,) = pd.read_parquet(run / "conditions.parquet").to_dict("records")
        devices = playbook["lab"]["devices"]
        assert playbook["name"] == f"cap-n{devices}" and devices not in runs, run
        runs[devices] = (run, row)
    return runs


def check_probe(run: Path, row: dict, devices: int, figure: float) -> None:
    """The probe ran `devices` devices for real, and `figure` is its condition row's."""
    assert row["status"] == "done", row.get("reason")
    assert figure == row["device_verified_tok_s_min"] and figure > 0
    requests = pd.read_parquet(RunStore(run).condition_dir(row["condition"]) / "requests.parquet")
    assert sorted(requests["dev"]) == [f"dev{i}" for i in range(1, devices + 1)]
    assert (requests["verified_tokens"] > 0).all()  # what the figure counts


def test_capacity_at_a_rate_every_device_keeps_is_the_highest_count(root_netns, tmp_path,
                                                                    tiny_pair):  # fmt: skip
    proc, out = capacity(tmp_path, KEPT)
    saved = json.loads((out / "capacity.json").read_text())
    assert saved["capacity"] == 2 and saved["rate"] == KEPT
    assert saved["figure"] == "device_verified_tok_s_min"
    runs = probe_runs(out)
    assert sorted(runs) == [1, 2] and sorted(saved["measured"]) == ["1", "2"]
    for devices, (run, row) in runs.items():
        check_probe(run, row, devices, saved["measured"][str(devices)])
    assert f"capacity at {KEPT} tok/s: 2 devices" in proc.stdout
    assert leftovers(LAB) == []
