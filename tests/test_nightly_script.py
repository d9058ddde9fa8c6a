"""The hardware nightly's script, `ansible/nightly-lab.sh`, where no lab is needed: it is what
the workflow runs, its dry run names the steps in order with their commands and writes
nothing, bad arguments are named, and a failing step is named while the vault password file of
the run is removed. Its whole run, on a lab, is in tests/test_rehearsal.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "ansible" / "nightly-lab.sh"
EXAMPLE = REPO / "ansible" / "inventories" / "lab.example.yml"
STEPS = ["setup", "vault", "provision", "run", "report", "compare", "dashboard", "last-good"]
STEP = re.compile(r"nightly: step (\d)/8 ([a-z-]+): (.*)$", re.M)


def nightly(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The script with `args`, its environment without the caller's vault or lab settings."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("ANSIBLE_VAULT", "LAB_", "GITHUB_", "RUNNER_"))}  # fmt: skip
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=base | env, timeout=120
    )


def test_the_workflow_runs_the_script() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK)
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "nightly-lab.yml").read_text())
    (job,) = wf["jobs"].values()
    (step,) = [s for s in job["steps"] if s.get("id") == "nightly"]
    assert step["run"].strip() == "ansible/nightly-lab.sh"
    assert step["env"]["LAB_VAULT_PASSWORD"] == "${{ secrets.LAB_VAULT_PASSWORD }}"
    assert {"LAB_INVENTORY", "LAB_RESULTS", "LAB_PLAYBOOK"} <= set(wf["env"])
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload"))
    assert "steps.nightly.outputs.run_dir" in upload["if"] + upload["with"]["path"]
    assert 'output run_dir "$RUN_DIR"' in SCRIPT.read_text()


def test_dry_run_names_every_step_in_order_and_writes_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results"
    res = nightly("--dry-run", "--inventory", str(EXAMPLE), "--results", str(results),
                  "--venv", str(tmp_path / "venv"))  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    steps = STEP.findall(res.stdout)
    assert [(int(n), name) for n, name, _ in steps] == list(enumerate(STEPS, 1)), res.stdout
    command = {name: text for _, name, text in steps}
    bin_ = tmp_path / "venv" / "bin"
    assert command["provision"] == f"{bin_}/ansible-playbook -i {EXAMPLE} {REPO}/ansible/site.yml"
    assert command["run"] == (f"{bin_}/testbed run {REPO}/experiments/smoke.yaml "
                              f"--inventory {EXAMPLE} --out {results}")  # fmt: skip
    assert command["compare"] == f"{bin_}/testbed compare {results}/last-good {results}/RUN"
    assert command["last-good"] == f"ln -sfn RUN {results}/last-good"
    assert "dry run: nothing was run" in res.stdout
    assert list(tmp_path.iterdir()) == []


def test_skipped_steps_are_said(tmp_path: Path) -> None:
    res = nightly("--dry-run", "--skip", "setup,provision", "--inventory", str(EXAMPLE),
                  "--results", str(tmp_path))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "step 1/8 setup: skipped (--skip setup)" in res.stdout
    assert "step 3/8 provision: skipped (--skip provision)" in res.stdout
    assert "ansible-playbook" not in res.stdout and "make" not in res.stdout


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        ([], {}, "no inventory: give --inventory FILE or set LAB_INVENTORY"),
        (["--inventory", "/nowhere/lab.yml"], {}, "inventory /nowhere/lab.yml: no such file"),
        (["--inventory", str(EXAMPLE)], {}, "no results folder: give --results DIR"),
        (["--results", "R"], {"LAB_INVENTORY": str(EXAMPLE)}, "no vault password: set LAB_VAULT"),
        (["--results", "R", "--skip", "run"], {"LAB_INVENTORY": str(EXAMPLE)},
         "--skip: run is not one of: setup provision"),
        (["--results", "R", "--playbook", "nope.yaml"], {"LAB_INVENTORY": str(EXAMPLE)},
         "playbook nope.yaml: no such file"),
        (["--results"], {}, "--results needs a value"),
        (["--fast"], {}, "unknown argument --fast"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(args: list[str], env: dict[str, str], said: str) -> None:
    res = nightly(*args, **env)
    assert res.returncode == 2 and said in res.stderr, res.stderr
    assert "step" not in res.stdout  # stopped before any step


def test_a_failing_step_is_named_and_the_password_file_removed(tmp_path: Path) -> None:
    """No tools where --venv points: provision fails (127); the script stops there, names it
    (also as a GitHub error), and the password file of the run is gone."""
    temp, outputs = tmp_path / "temp", tmp_path / "outputs"
    temp.mkdir()
    res = nightly("--skip", "setup", "--inventory", str(EXAMPLE), "--venv",
                  str(tmp_path / "no-venv"), "--results", str(tmp_path / "results"),
                  TMPDIR=str(temp), LAB_VAULT_PASSWORD="a vault password",
                  GITHUB_ACTIONS="true", GITHUB_OUTPUT=str(outputs))  # fmt: skip
    assert res.returncode == 127, res.stdout + res.stderr
    (written,) = re.findall(r"step vault: done: (\S+)", res.stdout)
    assert Path(written).parent.parent == temp and not Path(written).exists()
    assert list(temp.iterdir()) == []
    assert "step provision: FAILED (exit 127)" in res.stdout
    assert "FAILED at step provision (exit 127)" in res.stdout
    assert "::error::nightly-lab: step provision failed (exit 127)" in res.stdout
    assert "step 4/8 run" not in res.stdout and not (tmp_path / "results").exists()
    assert not outputs.exists()  # no run folder to upload
    assert "a vault password" not in res.stdout + res.stderr
