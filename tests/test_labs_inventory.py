"""Lab kind `inventory`: a physical lab from an Ansible inventory, links impaired on a
middlebox or on the hosts themselves.

The live tests describe a namespace lab's hosts in an inventory file alone (the bridge
namespace is the middlebox, reached with `ansible_connection: local`; or no middlebox, each
host reached over SSH like a Pi), so the code that runs is the physical lab's, not the
namespace lab's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import require_root_netns

from testbed.core.errors import BadInputError
from testbed.hosts.inventory import InventoryHost, inventory_document, load_inventory
from testbed.labs import EmulatedLab, LabSetup, SystemRunner, lab_class
from testbed.labs.physical import InventoryLab, describe_namespace_lab
from testbed.links.api import apply, clear
from testbed.links.probe import probe_links, probe_packets
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import Topology


def describe_as_inventory(lab: EmulatedLab, path: Path, middlebox: dict) -> Path:
    """An inventory of `lab`'s hosts with their middlebox ports and the given middlebox."""
    hosts = [h.model_copy(update={"vars": {**h.vars, "middlebox_port": lab.host(h.name).port}})
             for h in lab.inventory_hosts()]  # fmt: skip
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **middlebox)
    path.write_text(yaml.safe_dump(inventory_document([*hosts, mb], {"lab_kind": "physical"})))
    return path


LOCAL = {"address": "localhost", "user": "root", "vars": {"ansible_connection": "local"}}


def planned_namespace_lab(tmp_path: Path, topology: Topology | None = None) -> EmulatedLab:
    """A namespace lab as planned by a dry run (nothing is created): hosts to describe."""
    setup = LabSetup(name="adry", topology=topology or Topology.star(2), subnet="10.78.2.0/24",
                   state_dir=tmp_path / "ns")  # fmt: skip
    return EmulatedLab.up(setup, runner=SystemRunner(dry_run=True, echo=lambda _l: None))


def dry_lab(tmp_path: Path, middlebox: dict) -> tuple[InventoryLab, list[str]]:
    printed: list[str] = []
    ns = planned_namespace_lab(tmp_path)
    inv = describe_as_inventory(ns, tmp_path / "inv.yml", middlebox)
    setup = LabSetup(name="adryp", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    return InventoryLab.up(setup, runner=SystemRunner(dry_run=True, echo=printed.append)), printed


def test_kind_registry_knows_the_three_kinds():
    assert lab_class("namespaces") is EmulatedLab
    assert lab_class("inventory") is InventoryLab
    with pytest.raises(BadInputError, match="expected one of namespaces, mininet, inventory"):
        lab_class("emulated")


def test_impairment_commands_go_over_ssh_to_the_middlebox(tmp_path):
    lab, printed = dry_lab(tmp_path, {"address": "192.0.2.9", "user": "root"})
    assert [h.name for h in lab.devices] == ["dev1", "dev2"]
    # the holder the site playbook built on the middlebox: its facts read there (printed)
    (read,) = [line for line in printed if "/tmp/facts/netem.json" in line]
    assert "ssh " in read and "root@192.0.2.9" in read and lab.holder_path is None
    apply(lab, LinkProfile(rtt_ms=85, loss=0.1), backend="nfqueue")
    tc_or_rules = [line for line in printed if "iptables" in line or " tc " in line]
    assert tc_or_rules
    assert all("ssh " in line and "root@192.0.2.9" in line for line in tc_or_rules)
    assert any("--physdev-in p-dev1" in line for line in printed)
    # the holder's setup is written, and the holder started, on the middlebox too
    holder = [line for line in printed if "holder.conf" in line]
    assert any("cat >" in line for line in holder) and any("setsid" in line for line in holder)
    assert all("root@192.0.2.9" in line for line in holder)


def test_host_without_a_middlebox_port_is_named(tmp_path):
    ns = planned_namespace_lab(tmp_path, Topology.star(1))
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **LOCAL)
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(inventory_document([*ns.inventory_hosts(), mb], {})))
    with pytest.raises(
        BadInputError,
        match="host 'server': middlebox_port: expected the name of the interface of middlebox mb",
    ):
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))


def test_inventory_without_middlebox_needs_each_hosts_link_interface(tmp_path):
    ns = planned_namespace_lab(tmp_path, Topology.star(1))
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(inventory_document(ns.inventory_hosts(), {})))
    with pytest.raises(
        BadInputError,
        match=r"host 'server': link_iface: expected the name of "
        r"its interface on the link \(the inventory has no middlebox\), got None",
    ):
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))
    local = [h.model_copy(update={"vars": {"link_iface": "eth0", "ansible_connection": "local"}})
             for h in ns.inventory_hosts()]  # fmt: skip
    path.write_text(yaml.safe_dump(inventory_document(local, {})))
    with pytest.raises(BadInputError, match="host 'server': ansible_connection: expected ssh"):
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))


def test_inventory_without_hosts_of_the_topology_is_refused(tmp_path):
    """Checked before any host is contacted: the inventory has no device of the class."""
    server = InventoryHost(name="server", role="server", address="h", user="u", workdir="/w",
                           host_class="a100", vars={"middlebox_port": "e0"})  # fmt: skip
    jetson = InventoryHost(name="jetson-1", role="device", address="j", user="u", workdir="/w",
                           host_class="jetson-orin-nano",
                           vars={"middlebox_port": "e1"})  # fmt: skip
    path = tmp_path / "inv.yml"
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **LOCAL)
    path.write_text(yaml.safe_dump(inventory_document([server, jetson, mb], {})))
    with pytest.raises(
        BadInputError,
        match=r"topology star needs 2 device\(s\) of class pi5 \(group drafters, host_class: "
        r"pi5\); the inventory's drafters: jetson-1 \(host_class jetson-orin-nano\)",
    ):
        InventoryLab.up(LabSetup(name="x", topology=Topology.star(2), inventory=path))


def test_two_hosts_on_one_middlebox_port_are_refused(tmp_path):
    ns = planned_namespace_lab(tmp_path, Topology.star(2))
    hosts = [h.model_copy(update={"vars": {"middlebox_port": "wlan0"}})
             for h in ns.inventory_hosts()]  # fmt: skip
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **LOCAL)
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(inventory_document([*hosts, mb], {})))
    with pytest.raises(BadInputError, match=r"hosts 'server' and 'dev1': middlebox_port: both "
                       r"'wlan0'; expected one middlebox port per host"):  # fmt: skip
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))


@pytest.fixture(scope="module")
def namespace_hosts(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    setup = LabSetup(name="ainv", devices=2, subnet="10.78.1.0/24",
                   state_dir=tmp_path_factory.mktemp("ainv"))  # fmt: skip
    with EmulatedLab.running(setup) as lab:
        yield lab


def test_physical_path_impairs_and_measures_the_namespace_hosts(namespace_hosts, tmp_path):
    """Through the middlebox, with the holder the site playbook built there (its
    facts/netem.json names a copy of this machine's build, which must be what runs)."""
    import json
    import os
    import shutil

    from testbed.hosts import HostControl
    from testbed.links.holder_build import find_holder
    from testbed.links.nfqueue import held_up, release_counts, site_holder

    ns = namespace_hosts
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml")
    built = tmp_path / "mb-bin" / "tb-holder"
    built.parent.mkdir()
    shutil.copy2(find_holder().argv[0], built)
    facts = ns.runtime_dir / "facts" / "netem.json"  # the middlebox's workdir
    facts.parent.mkdir(parents=True, exist_ok=True)
    facts.write_text(json.dumps({"sch_netem": False, "backend": "userspace",
                                 "holder_path": str(built)}))  # fmt: skip
    setup = LabSetup(name="ainvp", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    said: list[str] = []
    lab = InventoryLab.up(setup, progress=said.append)
    # the hosts were not provisioned by the site playbook: read leniently, kept, said once
    assert lab.inventory().hosts == load_inventory(inv).hosts
    assert lab.from_facts == {"mb": {"holder_path": str(built)}}
    assert lab.holder_path == str(built)
    assert lab.without_facts == ["server", "dev1", "dev2"]
    assert [m for m in said if "facts" in m] == [
        f"from the site playbook's facts: mb holder_path {built}",
        "no site playbook facts on server, dev1, dev2 (facts/models.json, facts/netem.json, "
        "facts/host.json): "
        "their inventory variables are used as is",
    ]
    try:
        with HostControl(lab.inventory()) as hosts:
            assert all(r.ok for r in hosts.run_all("true").values())
        first = apply(lab, LinkProfile(rtt_ms=40), backend="nfqueue")
        pid = site_holder(lab, lab.runner).pid()
        assert pid is not None and os.readlink(f"/proc/{pid}/exe") == str(built)
        probes = probe_links(lab, count=40, interval_ms=5)
        assert set(probes) == {"dev1", "dev2"}
        for r in probes.values():
            assert r.rtt_ms is not None and abs(r.rtt_ms.p50 - 40) < 3, r
        second = apply(lab, LinkProfile(rtt_ms=20), backend="nfqueue")  # a reload
        assert site_holder(lab, lab.runner).pid() == pid
        for r in probe_links(lab, count=20, interval_ms=5).values():
            assert r.rtt_ms is not None and abs(r.rtt_ms.p50 - 20) < 3, r
    finally:
        clear(lab)
        released = release_counts(lab)  # written by the holder as it stopped
        spells = held_up(lab)
        lab.down()
    # the holder counted every probe through each direction of both links, per profile
    generations = [imp.backend_state["holder_generation"] for imp in (first, second)]
    assert generations[1] == generations[0] + 1
    for generation, probed in zip(generations, (40, 20)):
        mine = [c for c in released if c.generation == generation]
        assert sorted((c.link, c.direction) for c in mine) == [
            ("dev1", "down"), ("dev1", "up"), ("dev2", "down"), ("dev2", "up"),
        ]  # fmt: skip
        # the probes, and the probe's warm-up datagrams (0.2-3 s, one per 20 ms)
        assert all(probed <= c.released <= probed + 150 for c in mine), mine
        assert all(0 <= c.late_over_500us <= c.released for c in mine)
    # and, per generation, the spells in which neither of its releasers ran
    assert [h.generation for h in spells] == generations
    assert all(h.spells >= 0 and h.total_ms >= h.longest_ms * min(h.spells, 1) for h in spells)
    probes = probe_links(lab, count=20, interval_ms=5)
    assert all(r.rtt_ms is not None and r.rtt_ms.p50 < 5 for r in probes.values())


def test_an_inventory_without_topology_is_its_own_star(tmp_path):
    from testbed.labs.physical import inventory_topology

    ns = planned_namespace_lab(tmp_path, Topology.star(3, device_class="jetson-orin-nano"))
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml")
    topo = inventory_topology(load_inventory(inv), LinkProfile(rtt_ms=30))
    assert [d.name for d in topo.devices] == ["dev1", "dev2", "dev3"]
    assert topo.class_counts() == {"jetson-orin-nano": 3}
    assert {p.rtt_ms for p in topo.profiles().values()} == {30}


def test_lab_impair_command_works_on_an_inventory(tmp_path):
    from typer.testing import CliRunner

    from testbed.cli import app

    ns = planned_namespace_lab(tmp_path)
    inv = describe_as_inventory(ns, tmp_path / "inv.yml", {"address": "192.0.2.9", "user": "root"})
    res = CliRunner().invoke(app, ["lab", "impair", "--inventory", str(inv), "--name", "adryp",
                                   "--state-dir", str(tmp_path / "p"), "--backend", "nfqueue",
                                   "-d", "dev2", "--dry-run"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rules = [line for line in res.output.splitlines() if "iptables" in line]
    assert rules and all("root@192.0.2.9" in line for line in rules)
    assert "p-dev2" in res.output and "p-dev1" not in res.output


def test_without_a_middlebox_each_host_impairs_its_own_links(tmp_path):
    ns = planned_namespace_lab(tmp_path)
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml", middlebox=False)
    printed: list[str] = []
    setup = LabSetup(name="adryh", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    lab = InventoryLab.up(setup, runner=SystemRunner(dry_run=True, echo=printed.append))
    assert lab.impaired_on_hosts and lab.describe()["impaired_on"] == "hosts"
    # the site playbook's facts (models, netem, host): reads printed, nothing contacted
    reads = [line for line in printed if "/facts/" in line]
    assert len(reads) == 9 and all(line.startswith("[dry-run] ssh root@") for line in reads)
    assert lab.from_facts == {} and lab.without_facts == []
    server, dev1, dev2 = (f"root@{lab.host(n).ip}" for n in ("server", "dev1", "dev2"))
    apply(lab, LinkProfile(rtt_ms=85, loss=0.1), backend="nfqueue")
    commands = [line for line in printed if "ssh " in line]
    assert commands and all("iptables" not in line or "OUTPUT" not in line for line in printed)
    # up is held on the server's ingress (a queue per device), down on each device's ingress
    text = "\n".join(printed)
    assert "-A TB-HOLD -s 10.78.2.2/32 -d 10.78.2.1/32 -i eth0 -j NFQUEUE --queue-num 102" in text
    assert "-A TB-HOLD -s 10.78.2.3/32 -d 10.78.2.1/32 -i eth0 -j NFQUEUE --queue-num 104" in text
    assert "-A TB-HOLD -s 10.78.2.1/32 -d 10.78.2.2/32 -i eth0 -j NFQUEUE --queue-num 103" in text
    starts = [line for line in commands if "setsid" in line]
    assert [next(h for h in (server, dev1, dev2) if h in line) for line in starts] == [
        server, dev1, dev2]  # fmt: skip
    printed.clear()
    apply(lab, LinkProfile(rtt_ms=85, loss=0.1), backend="netem")
    netem = [line for line in printed if " netem " in line]
    # on the sender's egress: the server one class per device, each device one to the server
    assert sum(server in line for line in netem) == 2
    assert sum(dev1 in line for line in netem) == sum(dev2 in line for line in netem) == 1
    assert all("delay 42.5ms loss random 10%" in line for line in netem)


def test_hosts_impair_their_own_links_live(namespace_hosts, tmp_path):
    """Without a middlebox, over SSH to each namespace host: RTT and loss as requested, one
    device's profile changed alone, its changes logged on the hosts, and all of it removed."""
    from testbed.config.playbook import ImpairmentSection
    from testbed.links.api import current, link_changes
    from testbed.links.hostside import hosts_have_netem
    from testbed.runner.link_guard import probe_checked

    ns = namespace_hosts
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml", middlebox=False)
    setup = LabSetup(name="ainvh", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    lab = InventoryLab.up(setup)
    try:
        asked = LinkProfile(rtt_ms=40, loss=0.1, seed=5)
        imp = apply(lab, asked)
        assert imp.backend == ("netem" if hosts_have_netem(lab) else "nfqueue")
        # through the runs' own link guard, with one more probe after a failed one (a VM stall)
        record: dict = {}
        probe_checked(record, lambda: probe_links(lab, count=200, interval_ms=5),
                      {d.name: asked for d in lab.devices}, ImpairmentSection(),
                      lambda: None, lambda _m: None)  # fmt: skip
        # held on the receiving hosts after the kernel stamped them, every probe datagram was
        # timed by the holder's release stamp, so the guard kept its kernel-stamp tolerance
        # (netem on the hosts holds on the sender's egress, and kernel stamps time it)
        assert record["rtt_tolerance_ms"] == 1.0
        for r in record["probes"].values():
            assert abs(r["rtt_ms"]["p50"] - 40) <= record["rtt_tolerance_ms"], r
            assert r["loss_up"]["within"] and r["loss_down"]["within"], r
            if imp.backend == "nfqueue":
                assert r["rx_user_space"] == 0 and r["rx_wake_ms_p50"] > 0, r
        # a full-size datagram (its IP packet 1,500 bytes, an Ethernet MTU) is stamped as well
        full = probe_packets(lab, "dev1", asked, count=40, interval_ms=5, size=1472)
        assert len(full.rtt_ms) >= 20, full
        if imp.backend == "nfqueue":
            assert full.rx_user_space == 0 and min(full.rx_wake_ms) > 0, full
        apply(lab, LinkProfile(rtt_ms=20), devices=["dev2"])
        probes = probe_links(lab, count=100, interval_ms=5)
        # which profile each link now has (they are 20 ms apart); fidelity is checked above,
        # over 200 packets, and a median of a few dozen can move 1.5 ms in one VM stall
        assert (
            abs(probes["dev1"].rtt_ms.p50 - 40) < 3 and abs(probes["dev2"].rtt_ms.p50 - 20) < 3
        ), probes
        assert current(lab).profiles["dev1"].loss == 0.1
        if imp.backend == "nfqueue":
            logged = {(c["link"], c["direction"], c["delay_us"]) for c in link_changes(lab)}
            assert {("dev1", "up", 20000), ("dev1", "down", 20000)} <= logged
            assert {("dev2", "up", 10000), ("dev2", "down", 10000)} <= logged
    finally:
        clear(lab)  # checks that no class, rule or holder is left on any host
        lab.down()
    probes = probe_links(lab, count=20, interval_ms=5)
    assert all(r.rtt_ms is not None and r.rtt_ms.p50 < 5 for r in probes.values())


def test_calibrate_on_the_hosts_measures_a_rate_limit(namespace_hosts, tmp_path):
    """`testbed lab calibrate --inventory` on a lab impaired on its hosts. A rate limit on the
    sender's own egress backs its socket up: the blast waits for room, and the responder, whose
    echoes queue there too, still reports and exits."""
    import json

    from typer.testing import CliRunner

    from testbed.cli import app

    ns = namespace_hosts
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml", middlebox=False)
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("r5: {rtt_ms: 10, rate_mbit: 5}\n")
    args = ["lab", "calibrate", "--inventory", str(inv), "--name", "ainvr",
            "--profiles", str(profiles),
            "--state-dir", str(tmp_path / "p"), "-d", "dev1", "--count", "100", "--interval", "2",
            "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (row,) = [json.loads(line) for line in res.output.splitlines() if line.startswith("{")]
    assert (row["profile"], row["device"]) == ("r5", "dev1")
    # UDP payload of 1200-byte datagrams on a 5 Mbit/s link: 1200/1242 of it, not more
    assert row["throughput_mbit"] is not None and 4.0 < row["throughput_mbit"] <= 5.0, row
    assert abs(row["rtt_p50_ms"] - 10) < 1.0 and row["loss_up"]["lost"] == 0, row


def backup_topology(devices: int = 2) -> Topology:
    """A star on 10 ms Wi-Fi with a 30 ms 5G backup link per device."""
    topo = Topology.star(devices, LinkProfile(rtt_ms=10))
    for i in range(1, devices + 1):
        topo.add_link(f"dev{i}", "server", "5g", LinkProfile(rtt_ms=30), path="backup")
    return topo


def test_a_backup_topology_needs_each_hosts_backup_address(tmp_path):
    ns = planned_namespace_lab(tmp_path, backup_topology(1))
    path = tmp_path / "inv.yml"
    hosts = [h.model_copy(update={"vars": {"link_iface": "eth0"}}) for h in ns.inventory_hosts()]
    path.write_text(yaml.safe_dump(inventory_document(hosts, {})))
    with pytest.raises(BadInputError, match="host 'server': backup_ip: expected its address on "):
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))
    bad = [h.model_copy(update={"vars": {**h.vars, "backup_ip": "10.1.1.300"}}) for h in hosts]
    path.write_text(yaml.safe_dump(inventory_document(bad, {})))
    with pytest.raises(
        BadInputError, match="backup_ip: expected an IPv4 address, got '10.1.1.300'"
    ):
        InventoryLab.up(LabSetup(name="x", topology=ns.topology, inventory=path))


@pytest.fixture(scope="module")
def namespace_hosts_with_backup(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    setup = LabSetup(name="abk", topology=backup_topology(), subnet="10.78.4.0/24",
                   state_dir=tmp_path_factory.mktemp("abk"))  # fmt: skip
    with EmulatedLab.running(setup) as lab:
        yield lab


@pytest.mark.parametrize("middlebox", [True, False], ids=["middlebox", "hosts"])
def test_inventory_lab_impairs_its_backup_path(namespace_hosts_with_backup, tmp_path, middlebox):
    """A physical lab with a backup path declared in its inventory: both paths impaired in one
    go (through the middlebox, or on the hosts), each measuring as its own profile."""
    from testbed.config.playbook import ImpairmentSection
    from testbed.links.api import apply_each
    from testbed.links.plan import backup_profiles
    from testbed.links.probe import probe_backup
    from testbed.runner.link_guard import probe_checked

    ns = namespace_hosts_with_backup
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml", middlebox)
    setup = LabSetup(name="abkp", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    lab = InventoryLab.up(setup)
    assert lab.backup_plan is not None and lab.impaired_on_hosts is not middlebox
    try:
        wifi = {d.name: ns.topology.link(d.name).profile for d in lab.devices}
        backup = backup_profiles(lab, list(wifi))
        assert {p.rtt_ms for p in backup.values()} == {30}
        imp = apply_each(lab, wifi, backup=backup)
        assert imp.backup == backup
        # through the runs' own link guard: one more probe after a failed one (a VM stall)
        paths = (
            (wifi, lambda: probe_links(lab, count=50, interval_ms=5), 10),
            (backup, lambda: probe_backup(lab, backup, count=50, interval_ms=5), 30),
        )
        for profiles, probe, rtt_ms in paths:
            record: dict = {}
            probe_checked(record, probe, profiles, ImpairmentSection(), lambda: None,
                          lambda _m: None)  # fmt: skip
            for r in record["probes"].values():
                assert abs(r["rtt_ms"]["p50"] - rtt_ms) <= record["rtt_tolerance_ms"], r
                assert profiles is wifi or r["received_back"] == 50, r
                # held on the hosts' ingress, both paths' echoes timed by release stamps
                held = not middlebox and imp.backend == "nfqueue"
                assert r["rx_user_space"] == (0 if held else None), r
    finally:
        clear(lab)
        lab.down()
