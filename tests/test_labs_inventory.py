"""Lab kind `inventory`: a physical lab from an Ansible inventory, links impaired on a middlebox.

The live test describes a namespace lab's hosts in an inventory file alone (the bridge
namespace is the middlebox, reached with `ansible_connection: local`), so the code that runs
is the physical lab's, not the namespace lab's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import require_root_netns

from testbed.errors import BadInputError
from testbed.hosts.inventory import InventoryHost, inventory_document
from testbed.lab import EmulatedLab, LabSpec, SystemRunner, lab_class
from testbed.lab.physical import InventoryLab, describe_namespace_lab
from testbed.netem.api import apply, clear
from testbed.netem.probe import probe_links
from testbed.netem.profile import LinkProfile
from testbed.topo.model import Topology


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
    spec = LabSpec(name="adry", topology=topology or Topology.star(2), subnet="10.78.2.0/24",
                   state_dir=tmp_path / "ns")  # fmt: skip
    return EmulatedLab.up(spec, runner=SystemRunner(dry_run=True, echo=lambda _l: None))


def dry_lab(tmp_path: Path, middlebox: dict) -> tuple[InventoryLab, list[str]]:
    printed: list[str] = []
    ns = planned_namespace_lab(tmp_path)
    inv = describe_as_inventory(ns, tmp_path / "inv.yml", middlebox)
    spec = LabSpec(name="adryp", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    return InventoryLab.up(spec, runner=SystemRunner(dry_run=True, echo=printed.append)), printed


def test_kind_registry_knows_the_three_kinds():
    assert lab_class("namespaces") is EmulatedLab
    assert lab_class("inventory") is InventoryLab
    with pytest.raises(BadInputError, match="expected one of namespaces, mininet, inventory"):
        lab_class("emulated")


def test_impairment_commands_go_over_ssh_to_the_middlebox(tmp_path):
    lab, printed = dry_lab(tmp_path, {"address": "192.0.2.9", "user": "root"})
    assert [h.name for h in lab.devices] == ["dev1", "dev2"]
    apply(lab, LinkProfile(rtt_ms=85, loss=0.1), backend="nfqueue")
    tc_or_rules = [line for line in printed if "iptables" in line or " tc " in line]
    assert tc_or_rules
    assert all("ssh " in line and "root@192.0.2.9" in line for line in tc_or_rules)
    assert any("--physdev-in p-dev1" in line for line in printed)


def test_host_without_a_middlebox_port_is_named(tmp_path):
    ns = planned_namespace_lab(tmp_path, Topology.star(1))
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **LOCAL)
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(inventory_document([*ns.inventory_hosts(), mb], {})))
    with pytest.raises(BadInputError, match="host 'server': missing middlebox_port"):
        InventoryLab.up(LabSpec(name="x", topology=ns.topology, inventory=path))


def test_inventory_without_middlebox_or_hosts_is_refused(tmp_path):
    server = InventoryHost(name="server", role="server", address="h", user="u", workdir="/w",
                           vars={"middlebox_port": "e0"})  # fmt: skip
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(inventory_document([server], {})))
    with pytest.raises(BadInputError, match="middleboxes: expected one host"):
        InventoryLab.up(LabSpec(name="x", inventory=path))
    mb = InventoryHost(name="mb", role="middlebox", workdir="/tmp", **LOCAL)
    path.write_text(yaml.safe_dump(inventory_document([server, mb], {})))
    with pytest.raises(BadInputError, match=r"needs host\(s\) \['dev1', 'dev2'\]"):
        InventoryLab.up(LabSpec(name="x", topology=Topology.star(2), inventory=path))


@pytest.fixture(scope="module")
def namespace_hosts(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    spec = LabSpec(name="ainv", devices=2, subnet="10.78.1.0/24",
                   state_dir=tmp_path_factory.mktemp("ainv"))  # fmt: skip
    with EmulatedLab.running(spec) as lab:
        yield lab


def test_physical_path_impairs_and_measures_the_namespace_hosts(namespace_hosts, tmp_path):
    from testbed.hosts import HostControl

    ns = namespace_hosts
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml")
    spec = LabSpec(name="ainvp", topology=ns.topology, inventory=inv, state_dir=tmp_path / "p")
    lab = InventoryLab.up(spec)
    try:
        with HostControl(lab.inventory()) as hosts:
            assert all(r.ok for r in hosts.run_all("true").values())
        apply(lab, LinkProfile(rtt_ms=40), backend="nfqueue")
        probes = probe_links(lab, count=40, interval_ms=5)
        assert set(probes) == {"dev1", "dev2"}
        for r in probes.values():
            assert r.rtt_ms is not None and abs(r.rtt_ms.p50 - 40) < 3, r
    finally:
        clear(lab)
        lab.down()
    probes = probe_links(lab, count=20, interval_ms=5)
    assert all(r.rtt_ms is not None and r.rtt_ms.p50 < 5 for r in probes.values())


def test_an_inventory_without_topology_is_its_own_star(tmp_path):
    from testbed.lab.physical import inventory_topology

    ns = planned_namespace_lab(tmp_path, Topology.star(3, device_class="jetson-orin-nano"))
    inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml")
    from testbed.hosts.inventory import load_inventory

    topo = inventory_topology(load_inventory(inv), LinkProfile(rtt_ms=30))
    assert [d.name for d in topo.devices] == ["dev1", "dev2", "dev3"]
    assert topo.class_counts() == {"jetson-orin-nano": 3}
    assert {p.rtt_ms for p in topo.profiles().values()} == {30}


def test_lab_impair_command_works_on_an_inventory(tmp_path):
    from typer.testing import CliRunner

    from testbed.commands.lab import app

    ns = planned_namespace_lab(tmp_path)
    inv = describe_as_inventory(ns, tmp_path / "inv.yml", {"address": "192.0.2.9", "user": "root"})
    res = CliRunner().invoke(app, ["impair", "--inventory", str(inv), "--name", "adryp",
                                   "--state-dir", str(tmp_path / "p"), "--backend", "nfqueue",
                                   "-d", "dev2", "--dry-run"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rules = [line for line in res.output.splitlines() if "iptables" in line]
    assert rules and all("root@192.0.2.9" in line for line in rules)
    assert "p-dev2" in res.output and "p-dev1" not in res.output
