"""`Topology`: hosts (role, class) and the links between host pairs, each with a named profile.

Built like a Mininet `Topo`, by adding hosts and links; read from `topologies/*.yaml` by
`testbed.topo.files`. The same topology drives every lab kind (namespaces, mininet, inventory).

    topo = Topology(name="two")
    topo.add_host("server", "server", "a100")
    topo.add_host("dev1", "device", "pi5")
    topo.add_link("dev1", "server", "wifi", LinkProfile(rtt_ms=85))
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.topo.classes import DEFAULT_CLASS, Role, host_class
from testbed.topo.profile import LinkProfile

PathKind = Literal["primary", "backup"]
"""A device's usual path to the server (primary) or the one its traffic moves to when the
primary is cut (backup)."""


class TopoHost(BaseModel):
    """A host as the topology declares it: a name, what it does and what machine it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
        description="a host name (a namespace lab's: 13 characters at most, see LabSetup)",
    )
    role: Role
    host_class: str


class TopoLink(BaseModel):
    """The link between two hosts (`a` the device side), with its named profile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    a: str
    b: str
    profile_name: str
    profile: LinkProfile
    path: PathKind = "primary"


class Topology(BaseModel):
    """Hosts and links; see the module docstring."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    hosts: list[TopoHost] = []
    links: list[TopoLink] = []

    # --- building (Mininet style) -----------------------------------------------------------

    def add_host(self, name: str, role: Role, cls: str | None = None) -> TopoHost:
        """Add a host of class `cls` (default: the role's default class)."""
        host = TopoHost(name=name, role=role, host_class=cls or DEFAULT_CLASS[role])
        self._grow(self.hosts, host)
        return host

    def add_link(
        self, a: str, b: str, profile_name: str, profile: LinkProfile, path: PathKind = "primary"
    ) -> TopoLink:
        """Add a link between hosts `a` (device) and `b` (server)."""
        link = TopoLink(a=a, b=b, profile_name=profile_name, profile=profile, path=path)
        self._grow(self.links, link)
        return link

    def _grow(self, items: list, item: object) -> None:
        """Append `item`, keeping the topology unchanged if that makes it invalid."""
        items.append(item)
        try:
            self._check()
        except ValueError:
            items.pop()
            raise

    @classmethod
    def star(
        cls,
        devices: int,
        profile: LinkProfile | None = None,
        device_class: str = "pi5",
        server_class: str = "a100",
        name: str = "star",
    ) -> Topology:
        """`devices` devices (dev1..devN), each on its own primary link to one server."""
        topo = cls(name=name)
        topo.hosts.append(TopoHost(name="server", role="server", host_class=server_class))
        prof = profile or LinkProfile(rtt_ms=85)
        for i in range(1, devices + 1):
            topo.hosts.append(TopoHost(name=f"dev{i}", role="device", host_class=device_class))
            topo.links.append(TopoLink(a=f"dev{i}", b="server", profile_name="link", profile=prof))
        topo._check(complete=True)
        return topo

    # --- checks ----------------------------------------------------------------------------

    @model_validator(mode="after")
    def _valid(self) -> Topology:
        self._check(complete=True)
        return self

    def _check(self, complete: bool = False) -> None:
        """Names unique, classes fit roles, links join a device to a server once per path;
        `complete` (a whole topology, not one being built): every device has a primary link."""
        dup = [n for n, k in Counter(h.name for h in self.hosts).items() if k > 1]
        if dup:
            raise ValueError(f"hosts: duplicate name(s) {dup}")
        roles = {h.name: h.role for h in self.hosts}
        for h in self.hosts:
            cls = host_class(h.host_class, f"host {h.name}")
            if h.role not in cls.roles:
                raise ValueError(
                    f"host {h.name}: class {h.host_class} cannot be a {h.role} "
                    f"(it can be: {', '.join(cls.roles)})"
                )
        seen: set[tuple[str, str]] = set()
        for link in self.links:
            where = f"link {link.a}-{link.b} ({link.path})"
            if roles.get(link.a) != "device" or roles.get(link.b) != "server":
                raise ValueError(f"{where}: expected a device then a server host")
            if (link.a, link.path) in seen:
                raise ValueError(f"{where}: device {link.a} has two {link.path} links")
            seen.add((link.a, link.path))
        for h in self.hosts:
            if complete and h.role == "device" and (h.name, "primary") not in seen:
                raise ValueError(f"host {h.name}: device without a primary link")

    # --- what it is ------------------------------------------------------------------------

    def by_role(self, role: Role) -> list[TopoHost]:
        return [h for h in self.hosts if h.role == role]

    @property
    def devices(self) -> list[TopoHost]:
        return self.by_role("device")

    @property
    def server(self) -> TopoHost:
        servers = self.by_role("server")
        if not servers:
            raise ValueError(f"topology {self.name}: no server host")
        return servers[0]

    def host(self, name: str) -> TopoHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"topology {self.name} has no host {name!r}")

    def link(self, device: str, path: PathKind = "primary") -> TopoLink | None:
        """The `path` link of `device`, if it has one."""
        return next((k for k in self.links if k.a == device and k.path == path), None)

    def profiles(self, path: PathKind = "primary") -> dict[str, LinkProfile]:
        """device name -> the profile of its `path` link."""
        return {k.a: k.profile for k in self.links if k.path == path}

    @property
    def has_backup(self) -> bool:
        return any(k.path == "backup" for k in self.links)

    def class_counts(self, role: Role = "device") -> dict[str, int]:
        """How many hosts of `role` each class has, in first-seen order."""
        return dict(Counter(h.host_class for h in self.by_role(role)))

    # --- variants --------------------------------------------------------------------------

    def with_device_class(self, host_class: str) -> Topology:
        """The same topology with every device of class `host_class` (a playbook's
        `lab.device_class`)."""
        hosts = [
            h.model_copy(update={"host_class": host_class}) if h.role == "device" else h
            for h in self.hosts
        ]
        return self.model_copy(update={"hosts": hosts})

    def with_primary_profile(self, profile: LinkProfile) -> Topology:
        """The same topology with every primary link set to `profile` (a playbook's `link`)."""
        links = [
            k.model_copy(update={"profile": profile}) if k.path == "primary" else k
            for k in self.links
        ]
        return self.model_copy(update={"links": links})

    def with_devices(self, count: int) -> Topology:
        """The same topology scaled to `count` devices; only for a fleet of one class."""
        classes = self.class_counts()
        if len(classes) != 1:
            raise ValueError(
                f"topology {self.name}: cannot rescale a mixed fleet ({classes}) to {count} "
                "devices; declare the counts in the topology instead"
            )
        if count == len(self.devices):
            return self
        cls = next(iter(classes))
        template = {k.path: k for k in self.links if k.a == self.devices[0].name}
        hosts = [h for h in self.hosts if h.role != "device"]
        links = []
        for i in range(1, count + 1):
            hosts.append(TopoHost(name=f"dev{i}", role="device", host_class=cls))
            links += [k.model_copy(update={"a": f"dev{i}"}) for k in template.values()]
        return Topology(name=self.name, description=self.description, hosts=hosts, links=links)
