"""Lab kind `inventory`: a physical lab whose hosts an Ansible inventory lists.

Nothing is created: the hosts exist (Ansible provisioned them) and are reached over SSH by the
Fabric layer. Links are impaired in one of two places:
- on a middlebox the inventory names, a machine every device <-> server packet crosses (a
  Linux router or bridge between the devices' Wi-Fi and the server), with the same backends
  as the namespace lab's bridge namespace (each host's `middlebox_port` is the middlebox
  interface facing it);
- without a middlebox, on the hosts themselves (testbed.links.hostside): each host's
  `link_iface` is its own interface on the link, and commands run on it over SSH (here when
  `ansible_connection: local`). A host without sch_netem runs the packet holder from its
  `holder_path` (with none: this machine's build, right for hosts that share its files).

The lab reads what the site playbook left on its hosts itself: `up` (for a real run, and for
the `testbed lab` commands) reads each server's and device's facts/models.json and
facts/netem.json, and the middlebox's facts/netem.json, over Fabric
(`testbed.hosts.provisioned.with_provisioned_facts`) and sets the host variables
`draft_model` / `target_model` (the models Ansible placed, which the runner starts the agents
on) and `holder_path` (the holder it built, which runs on that host or middlebox), each
unless the inventory sets it itself, so the inventory needs no paths. A host without facts
(not provisioned) keeps its variables, and `up` says which; a facts file that is not JSON,
or a path that is not a string, stops it naming the host, the file and the key. In a dry
run the reads are printed, not done. `describe()` (the run's manifest) records what was
taken from the facts.

    all:
      children:
        verifiers: {hosts: {server: {ansible_host: 10.0.0.1, middlebox_port: eth1, ...}}}
        drafters: {hosts: {dev1: {ansible_host: 10.0.0.2, middlebox_port: wlan0, ...}}}
        middleboxes:
          hosts:
            mb: {ansible_host: 10.0.0.254, ansible_user: root, workdir: /root}
            # or `ansible_connection: local` (the controller routes), with `netns: NAME`
            # when the forwarding point is a namespace on it

Commands run over `ssh` (or locally when `ansible_connection: local`), through a SystemRunner
per machine, so dry runs print them per host.
"""

from __future__ import annotations

import hashlib
import ipaddress
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import yaml

from testbed.core.errors import BadInputError, LabError
from testbed.hosts.control import HostControl
from testbed.hosts.inventory import Inventory, InventoryHost, inventory_document, load_inventory
from testbed.hosts.liveness import not_answering
from testbed.hosts.provisioned import (
    FACTS_DIR,
    HOLDER_VAR,
    NO_FILE,
    facts_path,
    parse_facts,
    read_command,
    with_provisioned_facts,
)
from testbed.labs import naming
from testbed.labs.backup import BACKUP_IFACE, BackupPlan, PathEnd, load_plan
from testbed.labs.binding import bind_topology
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost, LabSetup
from testbed.labs.system import SystemRunner, become_prefix
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import Topology

PORT_VAR = "middlebox_port"
BACKUP_PORT_VAR = "middlebox_backup_port"
BACKUP_IP_VAR = "backup_ip"
BACKUP_IFACE_VAR = "backup_iface"
IFACE_VAR = "link_iface"


SSH_PERSIST_S = 15


def _holder_var(host: InventoryHost) -> str | None:
    """The host's `holder_path` variable, or None."""
    given = host.vars.get(HOLDER_VAR)
    return str(given) if given else None


def host_runner(host: InventoryHost, base: SystemRunner, mux: str | None = None) -> SystemRunner:
    """A runner whose commands run on `host`: over `ssh`, or here when the inventory says
    `ansible_connection: local` (callers pass a `netns` per command where they need one). Host
    keys are not pinned, as in `ansible/ansible.cfg` and the Fabric layer: a lab's hosts are
    re-imaged and re-keyed. With `mux` (a folder for control sockets), commands share one
    connection per host, kept `SSH_PERSIST_S` after the last. Where the host's user is not
    root, every command goes through `sudo -n` (`become_prefix`): they are all system
    commands (ip, tc, iptables, nft, modprobe, sysctl, the packet holder, the link probe)."""
    remote: tuple[str, ...] = ()
    local = host.vars.get("ansible_connection") == "local"
    if not local:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
                "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o",
                "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]  # fmt: skip
        if mux:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={mux}/%C",
                     "-o", f"ControlPersist={SSH_PERSIST_S}"]  # fmt: skip
        if host.key_file:
            argv += ["-i", str(host.key_file)]
        remote = (*argv, "-p", str(host.port), f"{host.user}@{host.address}", "--")
    return SystemRunner(dry_run=base.dry_run, echo=base.echo, remote=remote,
                        become=become_prefix(host.user, remote=not local))  # fmt: skip


class InventoryLab:
    """A physical lab (kind `inventory`); see the module docstring."""

    kind: ClassVar[str] = "inventory"
    # real hardware: engine calls run at its own speed, the model's time noted beside
    emulated: ClassVar[bool] = False

    def __init__(
        self,
        setup: LabSetup,
        inventory: Inventory,
        runner: SystemRunner,
        down: dict[str, str] | None = None,
    ) -> None:
        """The lab of `setup`'s topology bound to `inventory`'s hosts (testbed.labs.binding)
        but for those in `down` (host -> why it did not answer)."""
        self._spec = setup
        if len(inventory.middleboxes) > 1:
            raise BadInputError(
                f"{inventory.source}: middleboxes: expected at most one host where links are "
                f"impaired, got {[m.name for m in inventory.middleboxes]}"
            )
        self.middlebox = inventory.middleboxes[0] if inventory.middleboxes else None
        self.runner = host_runner(self.middlebox, runner) if self.middlebox else runner
        self.unanswered = dict(down or {})
        self.binding = bind_topology(setup.topology, inventory, self.unanswered)
        bound = [inventory.host(h.name) for h in self.binding.topology.hosts]
        bound.sort(key=lambda h: h.role != "server")  # servers first, then topology order
        self._inventory = inventory.model_copy(update={"hosts": tuple(bound)})
        for h in bound if not self.middlebox else ():
            if h.vars.get("ansible_connection") == "local" and h.netns:
                raise BadInputError(
                    f"{inventory.source}: host {h.name!r}: ansible_connection: expected ssh for "
                    f"a host in namespace {h.netns} that impairs its own links (no middlebox)"
                )
        mux = None if runner.dry_run else str(self.ssh_mux_dir)
        if mux:
            self.ssh_mux_dir.mkdir(mode=0o700, exist_ok=True)
        self._runners = {h.name: host_runner(h, runner, mux) for h in bound}
        self._hosts = [self._lab_host(h) for h in bound]
        self._one_port_each()
        self.from_facts: dict[str, dict[str, str]] = {}
        self.without_facts: list[str] = []
        self.backup_plan = self._backup_plan(bound) if setup.topology.has_backup else None

    @classmethod
    def up(
        cls,
        setup: LabSetup,
        runner: SystemRunner | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> InventoryLab:
        """Read the inventory, find which of its hosts answer, bind the topology to them
        (testbed.labs.binding), and take their variables from what the site playbook left on
        them (`_take_facts`); nothing is created. A device that does not answer is left out
        and said; a server that does not answer stops it."""
        if setup.inventory is None:
            raise BadInputError("lab.inventory: required for lab kind inventory")
        runner = runner or SystemRunner()
        say = progress or (lambda _msg: None)
        inventory = load_inventory(setup.inventory)
        lab = cls(setup, inventory, runner)  # a bad inventory is refused before any contact
        with HostControl(inventory, dry_run=runner.dry_run, echo=runner.echo) as hc:
            down = not_answering(hc, inventory.hosts)
        if down:
            say("not answering: " + "; ".join(down.values()))
            lab = cls(setup, inventory, runner, down)
        bound = ", ".join(f"{t} -> {h}" for t, h in lab.binding.hosts.items() if t != h)
        if bound:
            say(f"topology {lab.topology.name} on the inventory's hosts: {bound}")
        if lab.binding.left_out:
            say(f"left out (their hosts do not answer): {', '.join(lab.binding.left_out)}")
        say(f"inventory {setup.inventory}: {len(lab.devices)} devices")
        lab._take_facts(runner, say)
        lab.runner.mkdir(lab.runtime_dir)
        return lab

    def _one_port_each(self) -> None:
        """With a middlebox, every host on its own middlebox port: the rules and the rate
        shaper keep one class per port and direction, so two hosts behind one port would
        share (and clash on) one."""
        if not self.middlebox:
            return
        seen: dict[str, str] = {}
        for h in self._hosts:
            if h.port in seen:
                raise BadInputError(
                    f"{self._inventory.source}: hosts {seen[h.port]!r} and {h.name!r}: "
                    f"{PORT_VAR}: both {h.port!r}; expected one middlebox port per host (the "
                    "rules and the rate shaper keep one class per port)"
                )
            seen[h.port] = h.name

    def _take_facts(self, runner: SystemRunner, say: Callable[[str], None]) -> None:
        """Each server's and device's `draft_model` / `target_model` / `holder_path`, and the
        middlebox's `holder_path`, from their facts files unless the inventory sets it (see
        the module docstring); says once which hosts have none. With a dry-run `runner`,
        prints the reads and contacts no host."""
        names = [h.name for h in self._hosts]
        with HostControl(self._inventory, dry_run=runner.dry_run, echo=runner.echo) as hc:
            got = with_provisioned_facts(hc, names)
        self._inventory = got.inventory
        taken, missing = dict(got.taken), dict(got.missing)
        if self.middlebox:
            self._take_middlebox_holder(taken, missing)
            names.append(self.middlebox.name)
        self.from_facts, self.without_facts = taken, list(missing)
        if runner.dry_run:
            say(f"site playbook facts (models, packet holder): read on {', '.join(names)} "
                "in a real run")  # fmt: skip
            return
        if taken:
            said = "; ".join(
                f"{h} {', '.join(f'{k} {v}' for k, v in found.items())}"
                for h, found in taken.items()
            )
            say(f"from the site playbook's facts: {said}")
        if missing:
            lacking: dict[tuple[str, ...], list[str]] = {}
            for host, files in missing.items():
                lacking.setdefault(tuple(files), []).append(host)
            where = "; ".join(f"{', '.join(h)} ({', '.join(f)})" for f, h in lacking.items())
            say(f"no site playbook facts on {where}: their inventory variables are used as is")

    def _take_middlebox_holder(
        self, taken: dict[str, dict[str, str]], missing: dict[str, list[str]]
    ) -> None:
        """The middlebox's `holder_path` from its facts/netem.json unless the inventory sets
        it, read through the middlebox's runner (over SSH, or here when the controller routes);
        in a dry run the read is printed, not done."""
        assert self.middlebox is not None
        mb = self.middlebox
        path = facts_path(mb, "netem")
        res = self.runner.run(["sh", "-c", read_command(path)], check=False)
        if self.runner.dry_run:
            return
        if res.returncode == NO_FILE:
            missing[mb.name] = [f"{FACTS_DIR}/netem.json"]
            return
        if res.returncode != 0:
            raise LabError(f"{mb.name}: cannot read {path}: {res.stderr.strip()[-300:]}")
        built = parse_facts(mb.name, path, res.stdout, (HOLDER_VAR,)).get(HOLDER_VAR)
        if built and not mb.vars.get(HOLDER_VAR):
            self.middlebox = mb.model_copy(update={"vars": {**mb.vars, HOLDER_VAR: built}})
            taken[mb.name] = {HOLDER_VAR: built}

    def _var(self, h: InventoryHost, var: str, what: str) -> str:
        value = h.vars.get(var)
        if not value or not isinstance(value, str):
            raise BadInputError(
                f"{self._inventory.source}: host {h.name!r}: {var}: expected {what}, got {value!r}"
            )
        return value

    def _lab_host(self, h: InventoryHost) -> LabHost:
        if self.middlebox:
            var, what = PORT_VAR, f"the interface of middlebox {self.middlebox.name} that faces it"
        else:
            var, what = IFACE_VAR, "its interface on the link (the inventory has no middlebox)"
        port = self._var(h, var, f"the name of {what}")
        return LabHost(
            name=h.name,
            role=h.role,
            host_class=self.topology.host(h.name).host_class,
            ip=h.link_address,
            netns=h.netns,
            workdir=Path(h.workdir),
            port=port,
        )

    def _backup_plan(self, hosts: list[InventoryHost]) -> BackupPlan:
        """The backup path the inventory declares (for a topology with backup links): each
        host's `backup_ip` and `backup_iface`, and with a middlebox its `middlebox_backup_port`.
        Moving traffic between the paths is the lab's own (its routing), not the harness's."""
        ends = {}
        for h in hosts:
            ip = self._var(h, BACKUP_IP_VAR, "its address on the backup path")
            try:
                ipaddress.IPv4Address(ip)
            except ValueError as exc:
                raise BadInputError(
                    f"{self._inventory.source}: host {h.name!r}: {BACKUP_IP_VAR}: expected an "
                    f"IPv4 address, got {ip!r}"
                ) from exc
            iface = self._var(h, BACKUP_IFACE_VAR, "the name of its backup interface")
            port = (
                self._var(h, BACKUP_PORT_VAR, "the middlebox interface facing its backup link")
                if self.middlebox
                else iface
            )
            ends[h.name] = PathEnd(name=h.name, netns=h.netns or "", primary_ip=h.link_address,
                                   backup_ip=ip, iface=iface, port=port)  # fmt: skip
        server = self._hosts[0].name
        return BackupPlan(
            lab=self.name,
            subnet=ipaddress.IPv4Network(f"{ends[server].backup_ip}/24", strict=False),
            server=ends[server],
            devices=[e for name, e in ends.items() if name != server],
        )

    # --- the Lab interface -----------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._spec.name

    @property
    def setup(self) -> LabSetup:
        return self._spec

    @property
    def topology(self) -> Topology:
        """The setup's topology bound to the inventory's hosts that answered."""
        return self.binding.topology

    @property
    def bridge_netns(self) -> str | None:
        return self.middlebox.netns if self.middlebox else None

    @property
    def ssh_mux_dir(self) -> Path:
        """The control sockets of this lab's SSH connections: a short path (a socket's is at
        most 108 bytes), one per lab state folder."""
        digest = hashlib.sha1(str(self.runtime_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"tb-ssh-{digest}"

    @property
    def impaired_on_hosts(self) -> bool:
        return self.middlebox is None

    def host_runner(self, name: str) -> SystemRunner:
        """Runs commands on host `name` (over SSH, or here)."""
        runner = self._runners[self.host(name).name]
        if not runner.dry_run:  # its SSH control socket's folder (another lab object of this
            self.ssh_mux_dir.mkdir(mode=0o700, exist_ok=True)  # state folder may have gone)
        return runner

    def agent_python(self, name: str) -> str:
        """The Python the agents (and the link probe) run with on host `name`."""
        return self._inventory.host(self.host(name).name).agent_python

    @property
    def holder_path(self) -> str | None:
        """The packet holder's path on the middlebox: its `holder_path` (given, or the build
        the site playbook made there, read by `up`); None without a middlebox, or for this
        machine's build."""
        return _holder_var(self.middlebox) if self.middlebox else None

    def holder_binary(self, name: str) -> str | None:
        """The packet holder's path on host `name`: its `holder_path` (given, or the build the
        site playbook made, read by `up`); None for this machine's build (right for hosts that
        share its files)."""
        return _holder_var(self._inventory.host(self.host(name).name))

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
            "impaired_on": self.middlebox.name if self.middlebox else "hosts",
            "topology": self.topology.name,
            "devices": len(self.devices),
            "classes": self.topology.class_counts(),
            "from_facts": self.from_facts,
            "without_facts": self.without_facts,
            "bound": self.binding.hosts,
            "not_answering": self.unanswered,
            "left_out": self.binding.left_out,
        }

    def down(self, keep_files: bool = False) -> list[str]:
        """Nothing to remove on the hosts; drops the controller-side runtime state."""
        if not keep_files:
            self.runner.remove_tree(self.runtime_dir)
        self.runner.remove_tree(self.ssh_mux_dir)  # idle connections close on their own
        return []


def describe_namespace_lab(
    lab: LinkSite, hosts: list[InventoryHost], path: Path, middlebox: bool = True
) -> Path:
    """Write an inventory of a namespace lab's `hosts` for kind `inventory`. With `middlebox`:
    each host with its `middlebox_port`, and the lab's bridge namespace as a local middlebox;
    without: each host with its own `link_iface`, reached over SSH like a Pi. The physical code
    path then runs against the namespace hosts (how it is tested on one machine)."""
    plan = load_plan(lab)
    ends = {e.name: e for e in [plan.server, *plan.devices]} if plan else {}

    def backup_vars(name: str) -> dict[str, str]:
        end = ends.get(name)
        if end is None:
            return {}
        out = {BACKUP_IP_VAR: end.backup_ip, BACKUP_IFACE_VAR: BACKUP_IFACE}
        return out | ({BACKUP_PORT_VAR: end.site_port} if middlebox else {})

    if not middlebox:
        on_hosts = [
            h.model_copy(
                update={"vars": {**h.vars, IFACE_VAR: naming.HOST_IFACE, **backup_vars(h.name)}}
            )
            for h in hosts
        ]
        path.write_text(yaml.safe_dump(inventory_document(on_hosts, {})))
        return path
    marked = [
        h.model_copy(
            update={"vars": {**h.vars, PORT_VAR: lab.host(h.name).port, **backup_vars(h.name)}}
        )
        for h in hosts
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
