"""Topology files (`topologies/*.yaml`): a fleet declared by count per class, named profiles.

    name: sled-star
    description: SLED's set-up
    server: {class: a100}                 # name defaults to `server`
    fleet:                                # devices dev1..devN, in this order
      - {class: pi5, count: 10}
      - {class: jetson-orin-nano, count: 6, primary: wifi6}   # per-group profile override
    profiles:                             # each one a LinkProfile (testbed.topo.profile)
      wifi: {rtt_ms: 85}
      wifi6: {rtt_ms: 60}
      5g: {rtt_ms: 40, jitter_ms: 2}
    links: {primary: wifi, backup: 5g}    # every device <-> server; backup is optional

Errors name the file, the key and what was expected.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.core.errors import BadInputError
from testbed.core.loading import load_model
from testbed.topo.classes import host_classes
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import TopoHost, TopoLink, Topology

MAX_DEVICES = 200  # the devices one lab holds (two CPUs: one sshd and agent each)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ServerEntry(_Strict):
    name: str = "server"
    host_class: str = Field("a100", alias="class")


class FleetEntry(_Strict):
    """`count` devices of one class, optionally on their own primary/backup profiles."""

    host_class: str = Field(alias="class")
    count: int = Field(ge=1, le=MAX_DEVICES)
    primary: str | None = None
    backup: str | None = None


class PathProfiles(_Strict):
    primary: str
    backup: str | None = None


class TopologyFile(_Strict):
    name: str
    description: str = ""
    server: ServerEntry = ServerEntry()
    fleet: list[FleetEntry] = Field(min_length=1)
    profiles: dict[str, LinkProfile] = Field(min_length=1)
    links: PathProfiles

    @model_validator(mode="after")
    def _names_exist(self) -> TopologyFile:
        known = ", ".join(self.profiles)
        wanted = [("links.primary", self.links.primary), ("links.backup", self.links.backup)]
        if self.server.host_class not in host_classes():
            raise ValueError(
                f"server.class: unknown host class {self.server.host_class!r} "
                f"(known: {', '.join(host_classes())})"
            )
        for i, entry in enumerate(self.fleet):
            wanted += [(f"fleet.{i}.primary", entry.primary), (f"fleet.{i}.backup", entry.backup)]
            if entry.host_class not in host_classes():
                raise ValueError(
                    f"fleet.{i}.class: unknown host class {entry.host_class!r} "
                    f"(known: {', '.join(host_classes())})"
                )
        for key, name in wanted:
            if name is not None and name not in self.profiles:
                raise ValueError(f"{key}: {name!r} is not one of the profiles ({known})")
        if sum(e.count for e in self.fleet) > MAX_DEVICES:
            raise ValueError(f"fleet: more than {MAX_DEVICES} devices")
        return self

    def build(self) -> Topology:
        """The Topology this file describes."""
        hosts = [TopoHost(name=self.server.name, role="server", host_class=self.server.host_class)]
        links: list[TopoLink] = []
        index = 0
        for entry in self.fleet:
            for _ in range(entry.count):
                index += 1
                dev = f"dev{index}"
                hosts.append(TopoHost(name=dev, role="device", host_class=entry.host_class))
                for path, name in (
                    ("primary", entry.primary or self.links.primary),
                    ("backup", entry.backup or self.links.backup),
                ):
                    if name is not None:
                        links.append(
                            TopoLink(
                                a=dev,
                                b=self.server.name,
                                profile_name=name,
                                profile=self.profiles[name],
                                path=path,  # type: ignore[arg-type]
                            )
                        )
        return Topology(name=self.name, description=self.description, hosts=hosts, links=links)


def load_topology(path: str | Path) -> Topology:
    """Read, validate and build a topology file."""
    path = Path(path)
    spec = load_model(TopologyFile, path)
    try:
        return spec.build()
    except ValueError as exc:
        raise BadInputError(f"{path}: {exc}") from None


def topology_profiles(path: str | Path) -> dict[str, LinkProfile]:
    """The named link profiles of a topology file."""
    return load_model(TopologyFile, Path(path)).profiles
