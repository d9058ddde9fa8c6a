"""The emulated lab: namespaces per host, sshd reachable through Fabric, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import require_root_netns

from testbed.core.errors import BadInputError, LabError
from testbed.labs import EmulatedLab, LabSetup, SystemRunner, clean_all, leftovers, naming
from testbed.labs.discover import is_lab_process, list_netns, root_links

REPO = Path(__file__).resolve().parent.parent


def system_leftovers(lab: str) -> list[str]:
    """What of `lab` exists, asked of the system directly (not of the lab's own code)."""
    prefix = f"tb-{lab}-"
    found = []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in out.splitlines() if line.startswith(prefix)]
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {line}" for line in out.splitlines() if f" {prefix}" in line]
    out = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True).stdout
    found += [f"process {line}" for line in out.splitlines() if prefix in line]
    return found


def running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (an exited child waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- no root needed ------------------------------------------------------------------------


def test_spec_errors_name_the_field() -> None:
    with pytest.raises(BadInputError, match=r"name: .*lowercase"):
        LabSetup.build("cli", name="Bad-Name")
    with pytest.raises(BadInputError, match=r"devices"):
        LabSetup.build("cli", devices=0)
    with pytest.raises(BadInputError, match=r"room for 6 hosts, the lab needs 10"):
        LabSetup.build("cli", devices=8, subnet="10.77.0.0/29")


def test_address_plan_and_names() -> None:
    setup = LabSetup(name="x", devices=3, subnet="10.77.9.0/24")
    hosts = setup.plan(Path("/s"))
    assert [h.name for h in hosts] == ["server", "dev1", "dev2", "dev3"]
    assert [h.ip for h in hosts] == ["10.77.9.1", "10.77.9.2", "10.77.9.3", "10.77.9.4"]
    assert setup.controller_ip() == "10.77.9.254"
    assert hosts[2].netns == "tb-x-dev2" and hosts[2].port == "p-dev2"
    assert hosts[0].workdir == Path("/s/hosts/server")
    longest = naming.controller_link("a" * 10)
    assert len(longest) <= 15  # Linux interface name limit
    assert naming.lab_of_netns("tb-abc-dev1") == "abc" and naming.lab_of_netns("other") is None


def test_lab_processes_are_recognised_by_name() -> None:
    sshd_title = ["sshd: /usr/sbin/sshd -f /x/sshd/tb-lab-dev1-sshd.conf -E /x/a.log [listener]"]
    assert is_lab_process(sshd_title, "tb-lab-")
    assert not is_lab_process(sshd_title, "tb-other-")
    assert is_lab_process(["/c/tb-holder", "--tag", "tb-lab-holder", "100:1:0"], "tb-lab-")
    assert not is_lab_process(["python", "-f", "tb-lab-x"], "tb-")  # not sshd, no tag
    assert not is_lab_process(["pytest", "tests/test_lab.py"], "tb-")


def test_dry_run_prints_actions_and_creates_nothing(tmp_path: Path) -> None:
    printed: list[str] = []
    runner = SystemRunner(dry_run=True, echo=printed.append)
    state_dir = tmp_path / "state"
    setup = LabSetup(name="tdry", devices=2, subnet="10.77.209.0/24", state_dir=state_dir)
    lab = EmulatedLab.up(setup, runner=runner)
    text = "\n".join(printed)
    assert "[dry-run] ip netns add tb-tdry-sw" in text
    assert "ip link add eth0 netns tb-tdry-dev2 type veth peer name p-dev2 netns tb-tdry-sw" in text
    assert any(
        line.startswith("[dry-run] ip netns exec tb-tdry-server /") and "sshd -f" in line
        for line in printed
    )
    assert "ip addr add 10.77.209.254/24 dev tb-tdry-c" in text
    assert [h.ip for h in lab.hosts] == ["10.77.209.1", "10.77.209.2", "10.77.209.3"]
    assert not state_dir.exists()
    assert system_leftovers("tdry") == []


def test_lab_from_a_mixed_topology_keeps_each_host_class(tmp_path: Path) -> None:
    from testbed.topo.files import load_topology

    topo = load_topology(REPO / "topologies" / "mixed-fleet.yaml")
    setup = LabSetup(name="adry", topology=topo, subnet="10.78.8.0/24", state_dir=tmp_path / "s")
    lab = EmulatedLab.up(setup, runner=SystemRunner(dry_run=True, echo=lambda _l: None))
    assert lab.kind == "namespaces" and len(lab.devices) == 16
    classes = {h.name: h.host_class for h in lab.inventory().hosts}
    assert classes["server"] == "a100"
    assert classes["dev10"] == "pi5" and classes["dev11"] == "jetson-orin-nano"
    assert lab.describe()["classes"] == {"pi5": 10, "jetson-orin-nano": 6}


def test_devices_rescale_the_default_star() -> None:
    setup = LabSetup.build("cli", name="x", devices=5)
    assert setup.devices == 5 and setup.topology.name == "star"
    with pytest.raises(BadInputError, match="devices"):
        LabSetup.build("cli", devices=0)


# --- root: a real lab ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    setup = LabSetup(
        name="tlab",
        devices=3,
        subnet="10.77.201.0/24",
        state_dir=tmp_path_factory.mktemp("tlab"),
    )
    with EmulatedLab.running(setup) as running:
        yield running
    assert system_leftovers("tlab") == []


@pytest.fixture(scope="module")
def hc(lab: EmulatedLab):
    from testbed.hosts import HostControl

    with HostControl(lab.inventory()) as control:
        yield control


def test_every_host_answers_ssh_from_its_own_namespace(lab: EmulatedLab, hc) -> None:
    results = hc.run_all(
        "ip -o -4 addr show dev eth0 | awk '{print $4}'; readlink /proc/self/ns/net; pwd"
    )
    assert set(results) == {"server", "dev1", "dev2", "dev3"}
    seen_ns = set()
    for host in lab.hosts:
        addr, netns_id, cwd = results[host.name].stdout.split()
        assert addr == f"{host.ip}/24"
        assert cwd == str(host.workdir)
        seen_ns.add(netns_id)
    assert len(seen_ns) == 4  # four different network namespaces
    assert os.readlink("/proc/self/ns/net") not in seen_ns  # none is the controller's


def test_workdirs_exist_per_host(lab: EmulatedLab) -> None:
    dirs = {h.workdir for h in lab.hosts}
    assert len(dirs) == len(lab.hosts) and all(d.is_dir() for d in dirs)


def test_status_reflects_the_system(lab: EmulatedLab) -> None:
    st = EmulatedLab.load(lab.state_dir).status()
    assert st.healthy
    assert [h.name for h in st.hosts] == ["server", "dev1", "dev2", "dev3"]
    assert all(h.sshd_alive for h in st.hosts)


def test_inventory_written_by_up(lab: EmulatedLab) -> None:
    inv = lab.inventory()
    assert [h.name for h in inv.servers] == ["server"]
    assert [h.name for h in inv.devices] == ["dev1", "dev2", "dev3"]
    dev2 = inv.host("dev2")
    assert dev2.address == "10.77.201.3" and dev2.netns == "tb-tlab-dev2"
    assert dev2.key_file == lab.client_key and dev2.workdir == str(lab.host("dev2").workdir)
    assert inv.vars["lab_kind"] == "emulated"


def test_second_lab_with_same_name_is_refused(lab: EmulatedLab, tmp_path: Path) -> None:
    setup = LabSetup(name="tlab", devices=1, subnet="10.77.208.0/24", state_dir=tmp_path)
    in_use = rf"already exists on this machine \(in use by process {os.getpid()}\)"
    with pytest.raises(LabError, match=in_use):
        EmulatedLab.up(setup)


def test_overlapping_subnet_is_refused(lab: EmulatedLab, tmp_path: Path) -> None:
    setup = LabSetup(name="tother", devices=1, subnet="10.77.201.0/25", state_dir=tmp_path)
    with pytest.raises(LabError, match="overlaps"):
        EmulatedLab.up(setup)
    assert system_leftovers("tother") == []


# --- root: teardown and crash recovery ----------------------------------------------------


def test_down_leaves_nothing_behind(root_netns: None, tmp_path: Path) -> None:
    from testbed.hosts import HostControl

    setup = LabSetup(name="tdown", devices=2, subnet="10.77.206.0/24", state_dir=tmp_path / "s")
    lab = EmulatedLab.up(setup)
    try:
        with HostControl(lab.inventory()) as hc:
            agent = hc.start("dev1", "sleeper", "sleep 300")  # an agent left running
        assert system_leftovers("tdown")
        assert running(agent.pid)
    finally:
        lab.down()
    assert system_leftovers("tdown") == []
    assert not running(agent.pid)
    assert not (tmp_path / "s").exists()


CRASHER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from testbed.labs import EmulatedLab, LabSetup
    from testbed.links.api import apply
    from testbed.topo.profile import LinkProfile
    lab = EmulatedLab.up(LabSetup(name="tcrash", devices=2, subnet="10.77.205.0/24",
                                 state_dir={state!r}))
    apply(lab, LinkProfile(rtt_ms=20))
    print("up", flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_clean_after_a_crash_without_state(root_netns: None, tmp_path: Path) -> None:
    state = tmp_path / "crash"
    script = CRASHER.format(repo=str(REPO), state=str(state))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    try:
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        left = system_leftovers("tcrash")
        assert any("holder" in x for x in left) and any("sshd" in x for x in left)
        import shutil

        shutil.rmtree(state)  # the state file is gone too
    finally:
        removed = clean_all("tcrash")
    assert any(r.startswith("netns tb-tcrash-sw") for r in removed)
    assert system_leftovers("tcrash") == []
    assert leftovers("tcrash") == []


def test_a_lab_abandoned_by_a_dead_owner_is_replaced_by_the_next_up(
    root_netns: None, tmp_path: Path, capfd
) -> None:
    script = CRASHER.format(repo=str(REPO), state=str(tmp_path / "crash"))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    try:
        old_sshd = [x for x in system_leftovers("tcrash") if "sshd" in x]
        assert old_sshd
        setup = LabSetup(
            name="tcrash", devices=1, subnet="10.77.205.0/24", state_dir=tmp_path / "s"
        )
        lab = EmulatedLab.up(setup)
        try:
            assert f"was left by process {proc.pid}, which has ended" in capfd.readouterr().err
            now = system_leftovers("tcrash")
            assert not any(x in now for x in old_sshd)  # the dead run's sshd are gone
            assert lab.status().hosts[-1].sshd_alive and len(lab.state.hosts) == 2
        finally:
            lab.down()
    finally:
        clean_all("tcrash")
    assert system_leftovers("tcrash") == []


def test_clean_dry_run_lists_but_keeps(root_netns: None, tmp_path: Path) -> None:
    setup = LabSetup(name="tkeep", devices=1, subnet="10.77.207.0/24", state_dir=tmp_path)
    lab = EmulatedLab.up(setup)
    try:
        printed: list[str] = []
        clean_all("tkeep", runner=SystemRunner(dry_run=True, echo=printed.append))
        assert any("ip netns del tb-tkeep-sw" in p for p in printed)
        assert "tb-tkeep-sw" in list_netns(SystemRunner(), "tb-tkeep-")
        assert root_links(SystemRunner(), "tb-tkeep-") == ["tb-tkeep-c"]
    finally:
        lab.down()
    assert system_leftovers("tkeep") == []


def test_up_failure_rolls_back(root_netns: None, tmp_path: Path, monkeypatch) -> None:
    from testbed.labs import sshd

    def broken(*_a, **_k):
        raise LabError("sshd refused to start (simulated)")

    monkeypatch.setattr(sshd, "start_sshd", broken)
    setup = LabSetup(name="tfail", devices=1, subnet="10.77.210.0/24", state_dir=tmp_path)
    with pytest.raises(LabError, match="simulated"):
        EmulatedLab.up(setup)
    assert system_leftovers("tfail") == []


# --- the `testbed lab` commands ------------------------------------------------------------


def _cli(*args: str):
    from typer.testing import CliRunner

    from testbed.cli import app

    return CliRunner().invoke(app, ["lab", *args])


def test_cli_dry_run_and_exit_codes(tmp_path: Path) -> None:
    state = str(tmp_path / "s")
    res = _cli("up", "--name", "tcli", "--subnet", "10.77.212.0/24", "--state-dir", state,
               "--dry-run")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "[dry-run] ip netns add tb-tcli-sw" in res.output
    assert system_leftovers("tcli") == [] and not Path(state).exists()
    assert _cli("up", "--devices", "0", "--dry-run").exit_code == 2  # bad input
    missing = _cli("status", "--name", "tnone", "--state-dir", state)
    assert missing.exit_code == 3 and "no lab state" in missing.output


def test_cli_up_status_down(root_netns: None, tmp_path: Path) -> None:
    state = str(tmp_path / "s")
    common = ["--name", "tcli", "--state-dir", state]
    try:
        up = _cli("up", "--devices", "2", "--subnet", "10.77.212.0/24", *common)
        assert up.exit_code == 0, up.output
        st = _cli("status", *common)
        assert st.exit_code == 0 and "(healthy)" in st.output and "tb-tcli-dev2" in st.output
        assert _cli("down", *common).exit_code == 0
    finally:
        clean_all("tcli")
    assert system_leftovers("tcli") == []
    assert _cli("status", *common).exit_code == 3
