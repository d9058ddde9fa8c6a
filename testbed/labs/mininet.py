"""Lab kind `mininet`: the lab's hosts, switch and links made through Mininet's Python API.

Mininet (the Debian `mininet` package) makes one network namespace per host and a Linux bridge
(`LinuxBridge`, no controller) in a namespace of its own, then every namespace is given the
name the `namespaces` kind uses (`ip netns attach tb-<lab>-<host> PID`). From there the lab is
the same as the `namespaces` one: the same interface names (`eth0` on hosts, `p-<host>` on the
bridge), an sshd per host so Fabric reaches hosts as on hardware, this project's impairment
backends on the bridge, and `down` removing exactly what this lab made (never `mn -c`, which
removes every Mininet object on the machine).

Links are plain `Link`s: Mininet's `TCLink` needs `sch_netem` and, on a kernel without it,
prints an error and leaves the link unimpaired. `missing_netem` finds such links (by looking
for the qdisc itself) for anyone who uses `TCLink` anyway.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

from testbed.core.errors import LabError, PrivilegeError
from testbed.labs import naming
from testbed.labs.emulated import EmulatedLab
from testbed.labs.setup import LabHost

DEBIAN_MININET = Path("/usr/lib/python3/dist-packages/mininet")
"""Where Debian's `mininet` package puts its Python package (outside the virtualenv)."""


def import_mininet(where: Path = DEBIAN_MININET) -> ModuleType:
    """The `mininet` package: importable as is, or loaded from Debian's folder alone (the rest
    of the system's dist-packages stays out of the virtualenv's path)."""
    if "mininet" not in sys.modules:
        try:
            importlib.import_module("mininet")
        except ImportError:
            init = where / "__init__.py"
            if not init.is_file():
                raise PrivilegeError(
                    f"lab kind mininet needs the Mininet Python package ({init} not found): "
                    "apt-get install mininet"
                ) from None
            found = importlib.util.spec_from_file_location(
                "mininet", init, submodule_search_locations=[str(where)]
            )
            assert found is not None and found.loader is not None
            module = importlib.util.module_from_spec(found)
            sys.modules["mininet"] = module
            found.loader.exec_module(module)
    for sub in ("log", "net", "node", "nodelib", "link"):
        importlib.import_module(f"mininet.{sub}")
    # `Mininet.init` would raise machine-wide limits and sysctls (tcp_rmem, kernel.pty.max,
    # ...) for every lab on the machine; a lab here changes only what it makes.
    sys.modules["mininet.net"].Mininet.inited = True
    return sys.modules["mininet"]


def _bridge_class() -> type:
    """`LinuxBridge` in its own namespace, with iproute2 instead of brctl, bridging every port.

    Mininet's `LinuxBridge` only bridges ports whose name contains its own; this lab names ports
    after hosts (`p-<host>`), as the `namespaces` kind does.
    """
    LinuxBridge = import_mininet().nodelib.LinuxBridge  # noqa: N806

    class NamespacedBridge(LinuxBridge):  # type: ignore[misc,valid-type]
        @classmethod
        def setup(cls) -> None:
            """No brctl needed (iproute2 makes the bridge)."""

        def start(self, _controllers: list[Any]) -> None:
            self.cmd("ip link add", self, "type bridge")
            for intf in self.intfList():
                if intf.name != "lo":
                    self.attach(intf)
            self.cmd("ip link set", self, "up")

        def attach(self, intf: Any) -> None:
            """Bridge a port added after start (Mininet's `Switch.attach`)."""
            self.cmd("ip link set", intf, "master", self, "up")

        def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 (Mininet's name)
            self.cmd("ip link del", self)
            super(LinuxBridge, self).stop(deleteIntfs)

    return NamespacedBridge


class MininetLab(EmulatedLab):
    """Lab kind `mininet`: `EmulatedLab` with its bridge, hosts and links made by Mininet."""

    kind: ClassVar[str] = "mininet"

    _net: Any = None
    _switch: Any = None

    def _attach_netns(self, netns: str, node: Any) -> None:
        """Name a Mininet node's namespace `netns`, then set it up like the namespaces kind."""
        r = self.runner
        pid = f"<pid of mininet node {node.name}>" if r.dry_run else str(node.pid)
        r.run(["ip", "netns", "attach", netns, pid])
        self.state.namespaces.append(netns)
        r.run(
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]
            + ["net.ipv6.conf.default.disable_ipv6=1"],
            netns=netns,
        )
        r.run(["ip", "-n", netns, "link", "set", "lo", "up"])
        if not r.dry_run:
            self.state.save()

    def _make_bridge(self) -> None:
        self.runner.record(
            f"mininet: Mininet(controller=None, build=False); addSwitch {naming.BRIDGE} "
            "(LinuxBridge in its own namespace, iproute2)"
        )
        if self.runner.dry_run:
            self._switch = _DryNode(naming.BRIDGE)
        else:
            mn = import_mininet()
            mn.log.setLogLevel("error")
            self._net = mn.net.Mininet(topo=None, controller=None, build=False)
            self._switch = self._net.addSwitch(
                naming.BRIDGE, cls=_bridge_class(), dpid="1", inNamespace=True
            )
            self._switch.start([])
        self._attach_netns(self.bridge_netns, self._switch)

    def _make_host(self, host: LabHost) -> None:
        cidr = f"{host.ip}/{self.setup.prefix_len}"
        self.runner.record(
            f"mininet: addHost {host.name} ip={cidr}; addLink {host.name}:{naming.HOST_IFACE} "
            f"{naming.BRIDGE}:{host.port} (Link)"
        )
        if self.runner.dry_run:
            node: Any = _DryNode(host.name)
        else:
            node = self._net.addHost(host.name, ip=cidr, inNamespace=True)
            link = self._net.addLink(
                node, self._switch, intfName1=naming.HOST_IFACE, intfName2=host.port
            )
            node.setIP(cidr, intf=link.intf1)
            self._switch.attach(link.intf2)
        self._attach_netns(host.netns, node)

    def _remove(self, keep_files: bool) -> list[str]:
        """Kill the Mininet node shells with the rest (they live in the lab's namespaces)."""
        self._net = self._switch = None
        return super()._remove(keep_files)

    def describe(self) -> dict[str, object]:
        return super().describe() | {"switch": "LinuxBridge (in a namespace)", "link": "Link"}


class _DryNode:
    """Stands for a Mininet node in a dry run (nothing is made)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid = 0


def missing_netem(net: Any) -> list[str]:
    """Links of Mininet network `net` made as `TCLink`s whose ends lack a netem qdisc.

    On a kernel without `sch_netem` Mininet prints an error and keeps such a link unimpaired;
    the qdisc itself is the proof that it is not.
    """
    TCLink = sys.modules["mininet.link"].TCLink  # noqa: N806
    bare = []
    for link in net.links:
        if not isinstance(link, TCLink):
            continue
        for intf in (link.intf1, link.intf2):
            if not intf.params.get("delay") and intf.params.get("loss") is None:
                continue
            if "netem" not in intf.node.cmd("tc qdisc show dev", intf.name):
                bare.append(f"{intf.node.name}:{intf.name}")
    return bare


def require_netem(net: Any) -> None:
    """Raise LabError naming every TCLink end that runs without its netem qdisc."""
    bare = missing_netem(net)
    if bare:
        raise LabError(
            "Mininet TCLink left these links unimpaired (no netem qdisc; this kernel lacks "
            "sch_netem?): " + ", ".join(bare) + ". Use lab kind mininet, whose links are "
            "impaired by this project's backends."
        )
