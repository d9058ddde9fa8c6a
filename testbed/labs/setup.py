"""What a lab should look like (`LabSetup`: a topology, a subnet, SSH settings) and the hosts
it is made of (`LabHost`: a topology host placed on the lab, with its address and interfaces)."""

from __future__ import annotations

import ipaddress
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.core import paths
from testbed.core.loading import validate
from testbed.labs import naming
from testbed.topo.files import MAX_DEVICES
from testbed.topo.topology import TopoHost, Topology


class LabHost(TopoHost):
    """A topology host placed on a lab: its address, namespace, working directory, and the
    interface facing it where its links are impaired (`port`). How the controller reaches it
    over SSH is its `InventoryHost` (testbed.hosts.inventory)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ip: str
    netns: str | None = Field(None, description="its namespace on this machine (emulated labs)")
    workdir: Path
    port: str = Field(description="the interface facing it at the link site (a bridge port)")


class LabSetup(BaseModel):
    """A lab of `topology`'s hosts. `devices=N` (given instead of a topology) is a star of N.

    `inventory` names the Ansible inventory of an `inventory` lab (the hosts exist already).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "lab"
    topology: Topology = Field(default_factory=lambda: Topology.star(2))
    inventory: Path | None = None
    subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.77.0.0/24")
    state_dir: Path | None = None
    user: str = "root"
    python: str = Field(default_factory=lambda: sys.executable)
    ssh_port: int = Field(22, ge=1, le=65535)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not naming.LAB_NAME_RE.match(v):
            raise ValueError(
                "expected 1-10 characters, a lowercase letter then lowercase letters or digits"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _devices_to_topology(cls, data: Any) -> Any:
        """`devices=N`: a star of N devices (or the given topology rescaled to N)."""
        if isinstance(data, dict) and "devices" in data:
            data = dict(data)
            count = data.pop("devices")
            if not isinstance(count, int) or not 1 <= count <= MAX_DEVICES:
                raise ValueError(f"devices: expected a whole number 1..{MAX_DEVICES}")
            topo = data.get("topology")
            if isinstance(topo, Topology):
                data["topology"] = topo.with_devices(count)
            else:
                data["topology"] = Topology.star(count)
        return data

    @property
    def devices(self) -> int:
        """How many device hosts the lab has."""
        return len(self.topology.devices)

    @model_validator(mode="after")
    def _fits(self) -> LabSetup:
        if self.inventory is None:  # hosts of this machine: their names make interface names
            long = [h.name for h in self.topology.hosts if not NAMESPACE_HOST_RE.match(h.name)]
            if long:
                raise ValueError(
                    f"topology {self.topology.name}: host name(s) {long}: expected 1-13 "
                    "characters, a lowercase letter then lowercase letters, digits, '-' or '_' "
                    "(a namespace lab names interfaces after its hosts)"
                )
        need = len(self.topology.hosts) + 1  # every host and the controller
        if self.subnet.num_addresses - 2 < need:
            raise ValueError(
                f"subnet {self.subnet} has room for {self.subnet.num_addresses - 2} hosts, "
                f"the lab needs {need}"
            )
        return self

    @classmethod
    def build(cls, source: str = "lab setup", **fields: object) -> LabSetup:
        """Validate `fields`, raising BadInputError that names `source` and each bad field."""
        return validate(cls, fields, source)

    def resolved_state_dir(self) -> Path:
        """The given state dir, or `<cache>/labs/<name>`."""
        return self.state_dir or default_state_dir(self.name)

    @property
    def prefix_len(self) -> int:
        return self.subnet.prefixlen

    def controller_ip(self) -> str:
        return str(self.subnet.broadcast_address - 1)

    def plan(self, state_dir: Path) -> list[LabHost]:
        """The topology's servers then devices, at consecutive addresses from the first."""
        base = self.subnet.network_address
        order = self.topology.by_role("server") + self.topology.by_role("device")
        return [
            LabHost(
                name=h.name,
                role=h.role,
                host_class=h.host_class,
                ip=str(base + 1 + i),
                netns=naming.host_netns(self.name, h.name),
                workdir=state_dir / "hosts" / h.name,
                port=naming.bridge_port(h.name),
            )
            for i, h in enumerate(order)
        ]


NAMESPACE_HOST_RE = re.compile(r"^[a-z][a-z0-9_-]{0,12}$")


def default_state_dir(name: str) -> Path:
    """Where a lab called `name` keeps its state unless told otherwise."""
    return paths.cache_dir() / "labs" / name
