"""The backup path: cutting a device's primary link moves its traffic to the backup link, and
healing it moves the traffic back; every switch is logged with its time. The backup links carry
their own profile, on both backends, next to the primary links' (one rule set, one holder)."""

from __future__ import annotations

import contextlib
import ipaddress
import struct
import threading
import time
from pathlib import Path

import pytest

from agents.failover import socket_in
from testbed.core.errors import ImpairmentError
from testbed.labs.backup import (
    BACKUP_IFACE,
    PLAN_FILE,
    backup_port,
    backup_site,
    build_backup,
    default_backup_subnet,
    failover_log,
    load_plan,
    monitor_tag,
    read_failovers,
)
from testbed.labs.discover import tagged_processes
from testbed.labs.system import SystemRunner
from testbed.links.api import Impairment, apply, apply_each, clear, current, verify
from testbed.links.nfqueue import BACKUP_QUEUE_BASE, Rule, holder_config, plan_rules, restore_text
from testbed.links.paths import impaired_paths
from testbed.links.probe import probe_backup, probe_link
from testbed.links.tcnetem import TcNetemBackend
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import Topology

TRAFFIC_PORT = 9900
PACKET = struct.Struct("!Qd")


def test_default_backup_subnet_follows_the_lab_subnet() -> None:
    net = ipaddress.IPv4Network("10.85.7.0/24")
    assert default_backup_subnet(net) == ipaddress.IPv4Network("10.85.8.0/24")


def test_dry_run_prints_the_backup_links(tmp_path: Path) -> None:
    from testbed.labs.emulated import EmulatedLab
    from testbed.labs.setup import LabSetup

    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    setup = LabSetup.build(name="kbdry", devices=2, subnet="10.89.9.0/24", state_dir=str(tmp_path))
    lab = EmulatedLab.up(setup, runner=runner)
    plan = build_backup(lab)
    text = "\n".join(runner.actions)
    assert "ip -n tb-kbdry-sw link add br1 type bridge" in text
    assert (
        "ip link add eth1 netns tb-kbdry-dev2 type veth peer name b-dev2 netns tb-kbdry-sw" in text
    )
    assert "ip -n tb-kbdry-dev2 addr add 10.89.10.3/24 dev eth1" in text
    assert [d.backup_ip for d in plan.devices] == ["10.89.10.2", "10.89.10.3"]
    assert plan.server.backup_ip == "10.89.10.1"
    site = backup_site(lab, plan)
    assert [h.port for h in site.devices] == ["b-dev1", "b-dev2"]
    # backup traffic as it crosses br1: from the device's backup address to the server's primary
    assert [h.ip for h in site.devices] == ["10.89.10.2", "10.89.10.3"]
    assert (site.server.port, site.server.ip) == ("b-server", "10.89.9.1")
    assert site.runtime_dir == lab.runtime_dir / "backup"


def _dry_backup_lab(tmp_path: Path):
    """A dry-run lab of 2 devices with a backup path (a dry run writes no plan: the lab's
    backup plan is the one `up` would make)."""
    from testbed.labs.emulated import EmulatedLab
    from testbed.labs.setup import LabSetup

    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    topo = Topology.star(2, LinkProfile(rtt_ms=85))
    for dev in ("dev1", "dev2"):
        topo.add_link(dev, "server", "5g", LinkProfile(rtt_ms=30), path="backup")
    setup = LabSetup.build(name="kbdry", topology=topo, subnet="10.89.9.0/24", state_dir=tmp_path)
    lab = EmulatedLab.up(setup, runner=runner)
    assert not (lab.runtime_dir / PLAN_FILE).exists()
    return lab, runner


def test_holder_rules_cover_both_paths_with_distinct_queues(tmp_path: Path) -> None:
    lab, _ = _dry_backup_lab(tmp_path)
    wifi, five_g = LinkProfile(rtt_ms=85), LinkProfile(rtt_ms=30, jitter_ms=2)
    paths = impaired_paths(lab, {"dev1": wifi, "dev2": wifi}, {"dev1": five_g, "dev2": five_g})
    rules = [r for p in paths for r in plan_rules(p.site.server, p.devices, p.profiles, p.path)]
    backup = [r for r in rules if r.path == "backup"]
    assert [(r.port, r.src, r.dst) for r in backup] == [
        ("b-dev1", "10.89.10.2", "10.89.9.1"),  # up: enters by the device's backup port
        ("b-server", "10.89.9.1", "10.89.10.2"),  # down: by the server's
        ("b-dev2", "10.89.10.3", "10.89.9.1"),
        ("b-server", "10.89.9.1", "10.89.10.3"),
    ]
    queues = [r.queue for r in rules]
    assert len(set(queues)) == len(queues) == 8
    assert min(r.queue for r in backup) > max(r.queue for r in rules if r.path == "primary")
    text = restore_text(rules)  # one rule set for both paths
    assert "--physdev-in p-dev1" in text and "--physdev-in b-dev1" in text
    setup = holder_config(1, paths[0].devices, {"dev1": wifi}, {"dev1": five_g})
    q_up = BACKUP_QUEUE_BASE + 2
    assert f"queue {q_up} 100000 0 dev1/backup up" in setup
    assert f"phase {q_up} 0 15000 2000 uniform" in setup
    assert "queue 102 100000 0 dev1 up" in setup and "phase 102 0 42500 0 uniform" in setup


def test_dry_run_apply_prints_both_paths(tmp_path: Path) -> None:
    lab, runner = _dry_backup_lab(tmp_path)
    wifi, five_g = LinkProfile(rtt_ms=85), LinkProfile(rtt_ms=40, jitter_ms=2)
    imp = apply_each(lab, {"dev1": wifi}, backend="nfqueue", runner=runner, backup={"dev1": five_g})
    assert imp.backup == {"dev1": five_g}
    text = "\n".join(runner.actions)
    assert "--physdev-in b-dev1 -j NFQUEUE" in text and "--physdev-in p-dev1 -j NFQUEUE" in text


def test_netem_backend_shapes_the_backup_ports(tmp_path: Path) -> None:
    lab, _ = _dry_backup_lab(tmp_path)
    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    state = TcNetemBackend(runner).apply(
        lab, {"dev1": LinkProfile(rtt_ms=85)}, {"dev1": LinkProfile(rtt_ms=30, loss=0.1)}
    )
    text = "\n".join(runner.actions)
    backup_netem = "netem limit 100000 delay 15ms loss random 10%"
    assert f"tc qdisc add dev b-dev1 parent 1:2 handle 2: {backup_netem}" in text
    assert f"tc qdisc add dev b-server parent 1:101 handle 101: {backup_netem}" in text
    assert "match ip src 10.89.10.2/32 match ip dst 10.89.9.1/32 flowid 1:101" in text
    assert "tc qdisc add dev p-dev1 parent 1:2 handle 2: netem limit 100000 delay 42.5ms" in text
    assert state["shaped_ports"] == ["p-dev1", "p-server", "b-dev1", "b-server"]


def test_backup_profiles_need_a_backup_path(tmp_path: Path) -> None:
    from testbed.labs.emulated import EmulatedLab
    from testbed.labs.setup import LabSetup

    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    setup = LabSetup.build(name="kbno", devices=1, subnet="10.89.11.0/24", state_dir=tmp_path)
    lab = EmulatedLab.up(setup, runner=runner)
    with pytest.raises(ImpairmentError, match="no backup path"):
        apply_each(lab, {}, backend="nfqueue", runner=runner, backup={"dev1": LinkProfile()})


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
        "add table bridge kcut\n"
        "add chain bridge kcut cutchain { type filter hook forward priority 0; }\n"
        f'add rule bridge kcut cutchain iifname "{port}" drop\n'
        f'add rule bridge kcut cutchain oifname "{port}" drop\n'
    )
    runner.run(["nft", "-f", "-"], netns=sw, input=rules)


def test_cut_moves_traffic_to_backup_and_back(root_netns: None, tmp_path: Path) -> None:
    from testbed.labs.emulated import EmulatedLab
    from testbed.labs.setup import LabSetup

    topo = Topology.star(1, LinkProfile(rtt_ms=0))
    topo.add_link("dev1", "server", "5g", LinkProfile(rtt_ms=0), path="backup")
    setup = LabSetup.build(
        name="kbk", topology=topo, subnet="10.89.7.0/24", state_dir=str(tmp_path)
    )
    lab = EmulatedLab.up(setup)  # a topology with backup links: the lab adds path and monitor
    try:
        plan = load_plan(lab)
        assert plan is not None
        log = failover_log(lab)
        assert [pid for pid, _ in tagged_processes(monitor_tag("kbk"))]
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
        lab.runner.run(["nft", "delete", "table", "bridge", "kcut"], netns=lab.bridge_netns)
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
    from testbed.labs.clean import leftovers

    assert leftovers("kbk") == []
    assert tagged_processes(monitor_tag("kbk")) == []


def _rules(imp: Impairment, lab) -> list[Rule]:
    """The holder's queue rules for both paths of `imp`."""
    paths = impaired_paths(lab, imp.profiles, imp.backup)
    return [r for p in paths for r in plan_rules(p.site.server, p.devices, p.profiles, p.path)]


def _on_backup(lab, netns: str, server_ip: str) -> bool:
    """Does the device's traffic to the server take the backup interface now?"""
    out = lab.runner.run(
        ["ip", "route", "show", f"{server_ip}/32"], netns=netns, query=True, check=False
    ).stdout
    return f"dev {BACKUP_IFACE}" in out


def test_backup_link_carries_its_own_profile_after_a_cut(root_netns: None, tmp_path: Path) -> None:
    from testbed.labs.clean import leftovers
    from testbed.labs.emulated import EmulatedLab
    from testbed.labs.setup import LabSetup
    from testbed.links.nfqueue import holder_tag

    wifi, five_g = LinkProfile(rtt_ms=10), LinkProfile(rtt_ms=30)
    topo = Topology.star(1, wifi)
    topo.add_link("dev1", "server", "5g", five_g, path="backup")
    setup = LabSetup.build(
        name="kbp", topology=topo, subnet="10.89.1.0/24", state_dir=str(tmp_path)
    )
    lab = EmulatedLab.up(setup)
    try:
        plan = load_plan(lab)
        assert plan is not None
        dev, server = plan.devices[0], plan.server
        imp = apply_each(lab, {"dev1": wifi}, backup={"dev1": five_g})  # auto: netem or holder
        assert imp.profiles == {"dev1": wifi} and imp.backup == {"dev1": five_g}
        # each path measures as its own profile; the backup is probed over eth1, before any cut
        primary = probe_link(lab, "dev1", count=100, interval_ms=5)
        assert primary.rtt_ms is not None and abs(primary.rtt_ms.p50 - 10) <= 1.0
        backup = probe_backup(lab, {"dev1": five_g}, count=100, interval_ms=5)["dev1"]
        assert backup.received_back == 100 and abs(backup.rtt_ms.p50 - 30) <= 1.0
        # a new primary profile leaves the backup's impairment in place (one rule set for both)
        imp = apply(lab, LinkProfile(rtt_ms=20))
        assert current(lab).backup == {"dev1": five_g}
        assert verify(lab) is not None
        if imp.backend == "nfqueue":  # verify checks the backup path's rules too
            rule = [r for r in _rules(imp, lab) if r.path == "backup"][0]
            lab.runner.run(
                ["iptables", "-t", "mangle", "-D", *rule.args()[1:]], netns=lab.bridge_netns
            )
            with pytest.raises(ImpairmentError, match="missing rule: .*b-dev1"):
                verify(lab)
            apply_each(lab, {})  # re-applies what is recorded: both paths
            assert verify(lab) is not None
        # cut the primary: the device's traffic moves to the backup path, 30 ms away (not ~0)
        _cut(lab.runner, lab.bridge_netns, lab.host("dev1").port)
        assert _wait_for(lambda: _on_backup(lab, dev.netns, server.primary_ip), 10)
        moved = probe_link(lab, "dev1", requested=five_g, count=100, interval_ms=5)
        assert moved.received_back == 100 and abs(moved.rtt_ms.p50 - 30) <= 1.0
        print(f"\nafter the cut: rtt p50 {moved.rtt_ms.p50:.2f} ms over the 30 ms backup link")
        lab.runner.run(["nft", "delete", "table", "bridge", "kcut"], netns=lab.bridge_netns)
        assert clear(lab) is None and current(lab) is None  # both paths, checked gone
        saved = lab.runner.run(["iptables-save", "-t", "mangle"], netns=lab.bridge_netns).stdout
        assert "NFQUEUE" not in saved
        qdiscs = lab.runner.run(["tc", "qdisc", "show"], netns=lab.bridge_netns).stdout
        assert "htb" not in qdiscs and "netem" not in qdiscs
        assert tagged_processes(holder_tag("kbp")) == []
    finally:
        lab.down()
    assert leftovers("kbp") == []


def _path():
    from agents.failover import MonitorPlan, PrimaryPath
    from testbed.labs.backup import BackupPlan, PathEnd

    end = PathEnd(name="dev1", netns="x", primary_ip="10.0.0.2", backup_ip="10.0.1.2")
    plan = BackupPlan(lab="h", subnet="10.0.1.0/24", server=end, devices=[end])
    monitored = MonitorPlan.from_json(plan.model_dump_json())  # as the monitor reads it
    return monitored, PrimaryPath(monitored.devices[0], sock=None)  # type: ignore[arg-type]


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
