"""The Ansible content: the example inventory as Ansible reads it, the site playbook's syntax,
and ansible-lint (its run against an emulated lab is in test_site_playbook.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ANSIBLE = REPO / "ansible"
EXAMPLE = ANSIBLE / "inventories" / "lab.example.yml"
EXAMPLE_PASS = ANSIBLE / "inventories" / "lab.example.vault-pass"
BIN = Path(sys.executable).parent


def ansible(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        pytest.fail(f"{tool} is not installed in this environment ({exe}): run `make setup`")
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"))
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


def test_example_inventory_as_ansible_reads_it() -> None:
    res = ansible(
        "ansible-inventory",
        "-i",
        str(EXAMPLE),
        "--vault-password-file",
        str(EXAMPLE_PASS),
        "--list",
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["verifiers"]["hosts"] == ["a100"]
    assert set(data["drafters"]["children"]) == {"pi5", "jetson_orin_nano"}
    assert data["pi5"]["hosts"] == ["pi5-1", "pi5-2", "pi5-3", "pi5-4"]
    assert data["controller"]["hosts"] == ["ctl"] and data["middleboxes"]["hosts"] == ["mbox"]
    assert data["_meta"]["hostvars"]["jetson-1"]["ansible_user"] == "nvidia"


def test_site_playbook_syntax() -> None:
    res = ansible(
        "ansible-playbook", "--syntax-check", "-i", str(EXAMPLE),
        "--vault-password-file", str(EXAMPLE_PASS), str(ANSIBLE / "site.yml"),
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr


def test_ansible_lint_is_clean() -> None:
    res = ansible("ansible-lint", "--nocolor", "-f", "pep8", str(ANSIBLE))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "0 failure(s), 0 warning(s)" in res.stderr and "criteria was 'production'" in res.stderr
