"""The site playbook: valid, and provisioning the emulated lab through its generated inventory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_root_netns

REPO = Path(__file__).resolve().parent.parent
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent


def ansible(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / tool
    if not exe.exists():
        pytest.skip(f"{tool} is not installed in this environment ({exe})")
    env = dict(os.environ, LC_ALL="C.UTF-8", ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"))
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=300
    )


def test_example_inventory_groups() -> None:
    res = ansible("ansible-inventory", "-i", str(ANSIBLE / "inventories/lab.example.yml"), "--list")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["servers"]["hosts"] == ["a100"]
    assert data["devices"]["hosts"] == ["pi5-1", "pi5-2", "jetson-1"]
    assert data["_meta"]["hostvars"]["jetson-1"]["ansible_user"] == "nvidia"


def test_site_playbook_syntax() -> None:
    inv = str(ANSIBLE / "inventories/lab.example.yml")
    res = ansible("ansible-playbook", "--syntax-check", "-i", inv, str(ANSIBLE / "site.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_playbook_provisions_the_emulated_lab(tmp_path: Path) -> None:
    require_root_netns()
    from testbed.lab import EmulatedLab, LabSpec

    spec = LabSpec(name="tans", devices=2, subnet="10.77.204.0/24", state_dir=tmp_path / "lab")
    with EmulatedLab.running(spec) as lab:
        res = ansible("ansible-playbook", "-i", str(lab.inventory_path), str(ANSIBLE / "site.yml"))
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert "unreachable=0" in res.stdout and "failed=1" not in res.stdout
        for host in lab.hosts:
            facts = json.loads((host.workdir / "host-facts.json").read_text())
            assert facts["host"] == host.name and facts["role"] == host.role
            assert facts["address"] == host.ip and facts["netns"] == host.netns
            assert facts["lab_kind"] == "emulated"
            assert facts["python"].startswith(f"{sys.version_info.major}.")
        # the device/server roles checked the shared venv (and skipped pip installs)
        assert res.stdout.count("skipping:") == 3
