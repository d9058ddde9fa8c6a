"""The one `Lab` interface, and the part of it the impairment backends use (`LinkSite`).

Every lab kind (see `testbed.labs.kinds`) is a class with this shape, so the runner swaps
behaviour by passing a class, as Mininet does with its host and link classes:

    lab = lab_class("namespaces").up(setup)      # or "mininet", "inventory"
    with HostControl(lab.inventory()) as hosts: ...
    apply(lab, profile)                          # backends only see the LinkSite part
    lab.down()
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from testbed.hosts.inventory import Inventory
    from testbed.labs.setup import LabHost, LabSetup
    from testbed.labs.system import SystemRunner
    from testbed.topo.topology import Topology


class LinkSite(Protocol):
    """Where a lab's device <-> server links are impaired: a forwarding point that sees both
    directions of every link (the bridge namespace, a Mininet switch's namespace, a middlebox)
    and, per host, the interface there that faces it (`LabHost.port`).

    `runner` runs commands at that point (locally, in `bridge_netns`, or over SSH on a
    middlebox, where `bridge_netns` is None); `runtime_dir` is a controller-side folder for the
    impairment's state (applied profiles, holder pid and log).
    """

    runner: SystemRunner

    @property
    def name(self) -> str: ...

    @property
    def bridge_netns(self) -> str | None: ...

    @property
    def impaired_on_hosts(self) -> bool:
        """True when there is no forwarding point and each host impairs its own links
        (testbed.links.hostside)."""
        ...

    @property
    def hosts(self) -> list[LabHost]: ...

    @property
    def server(self) -> LabHost: ...

    @property
    def devices(self) -> list[LabHost]: ...

    @property
    def runtime_dir(self) -> Path: ...

    @property
    def holder_path(self) -> str | None:
        """The packet holder's path at the forwarding point; None for this machine's build
        (the bridge namespace, or a middlebox that shares this machine's files)."""
        ...

    def host(self, name: str) -> LabHost: ...

    def host_runner(self, name: str) -> SystemRunner:
        """Runs commands on host `name`: in its namespace here, or over SSH on it."""
        ...

    def agent_python(self, name: str) -> str:
        """The Python the agents (and the link probe) run with on host `name`."""
        ...


class Lab(LinkSite, Protocol):
    """A lab of some kind: brought up from a `LabSetup`, reached through its inventory."""

    kind: ClassVar[str]
    emulated: ClassVar[bool]
    """True where hosts stand for other hardware (their engine calls are paced to it); False
    on real hardware (the model's time is only predicted beside each measured step)."""

    @classmethod
    def up(
        cls,
        setup: LabSetup,
        runner: SystemRunner | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> Lab: ...

    @property
    def setup(self) -> LabSetup: ...

    @property
    def topology(self) -> Topology: ...

    def inventory(self) -> Inventory:
        """How the Fabric layer reaches every host (servers first)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the run manifest records about the lab."""
        ...

    def down(self, keep_files: bool = False) -> list[str]:
        """Undo what `up` made; returns what was removed."""
        ...
