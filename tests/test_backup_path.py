"""The backup path: cutting a device's primary link moves its traffic to the backup link, and
healing it moves the traffic back; every switch is logged with its time."""

from __future__ import annotations

import contextlib
import ipaddress
import struct
import threading
import time
from pathlib import Path

from testbed.lab.backup import (
    BACKUP_IFACE,
    backup_port,
    backup_site,
    build_backup,
    default_backup_subnet,
    failover_log,
    load_plan,
    monitor_tag,
    read_failovers,
)
from testbed.lab.discover import tagged_processes
from testbed.lab.failover import socket_in
from testbed.lab.system import SystemRunner
from testbed.netem.profile import LinkProfile
from testbed.topo.model import Topology

TRAFFIC_PORT = 9900
PACKET = struct.Struct("!Qd")


def test_default_backup_subnet_follows_the_lab_subnet() -> None:
    net = ipaddress.IPv4Network("10.85.7.0/24")
    assert default_backup_subnet(net) == ipaddress.IPv4Network("10.85.8.0/24")


def test_dry_run_prints_the_backup_links(tmp_path: Path) -> None:
    from testbed.lab.emulated import EmulatedLab
    from testbed.lab.spec import LabSpec

    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    spec = LabSpec.build(name="hbdry", devices=2, subnet="10.85.9.0/24", state_dir=str(tmp_path))
    lab = EmulatedLab.up(spec, runner=runner)
    plan = build_backup(lab)
    text = "\n".join(runner.actions)
    assert "ip -n tb-hbdry-sw link add br1 type bridge" in text
    assert (
        "ip link add eth1 netns tb-hbdry-dev2 type veth peer name b-dev2 netns tb-hbdry-sw" in text
    )
    assert "ip -n tb-hbdry-dev2 addr add 10.85.10.3/24 dev eth1" in text
    assert [d.backup_ip for d in plan.devices] == ["10.85.10.2", "10.85.10.3"]
    assert plan.server.backup_ip == "10.85.10.1"
    site = backup_site(lab)
    assert [h.port for h in site.devices] == ["b-dev1", "b-dev2"]
    assert site.runtime_dir == lab.runtime_dir / "backup"


class _Receiver(threading.Thread):
    """Records (arrival time, source address) of the test flow in the server's namespace."""

    def __init__(self, netns: str, ip: str) -> None:
        super().__init__(daemon=True)
        self.sock = socket_in(netns)
        self.sock.bind((ip, TRAFFIC_PORT))
        self.sock.settimeout(0.2)
        self.seen: list[tuple[float, str]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                _data, (src, _port) = self.sock.recvfrom(64)
            except TimeoutError:
                continue
            self.seen.append((time.time(), src))

    def first_from(self, src: str, after: float) -> float | None:
        return next((t for t, s in self.seen if s == src and t > after), None)


def _wait_for(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return False


def _cut(runner: SystemRunner, sw: str, port: str) -> None:
    """Drop everything to and from `port` on the bridge (a bridge-family nftables table)."""
    rules = (
        "add table bridge hcut\n"
        "add chain bridge hcut cutchain { type filter hook forward priority 0; }\n"
        f'add rule bridge hcut cutchain iifname "{port}" drop\n'
        f'add rule bridge hcut cutchain oifname "{port}" drop\n'
    )
    runner.run(["nft", "-f", "-"], netns=sw, input=rules)


def test_cut_moves_traffic_to_backup_and_back(root_netns: None, tmp_path: Path) -> None:
    from testbed.lab.emulated import EmulatedLab
    from testbed.lab.spec import LabSpec

    topo = Topology.star(1, LinkProfile(rtt_ms=0))
    topo.add_link("dev1", "server", "5g", LinkProfile(rtt_ms=0), path="backup")
    spec = LabSpec.build(name="hbk", topology=topo, subnet="10.85.7.0/24", state_dir=str(tmp_path))
    lab = EmulatedLab.up(spec)  # a topology with backup links: the lab adds path and monitor
    try:
        plan = load_plan(lab)
        assert plan is not None
        log = failover_log(lab)
        assert [pid for pid, _ in tagged_processes(monitor_tag("hbk"))]
        dev, server = plan.devices[0], plan.server
        rx = _Receiver(server.netns, server.primary_ip)
        rx.start()
        tx = socket_in(dev.netns)  # unbound: the route picks path and source per datagram
        stop = threading.Event()

        def send() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                with contextlib.suppress(OSError):
                    tx.sendto(PACKET.pack(seq, time.time()), (server.primary_ip, TRAFFIC_PORT))
                time.sleep(0.005)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        assert _wait_for(lambda: rx.first_from(dev.primary_ip, 0) is not None, 5)
        t_cut = time.time()
        _cut(lab.runner, lab.bridge_netns, lab.host("dev1").port)
        assert _wait_for(lambda: rx.first_from(dev.backup_ip, t_cut) is not None, 10)
        t_backup = rx.first_from(dev.backup_ip, t_cut)
        route = lab.runner.run(["ip", "route", "show", f"{server.primary_ip}/32"], netns=dev.netns)
        assert f"dev {BACKUP_IFACE}" in route.stdout
        time.sleep(0.3)
        t_heal = time.time()
        lab.runner.run(["nft", "delete", "table", "bridge", "hcut"], netns=lab.bridge_netns)
        assert _wait_for(lambda: rx.first_from(dev.primary_ip, t_heal) is not None, 10)
        t_back = rx.first_from(dev.primary_ip, t_heal)
        stop.set()
        sender.join()
        rx.done.set()
        rx.join()
        # between the switch and the heal, every datagram came over the backup path
        during = {s for t, s in rx.seen if t_backup <= t < t_heal}
        assert during == {dev.backup_ip}
        events = read_failovers(log)
        assert [(e.device, e.to) for e in events] == [("dev1", "backup"), ("dev1", "primary")]
        assert t_cut < events[0].t <= t_backup
        assert t_heal < events[1].t <= t_back
        assert read_failovers(log, since=t_heal) == events[1:]
        print(
            f"\nswitch-over: {1000 * (t_backup - t_cut):.0f} ms to backup, "
            f"{1000 * (t_back - t_heal):.0f} ms back to primary "
            f"(srtt {events[0].srtt_ms:.2f} ms, route change {events[0].route_ms:.1f} ms)"
        )
        assert (
            backup_port("dev1")
            in lab.runner.run(
                ["ip", "-o", "link", "show", "master", "br1"], netns=lab.bridge_netns
            ).stdout
        )
    finally:
        lab.down()
    from testbed.lab.clean import leftovers

    assert leftovers("hbk") == []
    assert tagged_processes(monitor_tag("hbk")) == []


def _path():
    import ipaddress as ip

    from testbed.lab.backup import BackupPlan, PathEnd
    from testbed.lab.failover import PrimaryPath

    end = PathEnd(name="dev1", netns="x", primary_ip="10.0.0.2", backup_ip="10.0.1.2")
    plan = BackupPlan(lab="h", subnet=ip.IPv4Network("10.0.1.0/24"), server=end, devices=[end])
    return plan, PrimaryPath(end, sock=None)  # type: ignore[arg-type]


def _probe(path, plan, seq: int, sent: float, rtt: float | None, now: float) -> str | None:
    """Send probe `seq` at `sent`; echo it after `rtt` (None: lost); judge at `now`."""
    path.pending[seq] = sent
    if rtt is not None and sent + rtt <= now:
        path.echo(seq, sent + rtt)
    path.expire(plan, now)
    return path.decision(plan)


def test_monitor_tolerates_an_rtt_rise_below_its_timeout() -> None:
    plan, path = _path()
    t = 0.0
    for seq in range(1, 50):  # 0.3 ms, then 85 ms (a profile change): no failover
        rtt = 0.0003 if seq < 20 else 0.085
        assert _probe(path, plan, seq, t, rtt, t + rtt) is None
        t += 0.02
    assert path.srtt is not None and path.srtt > 0.05


def test_monitor_fails_over_after_lost_probes_and_returns_in_order() -> None:
    plan, path = _path()
    t, seq, decisions = 0.0, 0, []
    for _ in range(10):
        seq += 1
        _probe(path, plan, seq, t, 0.001, t + 0.001)
        t += 0.02
    for _ in range(20):  # cut: nothing comes back; the timeout is at least min_rto_ms
        seq += 1
        decisions.append(_probe(path, plan, seq, t, None, t))
        t += 0.02
    first = decisions.index("backup")
    assert first * 0.02 >= plan.min_rto_ms / 1000
    path.on_backup = True
    back = []
    for _ in range(plan.up_after):  # healed: probes answered, while older ones expire
        seq += 1
        back.append(_probe(path, plan, seq, t, 0.001, t + 0.001))
        t += 0.02
        path.expire(plan, t + 1.0)  # every probe sent in the cut is now past its timeout
    assert back[-1] == "primary" and back[:-1] == [None] * (plan.up_after - 1)
