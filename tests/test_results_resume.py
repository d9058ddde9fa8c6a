"""SIGKILL the controller mid-sweep, clean the lab, resume: every condition exactly once.

Needs root (a real namespace lab, lab `ekill` on 10.82.3.0/24, through the runner's
TESTBED_LAB_NAME / TESTBED_LAB_SUBNET).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from testbed.labs.clean import leftovers
from testbed.results.store import RunStore

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
LAB, SUBNET = "ekill", "10.82.3.0/24"
pytestmark = [pytest.mark.root, pytest.mark.slow]
PLAYBOOK = """\
name: kill-resume
topology: topologies/star.yaml
lab: {kind: namespaces, devices: 2}
workload: {kind: arithmetic, problems_per_device: 1, max_new_tokens: 12}
link: {rtt_ms: 10}
impairment: {probe_packets: 20}
sweep:
  sled.draft_len: [2, 3, 4, 5]
"""


def run_cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*TESTBED, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=lab_env())  # fmt: skip


def lab_env() -> dict[str, str]:
    return {**os.environ, "TESTBED_LAB_NAME": LAB, "TESTBED_LAB_SUBNET": SUBNET}


def journal_lines(run: Path) -> int:
    path = run / "journal.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def test_sigkill_mid_sweep_then_clean_and_resume(tmp_path, root_netns, tiny_pair):
    playbook = tmp_path / "kill.yaml"
    playbook.write_text(PLAYBOOK)
    out = tmp_path / "results"
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(
        [*TESTBED, "run", str(playbook), "--out", str(out)],
        cwd=REPO, env=lab_env(), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        run = None
        while time.monotonic() < deadline and proc.poll() is None:
            runs = [p.parent for p in out.glob("*/manifest.json")] if out.exists() else []
            run = runs[0] if runs else None
            if run is not None and journal_lines(run) >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "run ended early:\n" + (tmp_path / "first.log").read_text()
        assert run is not None and journal_lines(run) >= 1, "no condition finished in time"
        proc.send_signal(signal.SIGKILL)  # mid-sweep: the next condition is under way
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
    assert journal_lines(run) < 4
    assert leftovers(LAB), "a SIGKILLed controller leaves its lab behind"

    cleaned = run_cli("lab", "clean", "--name", LAB, timeout=120)
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert leftovers(LAB) == []

    resumed = run_cli("run", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert leftovers(LAB) == []

    store = RunStore(run)
    planned = store.manifest()["conditions"]
    lines = [json.loads(x) for x in store.journal_path.read_text().splitlines()]
    assert sorted(e["condition"] for e in lines) == sorted(planned)  # each exactly once
    assert all(e["status"] == "done" for e in lines)
    folders = sorted(p.name for p in (run / "conditions").iterdir())
    assert folders == sorted(planned)  # no partial folder left, none missing
    table = pd.read_parquet(run / "conditions.parquet")
    assert sorted(table["condition"]) == sorted(planned)
    for cid in planned:
        requests = pd.read_parquet(store.condition_dir(cid) / "requests.parquet")
        assert len(requests) == 2 and set(requests["condition"]) == {cid}
