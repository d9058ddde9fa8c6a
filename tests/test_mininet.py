"""Lab kind `mininet`: hosts made by Mininet's API, reached over SSH, removed without `mn -c`;
TCLink's silent failure without netem is detected."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.core.errors import LabError
from testbed.labs.system import SystemRunner


@pytest.fixture
def mininet_api():
    from testbed.core.errors import PrivilegeError
    from testbed.labs.mininet import import_mininet

    try:
        return import_mininet()
    except PrivilegeError as exc:
        pytest.skip(str(exc))


def _spec(name: str, subnet: str, tmp_path: Path, devices: int = 2):
    from testbed.labs.setup import LabSetup

    return LabSetup.build(
        name=name, devices=devices, subnet=subnet, state_dir=str(tmp_path / "lab")
    )


def test_mininet_is_loaded_from_debian_folder_alone(mininet_api) -> None:
    import sys

    assert mininet_api.__name__ == "mininet"
    assert Path(mininet_api.net.__file__).parent == Path(mininet_api.__file__).parent
    # only mininet joins the virtualenv: the system's dist-packages stay off sys.path
    assert not any(p.rstrip("/").endswith("/usr/lib/python3/dist-packages") for p in sys.path)


def test_dry_run_prints_mininet_calls_and_lab_commands(tmp_path: Path) -> None:
    from testbed.labs.mininet import MininetLab

    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    lab = MininetLab.up(_spec("hmdry", "10.85.4.0/24", tmp_path), runner=runner)
    text = "\n".join(runner.actions)
    assert "mininet: addHost dev1 ip=10.85.4.2/24" in text
    assert "addLink dev1:eth0 br0:p-dev1" in text
    assert "ip netns attach tb-hmdry-dev1 '<pid of mininet node dev1>'" in text
    assert "ip netns exec tb-hmdry-dev2" in text  # the host's sshd
    assert not (tmp_path / "lab").exists()
    assert lab.kind == "mininet"


def test_mininet_lab_hosts_answer_over_ssh_and_leave_nothing(
    root_netns: None, mininet_api, tmp_path: Path
) -> None:
    from testbed.hosts.control import HostControl
    from testbed.labs.clean import leftovers
    from testbed.labs.discover import netns_pids
    from testbed.labs.mininet import MininetLab

    machine_wide = ("net/ipv4/tcp_rmem", "net/core/wmem_max", "kernel/pty/max")
    before = {k: Path("/proc/sys", k).read_text() for k in machine_wide}
    lab = MininetLab.up(_spec("hmn", "10.85.5.0/24", tmp_path))
    try:
        # Mininet's own start-up would raise these for the whole machine; the lab does not
        assert {k: Path("/proc/sys", k).read_text() for k in machine_wide} == before
        assert lab.status().healthy
        shells = {}
        for h in lab.hosts:
            cmdlines = [
                Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                for pid in netns_pids(lab.runner, h.netns)
            ]
            shells[h.name] = [c for c in cmdlines if b"mininet:" + h.name.encode() in c]
        assert all(shells.values()), f"no Mininet shell in some host namespace: {shells}"
        with HostControl(lab.inventory()) as hc:
            for h in lab.hosts:
                out = hc.run(h.name, "ip -o -4 addr show dev eth0").stdout
                assert f"{h.ip}/24" in out
            dev = lab.devices[0]
            seen = hc.run(dev.name, f"ip -o link show dev eth0; ip -n {lab.bridge_netns} -o link")
        assert "link-netns" in seen.stdout
        lab_ports = lab.runner.run(
            ["ip", "-o", "link", "show", "master", "br0"], netns=lab.bridge_netns, query=True
        ).stdout
        for h in lab.hosts:
            assert f" {h.port}@" in lab_ports
    finally:
        lab.down()
    assert leftovers("hmn") == []


def test_tclink_without_netem_is_detected(root_netns: None, mininet_api) -> None:
    """Whatever the kernel: a TCLink is reported bare exactly when netem cannot be added."""
    from testbed.labs.mininet import missing_netem, require_netem
    from testbed.links.detect import netem_available

    net = mininet_api.net.Mininet(topo=None, controller=None, build=False)
    try:
        a = net.addHost("hta", ip="10.85.6.1/24")
        b = net.addHost("htb", ip="10.85.6.2/24")
        net.addLink(a, b, cls=mininet_api.link.TCLink, delay="20ms")
        bare = missing_netem(net)
        if netem_available():
            assert bare == []
            require_netem(net)
        else:
            assert sorted(bare) == ["hta:hta-eth0", "htb:htb-eth0"]
            with pytest.raises(LabError, match="unimpaired"):
                require_netem(net)
    finally:
        net.stop()
