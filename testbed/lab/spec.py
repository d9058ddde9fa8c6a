"""What an emulated lab should look like (`LabSpec`) and the hosts it is made of (`LabHost`)."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed import paths
from testbed.config.loading import validate
from testbed.lab import naming

Role = Literal["server", "device"]


class LabHost(BaseModel):
    """One emulated host: its own network namespace, address, sshd and working directory."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: Role
    ip: str
    netns: str
    workdir: Path
    port: str = Field(description="its veth end on the bridge (in the bridge namespace)")


class LabSpec(BaseModel):
    """An emulated lab: one server and `devices` devices on one bridge, controller attached."""

    model_config = ConfigDict(extra="forbid")

    name: str = "lab"
    devices: int = Field(2, ge=1, le=200)
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

    @model_validator(mode="after")
    def _fits(self) -> LabSpec:
        need = self.devices + 2  # server, devices, controller
        if self.subnet.num_addresses - 2 < need:
            raise ValueError(
                f"subnet {self.subnet} has room for {self.subnet.num_addresses - 2} hosts, "
                f"the lab needs {need}"
            )
        return self

    @classmethod
    def build(cls, source: str = "lab spec", **fields: object) -> LabSpec:
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
        """The hosts: `server` at the first address, `dev1..devN` after it."""
        base = self.subnet.network_address
        names: list[tuple[str, Role]] = [("server", "server")]
        names += [(naming.device_name(i), "device") for i in range(1, self.devices + 1)]
        return [
            LabHost(
                name=name,
                role=role,
                ip=str(base + 1 + i),
                netns=naming.host_netns(self.name, name),
                workdir=state_dir / "hosts" / name,
                port=naming.bridge_port(name),
            )
            for i, (name, role) in enumerate(names)
        ]


def default_state_dir(name: str) -> Path:
    """Where a lab called `name` keeps its state unless told otherwise."""
    return paths.cache_dir() / "labs" / name
