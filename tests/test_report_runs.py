"""Run folders for the report, dashboard and compare tests (no tests of its own).

- `synthetic_run`: a run folder built by hand with known numbers, so a figure can be checked
  against a truth computed here, without root.
- `real_runs`: real runs of a tiny playbook through `testbed run` on lab `grun` (root), made
  once per test session and shared by the test modules that need them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
LAB, SUBNET = "grun", "10.83.0.0/24"

# per device: (tokens per request, seconds per request) -> verified rate = tokens / seconds
DEVICES = {"dev1": (10, 1.0), "dev2": (20, 1.0)}
LOSSES = (0.0, 0.1, 1.0)
PLAYBOOK = """\
name: greport
description: report/dashboard/compare test run, 2 devices, 85 ms, loss 0 and 5 %
mode: sled
seed: 1
topology: topologies/star.yaml
models: {draft: tiny, target: tiny}
workload: {kind: arithmetic, problems_per_device: 2, seed: 7, max_new_tokens: 24}
sled: {draft_len: 4, timeout_ms: 200, retries: 3}
sweep:
  link.loss: [0.0, 0.05]
"""


def _condition_tables(loss: float, cid: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Requests and rounds of one synthetic condition: every device answers two problems;
    at loss 1.0 every token is a fallback token."""
    requests, rounds = [], []
    for dev, (tokens, seconds) in DEVICES.items():
        for i in range(2):
            t0 = 100.0 + i * seconds
            verified = 0 if loss == 1.0 else tokens
            requests.append(
                {
                    "dev": dev, "problem": f"p{i}", "t_start": t0, "t_end": t0 + seconds,
                    "prompt_tokens": 5, "tokens": tokens, "verified_tokens": verified,
                    "fallback_tokens": tokens - verified, "rounds": 2,
                    "text": f"#### {i + 1}", "reference": i + 1 if i == 0 else 99,
                    "condition": cid, "strict_correct": i == 0, "flexible_correct": i == 0,
                    "target_text": f"#### {1 if i == 0 else 99}", "matches_target": i == 0,
                    "target_strict_correct": True, "target_flexible_correct": True,
                }
            )  # fmt: skip
            for r in range(2):
                rounds.append(
                    {
                        "dev": dev, "problem": f"p{i}", "round": r,
                        "t_start": t0 + r * seconds / 2, "t_end": t0 + (r + 1) * seconds / 2,
                        "mode": "fallback" if loss == 1.0 else "verified", "drafted": 4,
                        "accepted": None if loss == 1.0 else 3, "tokens": tokens // 2,
                        "attempts": 1, "rtt_ms": 85.0, "condition": cid,
                    }
                )  # fmt: skip
    return pd.DataFrame(requests), pd.DataFrame(rounds)


def synthetic_run(parent: Path, name: str = "synth-20260101-000000", failed: bool = True) -> Path:
    """A run folder with conditions at LOSSES (and one failed condition if asked)."""
    root = parent / name
    (root / "conditions").mkdir(parents=True)
    manifest = {
        "run_id": name, "created": "2026-01-01T00:00:00+0000",
        "playbook": {"name": "synth", "description": "hand-built"},
        "git": {"commit": "0" * 40}, "lab": {"kind": "namespaces", "devices": 2},
    }  # fmt: skip
    (root / "manifest.json").write_text(json.dumps(manifest))
    lines = []
    for i, loss in enumerate(LOSSES):
        cid = f"c{i:02d}-link.loss={loss}"
        folder = root / "conditions" / cid
        folder.mkdir()
        requests, rounds = _condition_tables(loss, cid)
        requests.to_parquet(folder / "requests.parquet")
        rounds.to_parquet(folder / "rounds.parquet")
        link = {
            "requested": {"rtt_ms": 85.0, "loss": loss},
            "summary": {"rtt_measured_ms": 85.2, "loss_measured": loss},
        }
        (folder / "link.json").write_text(json.dumps(link))
        lines.append(
            {"condition": cid, "index": i, "values": {"link.loss": loss}, "started": 10.0 * i,
             "status": "done", "link": link, "metrics": {}}
        )  # fmt: skip
    if failed:
        lines.append(
            {"condition": "c03-link.loss=0.5", "index": 3, "values": {"link.loss": 0.5},
             "status": "failed", "reason": "agents: server exited early"}
        )  # fmt: skip
    (root / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def run_testbed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`testbed ARGS` in a subprocess from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "testbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@functools.cache
def real_runs() -> tuple[Path, ...]:
    """Two runs of PLAYBOOK through `testbed run` (same code, same seeds), oldest first.

    Callers check root first (conftest.require_root_netns)."""
    results = Path(tempfile.mkdtemp(prefix="g-results-"))
    playbook = results / "greport.yaml"
    playbook.write_text(PLAYBOOK)
    env = {"TESTBED_LAB_NAME": LAB, "TESTBED_LAB_SUBNET": SUBNET, "TESTBED_RESULTS": str(results)}
    for _ in range(2):
        proc = run_testbed("run", str(playbook), env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tuple(sorted(p for p in results.iterdir() if (p / "manifest.json").is_file()))


def copy_run(run: Path, parent: Path, name: str) -> Path:
    """A copy of a run folder under parent/name."""
    dest = parent / name
    shutil.copytree(run, dest)
    return dest
