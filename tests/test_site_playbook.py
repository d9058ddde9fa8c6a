"""The site playbook, run for real against an emulated lab: it provisions, its --check mode
reports without changing and a run mends what was lost, and it stops on a missing or corrupt
model file naming the host and file. That a second run changes nothing is checked on the
rehearsal lab (tests/test_rehearsal.py), which walks the whole bring-up."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import require_root_netns

from testbed.hosts import dump_inventory, load_inventory

REPO = Path(__file__).resolve().parent.parent
ANSIBLE = REPO / "ansible"
HOLDER_C = REPO / "testbed" / "links" / "holder.c"
BIN = Path(sys.executable).parent
VAULT_PASSWORD = "f-site-test-password"
PROTOCOL_KEY = "f-site-test-protocol-key-0123456789abcdef"
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


class Site:
    """An emulated lab described for Ansible: the tiny model pair as the controller's model
    store, the inventory (a vaulted protocol key in group_vars), a way to run the playbook."""

    def __init__(self, lab, root: Path, tiny) -> None:
        self.lab = lab
        self.root = root
        self.models = tiny.root  # read only: files are copied from it, never written
        self.target = tiny.target_hf.name
        self.sha = {
            rel: sha256(self.models / rel)
            for rel in [
                "draft.gguf",
                *(f"{self.target}/{f.name}" for f in tiny.target_hf.iterdir()),
            ]
        }
        self.password_file = root / "vault-pass"
        self.password_file.write_text(VAULT_PASSWORD + "\n")
        self.inventory = root / "inv" / "lab.yml"
        self.inventory.parent.mkdir()
        vault = self.inventory.parent / "group_vars" / "all" / "vault.yml"
        vault.parent.mkdir(parents=True)
        vault.write_text(f"lab_protocol_key: {PROTOCOL_KEY}\n")
        self.tool("ansible-vault", "encrypt", str(vault), check=True)
        self.write()

    def write(self, **entries: dict[str, str]) -> None:
        """The lab's own inventory plus what provisioning needs. dev1 names its draft model,
        dev2 leaves the choice to the host's memory; `entries` changes a device's catalogue
        entry (host vars override the group's)."""
        inv = self.lab.inventory()
        draft = {"file": "draft.gguf", "sha256": self.sha["draft.gguf"]}
        drafts = {"llama-3.2-1b-q4": draft, "llama-3.2-3b-q8": draft}  # both the tiny draft
        hosts = []
        for h in inv.hosts:
            extra: dict[str, object] = {}
            if h.name == "dev1":
                extra["draft_model_name"] = "llama-3.2-1b-q4"
            if h.name in entries:
                key = "llama-3.2-1b-q4" if h.name == "dev1" else "llama-3.2-3b-q8"
                extra["draft_models"] = {**drafts, key: {**draft, **entries[h.name]}}
            hosts.append(h.model_copy(update={"vars": {**h.vars, **extra}}))
        all_vars = {
            **inv.vars,
            "testbed_model_source_dir": str(self.models),
            "draft_models": drafts,
            "target_checkpoint": {
                "name": self.target,
                "files": {
                    rel.split("/", 1)[1]: sha
                    for rel, sha in self.sha.items()
                    if rel.startswith(f"{self.target}/")
                },
            },
        }
        controller = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "workdir": str(self.root / "controller"),
        }
        self.inventory.write_text(dump_inventory(hosts, all_vars, controller))

    def tool(self, name: str, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        env = dict(
            os.environ,
            LC_ALL="C.UTF-8",
            ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"),
            ANSIBLE_VAULT_PASSWORD_FILE=str(self.password_file),
            ANSIBLE_NOCOLOR="1",
        )
        res = subprocess.run(
            [str(BIN / name), *args], capture_output=True, text=True, env=env, timeout=600
        )
        if check:
            assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return res

    def play(self, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, int]]]:
        res = self.tool(
            "ansible-playbook", "-i", str(self.inventory), *args, str(ANSIBLE / "site.yml")
        )
        recap = {
            m[0]: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m[1:])))
            for m in RECAP.findall(res.stdout)
        }
        return res, recap


def failed_tasks(stdout: str) -> str:
    """Each failed task's heading and result from a play's output (the tail alone may not
    reach the first failure)."""
    blocks = re.split(r"\n(?=TASK \[)", stdout)
    return "".join(b[:1500] + "\n" for b in blocks if re.search(r"^(fatal|failed): ", b, re.M))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, tiny_pair) -> Iterator[Site]:
    require_root_netns()
    from testbed.labs import EmulatedLab, LabSetup

    root = tmp_path_factory.mktemp("fsite")
    setup = LabSetup(name="fsite", devices=2, subnet="10.80.1.0/24", state_dir=root / "lab")
    with EmulatedLab.running(setup) as lab:
        yield Site(lab, root, tiny_pair)


def test_first_run_provisions_every_host(site: Site) -> None:
    res, recap = site.play()
    assert res.returncode == 0, failed_tasks(res.stdout) + res.stdout[-3000:] + res.stderr[-2000:]
    assert set(recap) == {"server", "dev1", "dev2", "ctl"}
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in recap.values())
    assert all(recap[h]["changed"] > 0 for h in ("server", "dev1", "dev2"))
    inv = load_inventory(site.inventory, site.password_file)
    for host in inv.hosts:
        work = Path(host.workdir)
        facts = json.loads((work / "facts" / "host.json").read_text())
        assert facts["host"] == host.name and facts["role"] == host.role
        assert facts["address"] == host.address and facts["netns"] == host.netns
        netem = json.loads((work / "facts" / "netem.json").read_text())
        assert isinstance(netem["sch_netem"], bool) and isinstance(netem["ifb"], bool)
        assert netem["backend"] == ("tc-netem" if netem["sch_netem"] else "userspace")
        check_holder(work, netem)
        key = work / "lab.key"
        assert key.read_text().strip() == PROTOCOL_KEY  # decrypted from the vault
        assert key.stat().st_mode & 0o777 == 0o600
    dev1, dev2, server = (Path(inv.host(n).workdir) for n in ("dev1", "dev2", "server"))
    for dev in (dev1, dev2):
        assert sha256(dev / "models" / "draft.gguf") == site.sha["draft.gguf"]
    for rel, sha in site.sha.items():
        if rel.startswith(f"{site.target}/"):
            assert sha256(server / "models" / rel) == sha
    # dev1 named its model; dev2 got the larger one for this machine's memory (> 6 GB)
    placed = {d.name: json.loads((d / "facts" / "models.json").read_text()) for d in (dev1, dev2)}
    assert placed["dev1"]["draft_model_name"] == "llama-3.2-1b-q4"
    assert placed["dev2"]["draft_model_name"] == "llama-3.2-3b-q8"
    assert placed["dev1"]["draft_model"] == f"{dev1}/models/draft.gguf"
    unit = (dev1 / "agents" / "testbed-drafter.service").read_text()
    assert f"--dev dev1 --model {dev1}/models/draft.gguf" in unit
    assert f"--server {inv.server.address}:7000" in unit
    env = (server / "agents" / "verifier.env").read_text()
    assert f"TESTBED_TARGET_MODEL={server}/models/{site.target}" in env


def check_holder(work: Path, netem: dict) -> None:
    """The role built the packet holder from the current holder.c and named it, whatever the
    kernel (netem_build_holder always, the default: links that vary are held in user space)."""
    holder = Path(netem["holder_path"])
    assert holder == work / "bin" / "tb-holder" and os.access(holder, os.X_OK), netem
    assert netem["holder_source_sha256"] == sha256(HOLDER_C) == sha256(work / "src" / "holder.c")
    assert holder.stat().st_mtime >= (work / "src" / "holder.c").stat().st_mtime
    usage = subprocess.run([str(holder)], capture_output=True, text=True, timeout=10)
    assert usage.returncode == 2 and "usage: tb-holder" in usage.stderr, usage


def test_check_mode_reports_without_changing(site: Site) -> None:
    """dev1 lost its draft model and has an older holder.c than its build;
    dev2 lost its holder build and source: --check changes nothing, a run mends both."""
    dev1, dev2 = (Path(site.lab.inventory().host(n).workdir) for n in ("dev1", "dev2"))
    placed = dev1 / "models" / "draft.gguf"
    placed.unlink()
    holder = json.loads((dev1 / "facts" / "netem.json").read_text())["holder_path"]
    (dev1 / "src" / "holder.c").write_text("/* an older holder */\n")
    built = Path(holder).stat().st_mtime_ns
    for gone in (dev2 / "bin" / "tb-holder", dev2 / "src" / "holder.c"):
        gone.unlink()
    res, recap = site.play("--check", "--limit", "dev1,dev2")
    assert res.returncode == 0, failed_tasks(res.stdout) + res.stdout[-3000:]
    assert recap["dev1"]["changed"] >= 1 and not placed.exists()
    assert recap["dev2"]["changed"] >= 1 and not (dev2 / "bin" / "tb-holder").exists()
    assert Path(holder).stat().st_mtime_ns == built
    res, recap = site.play("--limit", "dev1,dev2")
    assert res.returncode == 0 and placed.exists()
    assert Path(holder).stat().st_mtime_ns > built  # dev1 rebuilt from the current source
    for work in (dev1, dev2):  # and dev2 built again
        check_holder(work, json.loads((work / "facts" / "netem.json").read_text()))


def test_bad_model_files_stop_the_play_naming_host_and_file(site: Site) -> None:
    """dev1's catalogue entry has a wrong checksum, dev2's file is not on the controller."""
    site.write(dev1={"sha256": "0" * 64}, dev2={"file": "absent.gguf"})
    try:
        res, recap = site.play("--limit", "dev1,dev2")
    finally:
        site.write()
    assert res.returncode != 0 and recap["dev1"]["failed"] == recap["dev2"]["failed"] == 1
    source = site.models / "draft.gguf"
    assert f"dev1: model file {source} has sha256 {site.sha['draft.gguf']}" in res.stdout
    assert f"the inventory expects {'0' * 64}" in res.stdout
    missing = site.models / "absent.gguf"
    assert f"dev2: model file {missing} is missing on the controller" in res.stdout


SMOKE = (
    "name: fsmoke\nlab: {devices: 2}\nworkload: {problems_per_device: 1, max_new_tokens: 16}\n"
    "impairment: {probe_packets: 50, backend: nfqueue}\nlink: {rtt_ms: 40, loss: 0.0}\n"
)


def test_smoke_run_on_lab_kind_inventory_uses_what_ansible_placed(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the playbook, the site's own hosts as lab kind `inventory`, their inventory naming
    no model or holder: the lab reads each host's facts itself. Impaired on the hosts, each
    holder starts from the build Ansible made (facts/netem.json); a dry run prints the reads
    and contacts no host; a run starts the agents on the model files Ansible placed and
    verified (facts/models.json), and its manifest records what it took from the facts."""
    from testbed.hosts import HostControl
    from testbed.labs import LabSetup
    from testbed.labs.physical import InventoryLab, describe_namespace_lab
    from testbed.links.api import apply, clear
    from testbed.runner.run import execute
    from testbed.topo.profile import LinkProfile

    hosts = list(load_inventory(site.inventory, site.password_file).hosts)
    facts = {
        h.name: {n: json.loads((Path(h.workdir) / "facts" / f"{n}.json").read_text())
                 for n in ("models", "netem")}
        for h in hosts
    }  # fmt: skip
    placed = {
        h.name: facts[h.name]["models"]["target_model" if h.role == "server" else "draft_model"]
        for h in hosts
    }
    for h in hosts:
        assert not {"draft_model", "target_model", "holder_path"} & set(h.vars), h.vars
        assert placed[h.name].startswith(f"{h.workdir}/models/")

    on_hosts = describe_namespace_lab(site.lab, hosts, tmp_path / "on-hosts.yml", middlebox=False)
    setup = LabSetup(name="fsoh", topology=site.lab.topology, inventory=on_hosts,
                   state_dir=tmp_path / "on-hosts")  # fmt: skip
    said: list[str] = []
    lab = InventoryLab.up(setup, progress=said.append)
    try:
        apply(lab, LinkProfile(rtt_ms=40, loss=0.1), backend="nfqueue")
        for h in hosts:
            built = facts[h.name]["netem"].get("holder_path")
            assert lab.holder_binary(h.name) == built
            if built:
                assert f"setsid {built} --tag" in "\n".join(lab.host_runner(h.name).actions)
    finally:
        clear(lab)
        lab.down()
    assert lab.without_facts == [] and not any("no site playbook facts" in m for m in said)

    inventory = describe_namespace_lab(site.lab, hosts, tmp_path / "site.yml")
    playbook = tmp_path / "smoke.yaml"
    playbook.write_text(SMOKE)
    monkeypatch.setenv("TESTBED_LAB_NAME", "fsmk")
    monkeypatch.setenv("TESTBED_LAB_SUBNET", "10.80.3.0/24")
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path / "results"))
    dry = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", str(playbook), "--dry-run",
         "--inventory", str(inventory)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "COLUMNS": "1000"},
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "facts (models, packet holder): read on server, dev1, dev2, mb in a real run" in (
        dry.stdout
    )
    for h in hosts:
        for name in ("models", "netem"):
            path = f"{h.workdir}/facts/{name}.json"
            assert f"({h.name}): cd / && test -e {path} || exit 66; cat {path}" in dry.stdout
        assert placed[h.name] not in dry.stdout  # read in a real run only

    started: list[tuple[str, str]] = []
    start = HostControl.start

    def recorded(self: HostControl, host: str, name: str, command: str, **kw: Any) -> Any:
        started.append((self.host(host).name, command))
        return start(self, host, name, command, **kw)

    monkeypatch.setattr(HostControl, "start", recorded)
    outcome = execute(playbook, out=tmp_path / "out", inventory=str(inventory), say=said.append)
    journal = outcome.store.journal() if outcome.store else []
    assert (outcome.done, outcome.failed) == (1, 0), json.dumps(journal, default=str)[-3000:]
    for h in hosts:
        commands = [command for name, command in started if name == h.name]
        assert commands and all(f"--model {placed[h.name]} " in c for c in commands), commands
    assert outcome.store is not None
    recorded_lab = outcome.store.manifest()["lab"]
    # the middlebox (the lab's bridge namespace) was not provisioned by the site playbook
    assert recorded_lab["without_facts"] == ["mb"]
    for h in hosts:
        key = "target_model" if h.role == "server" else "draft_model"
        assert recorded_lab["from_facts"][h.name][key] == placed[h.name]
    assert any(m.strip().startswith("from the site playbook's facts: server") for m in said)
