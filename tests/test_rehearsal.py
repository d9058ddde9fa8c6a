"""The hardware rehearsal: `docs/lab-bringup.md` walked step by step, in its order, on the
rehearsal lab (testbed.labs.rehearsal: hosts named, reached and provisioned as a real lab's,
each with its own root filesystem, a sudo login user and no route outside the lab), then the
nightly as the lab's runner runs it (`ansible/nightly-lab.sh`, docs/nightly.md).

    testbed lab up --kind rehearsal          one command, the inventory written
    ansible all -m ping                      section 3: Ansible reads the inventory and vault
    ansible-playbook site.yml --check        section 4, then for real
    testbed run smoke.yaml --dry-run         section 5: every action printed, nothing changed
    ansible/nightly-lab.sh --skip setup      the nightly: the vault password a file of the run,
                                             site.yml a third time (changed=0), the smoke run
                                             (section 5), report, compare, dashboard, last-good
    ansible/nightly-lab.sh, wrong password   the failing step named, last-good kept
    a run with pi5-2 unplugged mid-run       it finishes; pi5-2's absence recorded
    testbed lab down                         nothing left: namespaces, mounts, processes

One lab for the module, the tests in file order (each step needs the one before); about nine
minutes on two cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import require_root_netns

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NAME = "rht"
RUN_LAB = "rhtrun"  # the run's own lab name: its runtime state apart from other labs'
SUBNET = "10.98.0.0/24"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
HOSTS = {"ctl", "mbox", "a100", "pi5-1", "pi5-2", "jetson-1"}


@dataclass
class Night:
    """One run of the nightly script: what it said, the temporary folder it was given, the
    step outputs it wrote for the workflow."""

    res: subprocess.CompletedProcess
    temp: Path
    outputs: Path

    @property
    def said(self) -> str:
        return self.res.stdout + self.res.stderr

    @property
    def password_file(self) -> Path:
        (written,) = re.findall(r"step vault: done: (\S+)", self.res.stdout)
        return Path(written)


@dataclass
class Rehearsal:
    state_dir: Path
    out: Path  # the nightly's results folder

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory" / "lab.yml"

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            LC_ALL="C.UTF-8",
            ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"),
            ANSIBLE_VAULT_PASSWORD_FILE=str(self.state_dir / "inventory" / "vault-pass"),
            ANSIBLE_NOCOLOR="1",
            TESTBED_LAB_NAME=RUN_LAB,
        )

    def tool(self, name: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / name), *args],
            capture_output=True,
            text=True,
            env=self.env(),
            cwd=REPO,
            timeout=timeout,
        )

    def play(self, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, int]]]:
        res = self.tool("ansible-playbook", "-i", str(self.inventory), "ansible/site.yml", *args)
        recap = play_recap(res.stdout)
        assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]
        assert set(recap) == HOSTS, recap
        assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in recap.values()), recap
        return res, recap

    def nightly(self, tag: str, password: str, skip: str = "setup") -> Night:
        """ansible/nightly-lab.sh on the lab's inventory, as the workflow runs it: the vault
        password in LAB_VAULT_PASSWORD alone, its own temporary folder and step outputs; the
        tools of this checkout's venv, so its setup step is skipped."""
        temp, outputs = self.out.parent / f"{tag}-temp", self.out.parent / f"{tag}-outputs"
        temp.mkdir()
        env = {k: v for k, v in self.env().items() if not k.startswith("ANSIBLE_VAULT")}
        env |= {"LAB_VAULT_PASSWORD": password, "RUNNER_TEMP": str(temp),
                "GITHUB_OUTPUT": str(outputs), "COLUMNS": "200"}  # fmt: skip
        res = subprocess.run(
            [str(REPO / "ansible" / "nightly-lab.sh"), "--inventory", str(self.inventory),
             "--results", str(self.out), "--venv", str(BIN.parent), "--skip", skip],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=1500,
        )  # fmt: skip
        return Night(res, temp, outputs)

    def upper(self, host: str, path: str) -> Path:
        """A file host `host` wrote at `path`, as this machine sees it (its root's upper layer)."""
        return self.state_dir / "roots" / host / "upper" / path.lstrip("/")


def play_recap(said: str) -> dict[str, dict[str, int]]:
    """ansible-playbook's PLAY RECAP: each host's ok, changed, unreachable and failed counts."""
    return {
        m[0]: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m[1:])))
        for m in RECAP.findall(said)
    }


def netns(host: str) -> str:
    return f"tb-{NAME}-{host}"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def leftovers(state_dir: Path) -> list[str]:
    """What of the lab remains: its namespaces, and processes rooted in its hosts' roots."""
    left = [n.split()[0] for n in ip("netns", "list").splitlines() if n.startswith(f"tb-{NAME}-")]
    roots = str(state_dir / "roots")
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "root").startswith(roots):
                left.append(f"pid {proc.name}")
        except OSError:
            continue
    return left


@pytest.fixture(scope="module")
def rh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rehearsal]:
    require_root_netns()
    from testbed.labs import LabSetup

    state_dir = LabSetup.build(name=NAME).resolved_state_dir().resolve()
    lab = Rehearsal(state_dir, tmp_path_factory.mktemp("rehearsal") / "results")
    up = lab.tool("testbed", "lab", "up", "--kind", "rehearsal", "--name", NAME,
                  "--subnet", SUBNET)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield lab
    finally:
        if leftovers(state_dir) or state_dir.exists():
            lab.tool("testbed", "lab", "down", "--name", NAME)
        shutil.rmtree(LabSetup.build(name=RUN_LAB).resolved_state_dir(), ignore_errors=True)


def test_up_is_one_command_and_the_lab_is_offline(rh: Rehearsal) -> None:
    assert rh.inventory.is_file() and "$ANSIBLE_VAULT" in rh.inventory.read_text()
    for host in HOSTS:
        assert ip("-n", netns(host), "route", "show", "default").strip() == "", host
    # the link segment is cabled, not bridged: the site playbook's middlebox role bridges it
    assert "br0" not in ip("-n", netns("mbox"), "-o", "link", "show")
    graph = rh.tool("ansible-inventory", "-i", str(rh.inventory), "--graph")
    assert graph.returncode == 0 and "@pi5:" in graph.stdout, graph.stderr
    ping = rh.tool("ansible", "-i", str(rh.inventory), "all", "-m", "ping")
    assert ping.returncode == 0 and ping.stdout.count("SUCCESS") == len(HOSTS), ping.stdout


def test_site_playbook_check_mode(rh: Rehearsal) -> None:
    _, recap = rh.play("--check")
    assert all(r["changed"] > 0 for r in recap.values()), recap
    assert not rh.upper("pi5-1", "/home/pi/edge-testbed/facts/models.json").exists()


def test_site_playbook_provisions(rh: Rehearsal) -> None:
    rh.play()
    homes = {"pi5-1": "/home/pi", "jetson-1": "/home/nvidia", "a100": "/srv"}
    for host, home in homes.items():
        work = f"{home}/edge-testbed"
        facts = rh.upper(host, f"{work}/facts/models.json")
        assert facts.is_file(), facts
        assert rh.upper(host, f"{work}/lab.key").stat().st_mode & 0o777 == 0o600
    ports = ip("-n", netns("mbox"), "-o", "link", "show", "master", "br0")
    assert all(p in ports for p in ("eth1", "wlan1", "wlan2", "wlan3")), ports
    served = rh.upper("ctl", "/etc/chrony/conf.d/edge-lab-server.conf").read_text()
    assert f"allow {SUBNET}" in served and "local stratum 10" in served, served
    apt = rh.upper("pi5-1", "/etc/apt/edge-lab-mirror.list").read_text()
    assert apt.startswith("deb [trusted=yes] http://10.98.0.2:8000/debs"), apt


def test_smoke_dry_run_prints_every_action_and_changes_nothing(rh: Rehearsal) -> None:
    before = sorted(rh.out.parent.rglob("*"))
    res = rh.tool("testbed", "run", "experiments/smoke.yaml", "--inventory", str(rh.inventory),
                  "--out", str(rh.out), "--dry-run")  # fmt: skip
    said = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 0, said[-5000:]
    assert "dry run of smoke: 3 conditions; nothing is changed" in said, said[-5000:]
    assert "dev1 -> pi5-1" in said, said[-5000:]
    assert sorted(rh.out.parent.rglob("*")) == before  # no run folder, nothing written


@pytest.fixture(scope="module")
def night(rh: Rehearsal) -> Night:
    """The nightly on the provisioned lab, with the lab's vault password."""
    return rh.nightly("night", (rh.state_dir / "inventory" / "vault-pass").read_text().strip())


def test_nightly_provisions_again_changing_nothing(night: Night) -> None:
    assert night.res.returncode == 0, night.said[-6000:]
    recap = play_recap(night.res.stdout)
    assert set(recap) == HOSTS, recap
    assert all(r["changed"] == r["failed"] == r["unreachable"] == 0 for r in recap.values())


def test_nightly_smoke_run_on_the_inventory(rh: Rehearsal, night: Night) -> None:
    assert "dev1 -> pi5-1" in " ".join(night.said.split()), night.said[-5000:]
    runs = [p for p in rh.out.iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 1, runs
    (run,) = runs
    journal = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    status = {j["condition"]: j["status"] for j in journal}
    assert len(status) == 3 and set(status.values()) == {"done"}, journal
    manifest = json.loads((run / "manifest.json").read_text())
    assert set(manifest["lab"]["from_facts"]) >= {"a100", "pi5-1", "pi5-2"}, manifest["lab"]
    assert night.outputs.read_text() == f"run_dir={run}\n"  # what the workflow uploads


def test_nightly_reports_publishes_and_records_the_last_good_run(
    rh: Rehearsal, night: Night
) -> None:
    run = Path(night.outputs.read_text().strip().removeprefix("run_dir="))
    assert (run / "report" / "report.md").is_file()
    assert (rh.out / "index.html").is_file() and (run / "dashboard.html").is_file()
    assert "no last good run yet: this run becomes the baseline" in night.res.stdout
    last_good = rh.out / "last-good"
    assert last_good.is_symlink() and os.readlink(last_good) == run.name
    assert f"nightly: passed: {run}" in night.res.stdout


def test_nightly_keeps_the_vault_password_for_the_run_only(rh: Rehearsal, night: Night) -> None:
    """Provision and run both decrypted lab_protocol_key from the file the script wrote (the
    environment named no other), and it is gone."""
    assert night.password_file.parent.parent == night.temp
    assert not night.password_file.exists()
    assert not [p for p in night.temp.iterdir() if p.name.startswith("nightly-lab.")]
    password = (rh.state_dir / "inventory" / "vault-pass").read_text().strip()
    assert password not in night.said


def test_nightly_names_a_failing_step(rh: Rehearsal, night: Night) -> None:
    """A wrong vault password: the run step cannot decrypt lab_protocol_key; the script says
    which step failed and ends with its status, last-good stays on the good run, and the
    password file is gone."""
    good = (rh.out / "last-good").resolve()
    bad = rh.nightly("bad-night", "not the vault password", skip="setup,provision")
    assert bad.res.returncode == 2, bad.said[-4000:]
    assert "lab_protocol_key: cannot decrypt the vaulted value" in bad.res.stderr
    assert "nightly: step run: FAILED (exit 2)" in bad.res.stdout
    assert "nightly: FAILED at step run (exit 2)" in bad.res.stdout
    assert "last-good: left as it was (step run failed)" in bad.res.stdout
    assert (rh.out / "last-good").resolve() == good
    assert not bad.password_file.exists()


def test_device_lost_mid_run(rh: Rehearsal, tmp_path: Path) -> None:
    """pi5-2 unplugged while the first condition's agents run: the run goes on, the next
    condition runs on pi5-1 alone, and pi5-2's absence is recorded."""
    from testbed.labs.rehearsal import RehearsalLab

    pb = yaml.safe_load((REPO / "experiments" / "smoke.yaml").read_text())
    pb["name"] = "device-lost"
    pb["topology"] = str(REPO / "topologies" / "star.yaml")
    pb["workload"] |= {"problems_per_device": 1, "max_new_tokens": 16}
    pb["sweep"] = {"link.loss": [0.0, 0.05]}
    playbook = tmp_path / "device-lost.yaml"
    playbook.write_text(yaml.safe_dump(pb))
    out = rh.out.parent / "lost"
    argv = [str(BIN / "testbed"), "run", str(playbook), "--inventory", str(rh.inventory),
            "--out", str(out)]  # fmt: skip
    env = rh.env() | {"COLUMNS": "200"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO)  # fmt: skip
    said, unplugged, t0 = [], False, time.monotonic()
    assert proc.stdout is not None
    for line in proc.stdout:
        said.append(line)
        if not unplugged and "c00" in line and "starting 2 device agents" in line:
            RehearsalLab.load(rh.state_dir).unplug("pi5-2")
            unplugged = True
        assert time.monotonic() - t0 < 300, "".join(said)[-3000:]
    assert proc.wait(timeout=60) in (0, 6) and unplugged, "".join(said)[-4000:]
    (run,) = out.iterdir()
    journal = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    assert [j["condition"][:3] for j in journal] == ["c00", "c01"], journal
    after = journal[1]
    assert after["status"] == "done", after
    assert after["devices"] == ["pi5-1"] and set(after["lost"]) == {"pi5-2"}, after
    lost = json.loads((run / "manifest.json").read_text())["lost_devices"]
    assert lost["pi5-2"]["before"] == after["condition"], lost


def test_down_leaves_nothing(rh: Rehearsal) -> None:
    down = rh.tool("testbed", "lab", "down", "--name", NAME)
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(rh.state_dir) == []
    assert not rh.state_dir.exists()
