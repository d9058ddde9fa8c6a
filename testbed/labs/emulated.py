"""The emulated lab: one network namespace per host on a bridge, an sshd in each.

    bridge netns tb-<lab>-sw:  br0 ── p-server ── eth0 in tb-<lab>-server (10.77.0.1)
                                   ├─ p-dev1   ── eth0 in tb-<lab>-dev1   (10.77.0.2) ...
                                   └─ p-root   ── tb-<lab>-c in the root namespace (10.77.0.254)

The controller is the root namespace (where the `testbed` process runs), so Fabric and Ansible
reach every host over SSH exactly as on hardware. Hosts share the filesystem; each has its own
working directory under the lab's state dir.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Self

from pydantic import BaseModel

from testbed.core import paths
from testbed.core.errors import LabError
from testbed.hosts.inventory import Inventory, InventoryHost, dump_inventory, load_inventory
from testbed.labs import naming, owner, sshd
from testbed.labs.backup import build_backup, start_monitor
from testbed.labs.clean import clean_all, remove_lab_objects, verify_gone
from testbed.labs.discover import list_netns, pid_alive, root_links
from testbed.labs.setup import LabHost, LabSetup
from testbed.labs.state import LabState
from testbed.labs.system import SystemRunner, require_root
from testbed.topo.topology import Topology

INVENTORY_FILE = "inventory.yml"


class HostStatus(BaseModel):
    name: str
    role: str
    ip: str
    netns: str
    netns_exists: bool
    sshd_pid: int | None
    sshd_alive: bool


class LabStatus(BaseModel):
    """What `status()` finds on the system (not just what the state file claims)."""

    name: str
    state_dir: Path
    status: str
    bridge_netns_exists: bool
    controller_link_exists: bool
    hosts: list[HostStatus]

    @property
    def healthy(self) -> bool:
        return (
            self.status == "up"
            and self.bridge_netns_exists
            and self.controller_link_exists
            and all(h.netns_exists and h.sshd_alive for h in self.hosts)
        )


class EmulatedLab:
    """A running (or, in dry-run, planned) emulated lab; see the module docstring.

    Lab kind `namespaces` (the `Lab` interface of `testbed.labs.interface`).
    """

    kind: ClassVar[str] = "namespaces"
    # its hosts stand for the hardware of their class: engine calls are paced to it
    emulated: ClassVar[bool] = True

    def __init__(self, state: LabState, runner: SystemRunner | None = None) -> None:
        self.state = state
        self.runner = runner or SystemRunner()

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def _begin(
        cls,
        setup: LabSetup,
        runner: SystemRunner,
        hosts: list[LabHost],
        support_hosts: list[LabHost],
        inventory: str,
        persistent: bool,
    ) -> tuple[Self, sshd.LabKeys]:
        """The lab's state before anything is made: its hosts, keys and inventory path under
        the state folder; the name checked free and, unless `persistent` (or a dry run),
        claimed by this process (`owner`)."""
        state_dir = setup.resolved_state_dir().resolve()
        keys = sshd.LabKeys.under(state_dir)
        state = LabState(
            setup=setup,
            state_dir=state_dir,
            hosts=hosts,
            support_hosts=support_hosts,
            controller_ip=setup.controller_ip(),
            controller_link=naming.controller_link(setup.name),
            bridge_netns=naming.bridge_netns(setup.name),
            client_key=keys.client_key,
            inventory=state_dir / inventory,
            created_at=time.time(),
        )
        lab = cls(state, runner)
        lab._check_free()
        if not (runner.dry_run or persistent):
            owner.claim(setup.name)
        return lab, keys

    @classmethod
    def up(
        cls,
        setup: LabSetup,
        runner: SystemRunner | None = None,
        progress: Callable[[str], None] | None = None,
        persistent: bool = False,
    ) -> EmulatedLab:
        """Create the lab described by `setup`; on any failure remove what was made and raise.

        The lab belongs to this process (see `owner`) unless `persistent`: then it has no owner
        and stays until `down`. A lab of that name abandoned by a dead owner is removed first.
        """
        runner = runner or SystemRunner()
        say = progress or (lambda _msg: None)
        if not runner.dry_run:
            require_root()
        state_dir = setup.resolved_state_dir().resolve()
        lab, keys = cls._begin(setup, runner, setup.plan(state_dir), [], INVENTORY_FILE,
                               persistent)  # fmt: skip
        state = lab.state
        t0 = time.monotonic()
        try:
            runner.remove_tree(lab.runtime_dir)  # stale state of an earlier lab of that name
            runner.mkdir(lab.runtime_dir)
            if not runner.dry_run:
                state.save()
            say("keys")
            sshd.generate_keys(runner, keys, comment=f"{naming.PREFIX}{setup.name}")
            say("bridge")
            lab._make_bridge()
            say(f"{len(state.hosts)} hosts")
            for host in state.hosts:
                lab._make_host(host)
            lab._attach_controller()
            say("sshd")
            runner.mkdir(sshd.PRIVSEP_DIR)
            for host in state.hosts:
                runner.mkdir(host.workdir)
                state.sshd_pid_files[host.name] = sshd.start_sshd(
                    runner, state_dir, setup.name, host, setup.ssh_port, keys
                )
            if not runner.dry_run:
                sshd.wait_listening([(h.ip, setup.ssh_port) for h in state.hosts])
            if setup.topology.has_backup:
                say("backup path")
                start_monitor(lab, build_backup(lab))
            runner.write_file(state.inventory, dump_inventory(lab.inventory_hosts(), lab._vars()))
        except BaseException:
            state.status = "failed"
            if not runner.dry_run:
                state.save()
                lab._remove(keep_files=True)
            raise
        state.status = "up"
        state.up_seconds = time.monotonic() - t0
        if not runner.dry_run:
            state.save()
        return lab

    @classmethod
    @contextmanager
    def running(cls, setup: LabSetup, runner: SystemRunner | None = None) -> Iterator[EmulatedLab]:
        """`with EmulatedLab.running(setup) as lab:` - up, and always down at the end."""
        lab = cls.up(setup, runner)
        try:
            yield lab
        finally:
            lab.down()

    @classmethod
    def load(cls, state_dir: Path | str, runner: SystemRunner | None = None) -> EmulatedLab:
        """The lab whose state lives in `state_dir` (made by `up`, maybe in another process)."""
        return cls(LabState.load(Path(state_dir)), runner)

    @classmethod
    def find(
        cls, name: str = "lab", state_dir: Path | None = None, runner: SystemRunner | None = None
    ) -> EmulatedLab:
        """The lab called `name` in its default state dir (or in `state_dir`)."""
        return cls.load(state_dir or LabSetup.build(name=name).resolved_state_dir(), runner)

    def down(self, keep_files: bool = False) -> list[str]:
        """Kill the lab's processes, delete its namespaces and links, then check nothing is left.

        Removes the state dir (keys, configs, host workdirs) unless `keep_files`.
        """
        return self._remove(keep_files=keep_files)

    def _remove(self, keep_files: bool) -> list[str]:
        removed = remove_lab_objects(self.name, self.runner)
        verify_gone(self.name, self.runner)
        if not self.runner.dry_run:
            owner.release(self.name)
        if not keep_files:
            self.runner.remove_tree(self.state_dir)
        return removed

    # --- what it is ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.state.setup.name

    @property
    def setup(self) -> LabSetup:
        return self.state.setup

    @property
    def topology(self) -> Topology:
        return self.state.setup.topology

    @property
    def state_dir(self) -> Path:
        return self.state.state_dir

    @property
    def hosts(self) -> list[LabHost]:
        return list(self.state.hosts)

    @property
    def server(self) -> LabHost:
        return self.state.hosts[0]

    @property
    def devices(self) -> list[LabHost]:
        return [h for h in self.state.hosts if h.role == "device"]

    def host(self, name: str) -> LabHost:
        for h in self.state.hosts:
            if h.name == name:
                return h
        raise LabError(f"lab {self.name} has no host {name!r}")

    def host_runner(self, name: str) -> SystemRunner:
        """Runs commands in host `name`'s namespace (recorded with the lab's own)."""
        return dataclasses.replace(self.runner, netns=self.host(name).netns)

    def agent_python(self, name: str) -> str:
        """The controller's Python: the hosts share this machine's files."""
        return self.setup.python

    @property
    def runtime_dir(self) -> Path:
        """Where other parts (impairment, holders) keep this lab's runtime state; reset by up."""
        return self.state_dir / "run"

    @property
    def holder_path(self) -> str | None:
        """None: the bridge namespace runs this machine's build of the packet holder."""
        return None

    @property
    def bridge_netns(self) -> str:
        return self.state.bridge_netns

    @property
    def impaired_on_hosts(self) -> bool:
        return False

    @property
    def controller_ip(self) -> str:
        return self.state.controller_ip

    @property
    def inventory_path(self) -> Path:
        return self.state.inventory

    @property
    def client_key(self) -> Path:
        return self.state.client_key

    def inventory(self) -> Inventory:
        """The lab's inventory as the Fabric layer reads it (from the file `up` wrote; in a
        dry run, where nothing was written, from the plan)."""
        if self.runner.dry_run:
            return Inventory(
                source=f"{self.inventory_path} (dry run)",
                hosts=tuple(self.inventory_hosts()),
                vars=self._vars(),
            )
        return load_inventory(self.inventory_path)

    def inventory_hosts(self) -> list[InventoryHost]:
        return [
            InventoryHost(
                name=h.name,
                role=h.role,
                address=h.ip,
                user=self.setup.user,
                port=self.setup.ssh_port,
                key_file=self.client_key,
                python=self.setup.python,
                workdir=str(h.workdir),
                netns=h.netns,
                host_class=h.host_class,
            )
            for h in self.state.hosts
        ]

    def _vars(self) -> dict[str, object]:
        # `lab_kind: emulated` tells the Ansible roles that hosts share this machine
        return {
            "lab_kind": "emulated",
            "testbed_lab_kind": self.kind,
            "lab_name": self.name,
            "testbed_repo": str(paths.REPO_ROOT),
        }

    def describe(self) -> dict[str, object]:
        """What the run manifest records about the lab."""
        return {
            "kind": self.kind,
            "name": self.name,
            "subnet": str(self.setup.subnet),
            "topology": self.topology.name,
            "devices": len(self.devices),
            "classes": self.topology.class_counts(),
            "up_seconds": self.state.up_seconds,
        }

    def status(self) -> LabStatus:
        """Check the lab against the system: namespaces, controller link, sshd processes."""
        namespaces = set(list_netns(self.runner, naming.netns_prefix(self.name)))
        links = set(root_links(self.runner, naming.netns_prefix(self.name)))
        hosts = []
        for h in self.state.hosts:
            pid = _read_pid(self.state.sshd_pid_files.get(h.name))
            hosts.append(
                HostStatus(
                    name=h.name,
                    role=h.role,
                    ip=h.ip,
                    netns=h.netns,
                    netns_exists=h.netns in namespaces,
                    sshd_pid=pid,
                    sshd_alive=pid is not None and pid_alive(pid),
                )
            )
        return LabStatus(
            name=self.name,
            state_dir=self.state_dir,
            status=self.state.status,
            bridge_netns_exists=self.bridge_netns in namespaces,
            controller_link_exists=self.state.controller_link in links,
            hosts=hosts,
        )

    # --- building blocks -------------------------------------------------------------------

    def _check_free(self) -> None:
        """Refuse to start over an existing lab of that name or on a subnet already routed."""
        r = self.runner
        prefix = naming.netns_prefix(self.name)
        if list_netns(r, prefix) or root_links(r, prefix):
            gone = owner.abandoned_by(self.name)
            if gone is not None and not r.dry_run:
                print(
                    f"lab {self.name!r} was left by process {gone.pid}, which has ended; "
                    "removing it first",
                    file=sys.stderr,
                )
                clean_all(self.name, r, remove_state=False)
                return self._check_free()
            holder = owner.recorded(self.name)
            used = f" (in use by process {holder.pid})" if holder is not None else ""
            raise LabError(
                f"lab {self.name!r} already exists on this machine{used}; run `testbed lab down "
                f"--name {self.name}` (or `testbed lab clean --name {self.name}` after a crash)"
            )
        out = r.run(["ip", "-4", "route", "show"], query=True, check=False).stdout
        for line in out.splitlines():
            dst = line.split()[0] if line.split() else "default"
            if dst == "default":
                continue
            try:
                net = ipaddress.IPv4Network(dst, strict=False)
            except ValueError:
                continue
            if net.overlaps(self.setup.subnet):
                raise LabError(
                    f"subnet {self.setup.subnet} overlaps an existing route ({line.strip()}); "
                    "choose another with --subnet"
                )

    def _ns_setup(self, netns: str) -> None:
        r = self.runner
        r.run(["ip", "netns", "add", netns])
        self.state.namespaces.append(netns)
        # No IPv6 chatter (router solicitations, MLD) on the emulated links.
        r.run(
            [
                "sysctl",
                "-qw",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
            netns=netns,
        )
        r.run(["ip", "-n", netns, "link", "set", "lo", "up"])

    def _make_bridge(self) -> None:
        sw = self.bridge_netns
        self._ns_setup(sw)
        self.runner.run(["ip", "-n", sw, "link", "add", naming.BRIDGE, "type", "bridge"])
        self.runner.run(["ip", "-n", sw, "link", "set", naming.BRIDGE, "up"])
        if not self.runner.dry_run:
            self.state.save()

    def _make_host(self, host: LabHost) -> None:
        r, sw = self.runner, self.bridge_netns
        self._ns_setup(host.netns)
        r.run(
            ["ip", "link", "add", naming.HOST_IFACE, "netns", host.netns, "type", "veth"]
            + ["peer", "name", host.port, "netns", sw]
        )
        r.run(["ip", "-n", sw, "link", "set", host.port, "master", naming.BRIDGE, "up"])
        cidr = f"{host.ip}/{self.setup.prefix_len}"
        r.run(["ip", "-n", host.netns, "addr", "add", cidr, "dev", naming.HOST_IFACE])
        r.run(["ip", "-n", host.netns, "link", "set", naming.HOST_IFACE, "up"])
        if not r.dry_run:
            self.state.save()

    def _attach_controller(self) -> None:
        r, sw, link = self.runner, self.bridge_netns, self.state.controller_link
        r.run(
            ["ip", "link", "add", link, "type", "veth"]
            + ["peer", "name", naming.CONTROLLER_PORT, "netns", sw]
        )
        self.state.links.append(link)
        r.run(["sysctl", "-qw", f"net.ipv6.conf.{link}.disable_ipv6=1"])
        r.run(
            ["ip", "-n", sw, "link", "set", naming.CONTROLLER_PORT, "master", naming.BRIDGE, "up"]
        )
        r.run(["ip", "addr", "add", f"{self.controller_ip}/{self.setup.prefix_len}", "dev", link])
        r.run(["ip", "link", "set", link, "up"])
        if not r.dry_run:
            self.state.save()


def _read_pid(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
