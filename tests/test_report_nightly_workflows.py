"""Lint of the nightly GitHub workflows (part of `make test`): each file validates against the
GitHub workflow schema bundled with check-jsonschema (no network), every `run:` block parses
as bash, and every step output or outcome used is produced by an earlier step. The hardware
nightly's steps are in its script (tests/test_nightly_script.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
CHECK = [str(Path(sys.executable).parent / "check-jsonschema")]
STEP_REF = re.compile(r"steps\.([A-Za-z0-9_-]+)\.(outputs|outcome|conclusion)")


def schema_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CHECK, "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_there_are_two_nightlies():
    assert {p.name for p in WORKFLOWS} >= {"nightly-lab.yml", "nightly-emulated.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_schema(path):
    proc = schema_check(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path):
    broken = yaml.safe_load(WORKFLOWS[0].read_text())
    job = next(iter(broken["jobs"].values()))
    job["steps"][0]["uses"] = 42  # must be a string
    job["timeout-minutes"] = "soon"
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(broken))
    assert schema_check(bad).returncode != 0


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_run_blocks_parse_and_step_references_exist(path):
    bash = shutil.which("bash")
    assert bash
    wf = yaml.safe_load(path.read_text())
    for job in wf["jobs"].values():
        seen: set[str] = set()
        for step in job["steps"]:
            text = yaml.safe_dump(step)
            for ref, _ in STEP_REF.findall(text):
                assert ref in seen, f"{path.name}: step {step.get('name')!r} uses {ref!r} first"
            if "run" in step:
                script = re.sub(r"\$\{\{.*?\}\}", "X", step["run"])
                proc = subprocess.run([bash, "-n"], input=script, capture_output=True, text=True)
                assert proc.returncode == 0, f"{path.name}: {step.get('name')}: {proc.stderr}"
            if "id" in step:
                seen.add(step["id"])
