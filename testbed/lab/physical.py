"""Lab kind `inventory`: a physical lab whose hosts an Ansible inventory lists.

Nothing is created: the hosts exist (Ansible provisioned them) and are reached over SSH by the
Fabric layer. Links are impaired on a middlebox the inventory names, a machine every
device <-> server packet crosses (a Linux router or bridge between the devices' Wi-Fi and the
server), with the same backends as the namespace lab's bridge namespace:

    all:
      children:
        verifiers: {hosts: {server: {ansible_host: 10.0.0.1, middlebox_port: eth1, ...}}}
        drafters: {hosts: {dev1: {ansible_host: 10.0.0.2, middlebox_port: wlan0, ...}}}
        middleboxes:
          hosts:
            mb: {ansible_host: 10.0.0.254, ansible_user: root, workdir: /root}
            # or `ansible_connection: local` (the controller routes), with `netns: NAME`
            # when the forwarding point is a namespace on it

`middlebox_port` is the middlebox interface that faces the host. Commands for the middlebox
run over `ssh` (or locally when `ansible_connection: local`), through the lab's SystemRunner,
so dry runs print them per host.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import yaml

from testbed.errors import BadInputError, LabError
from testbed.hosts.inventory import Inventory, InventoryHost, inventory_document, load_inventory
from testbed.lab.interface import LinkSite
from testbed.lab.spec import LabHost, LabSpec
from testbed.lab.system import SystemRunner
from testbed.netem.profile import LinkProfile
from testbed.topo.model import Topology

PORT_VAR = "middlebox_port"


def middlebox_runner(mb: InventoryHost, base: SystemRunner) -> SystemRunner:
    """A runner whose commands run on middlebox `mb`: over `ssh`, or here when the inventory
    says `ansible_connection: local`."""
    remote: tuple[str, ...] = ()
    if mb.vars.get("ansible_connection") != "local":
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
        if mb.key_file:
            argv += ["-i", str(mb.key_file)]
        remote = (*argv, "-p", str(mb.port), f"{mb.user}@{mb.address}", "--")
    return SystemRunner(dry_run=base.dry_run, echo=base.echo, remote=remote)


class InventoryLab:
    """A physical lab (kind `inventory`); see the module docstring."""

    kind: ClassVar[str] = "inventory"

    def __init__(
        self,
        spec: LabSpec,
        inventory: Inventory,
        runner: SystemRunner,
    ) -> None:
        self._spec = spec
        self._inventory = inventory
        if not inventory.middleboxes:
            raise BadInputError(
                f"{inventory.source}: middleboxes: expected one host where links are impaired "
                "(impairing with tc on the hosts themselves is not supported yet)"
            )
        self.middlebox = inventory.middleboxes[0]
        self.runner = middlebox_runner(self.middlebox, runner)
        self._hosts = [self._lab_host(h) for h in self._topology_hosts()]

    @classmethod
    def up(
        cls,
        spec: LabSpec,
        runner: SystemRunner | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> InventoryLab:
        """Read the inventory, check it holds the topology's hosts; nothing is created."""
        if spec.inventory is None:
            raise BadInputError("lab.inventory: required for lab kind inventory")
        lab = cls(spec, load_inventory(spec.inventory), runner or SystemRunner())
        if progress:
            progress(f"inventory {spec.inventory}: {len(lab.devices)} devices")
        lab.runner.mkdir(lab.runtime_dir)
        return lab

    def _topology_hosts(self) -> list[InventoryHost]:
        topo = self._spec.topology
        known = {h.name for h in self._inventory.hosts}
        missing = [h.name for h in topo.hosts if h.role != "controller" and h.name not in known]
        if missing:
            raise BadInputError(
                f"{self._inventory.source}: topology {topo.name} needs host(s) {missing} "
                f"(the inventory has: {', '.join(sorted(known))})"
            )
        order = topo.by_role("server") + topo.by_role("device")
        return [self._inventory.host(h.name) for h in order]

    def _lab_host(self, h: InventoryHost) -> LabHost:
        port = h.vars.get(PORT_VAR)
        if not port:
            raise BadInputError(
                f"{self._inventory.source}: host {h.name!r}: missing {PORT_VAR} (the "
                f"interface of middlebox {self.middlebox.name} that faces it)"
            )
        return LabHost(
            name=h.name,
            role=h.role,
            host_class=h.host_class or self._spec.topology.host(h.name).host_class,
            ip=h.address,
            netns=h.netns,
            workdir=Path(h.workdir),
            port=str(port),
        )

    # --- the Lab interface -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def spec(self) -> LabSpec:
        return self._spec

    @property
    def topology(self) -> Topology:
        return self._spec.topology

    @property
    def bridge_netns(self) -> str | None:
        return self.middlebox.netns

    @property
    def hosts(self) -> list[LabHost]:
        return list(self._hosts)

    @property
    def server(self) -> LabHost:
        return self._hosts[0]

    @property
    def devices(self) -> list[LabHost]:
        return [h for h in self._hosts if h.role == "device"]

    def host(self, name: str) -> LabHost:
        for h in self._hosts:
            if h.name == name:
                return h
        raise LabError(f"lab {self.name} has no host {name!r}")

    @property
    def runtime_dir(self) -> Path:
        return self._spec.resolved_state_dir() / "run"

    def inventory(self) -> Inventory:
        return self._inventory

    def describe(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "name": self.name,
            "inventory": self._inventory.source,
            "middlebox": self.middlebox.name,
            "topology": self.topology.name,
            "devices": len(self.devices),
            "classes": self.topology.class_counts(),
        }

    def down(self, keep_files: bool = False) -> list[str]:
        """Nothing to remove on the hosts; drops the controller-side runtime state."""
        if not keep_files:
            self.runner.remove_tree(self.runtime_dir)
        return []


def describe_namespace_lab(lab: LinkSite, hosts: list[InventoryHost], path: Path) -> Path:
    """Write an inventory of a namespace lab's `hosts` for kind `inventory`: each host with
    its `middlebox_port`, and the lab's bridge namespace as a local middlebox. The physical
    code path then runs against the namespace hosts (how it is tested on one machine)."""
    marked = [
        h.model_copy(update={"vars": {**h.vars, PORT_VAR: lab.host(h.name).port}}) for h in hosts
    ]
    middlebox = InventoryHost(
        name="mb",
        role="middlebox",
        address="localhost",
        user="root",
        workdir=str(lab.runtime_dir),
        netns=lab.bridge_netns,
        vars={"ansible_connection": "local"},
    )
    path.write_text(yaml.safe_dump(inventory_document([*marked, middlebox], {})))
    return path


def inventory_topology(
    inventory: Inventory, profile: LinkProfile, name: str = "inventory"
) -> Topology:
    """A star of the inventory's devices around its first server, every primary link on
    `profile` (for a playbook that names no topology); classes from each host's `host_class`."""
    topo = Topology(name=name, description=f"the hosts of {inventory.source}")
    server = inventory.server
    topo.add_host(server.name, "server", server.host_class)
    for dev in inventory.devices:
        topo.add_host(dev.name, "device", dev.host_class)
        topo.add_link(dev.name, server.name, "link", profile)
    return topo
