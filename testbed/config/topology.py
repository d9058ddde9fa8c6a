"""Network shapes (`topologies/*.yaml`): which hosts, and the link profile of each path."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from testbed.config.loading import load_model
from testbed.config.playbook import LinkSection, Strict


class TopologyLink(Strict):
    """The emulated profile of one kind of device-server path."""

    rtt_ms: float = Field(ge=0, le=10000)
    jitter_ms: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, le=1, description="per-direction packet loss, 0..1")
    rate_mbit: float | None = Field(None, gt=0)


class Topology(Strict):
    """A star of `devices` devices around one server; `primary` names the link they use."""

    name: str
    kind: Literal["star"] = "star"
    devices: int = Field(ge=1, le=64)
    links: dict[str, TopologyLink]
    primary: str

    @model_validator(mode="after")
    def _primary_exists(self) -> Topology:
        if self.primary not in self.links:
            raise ValueError(
                f"primary: {self.primary!r} is not one of the links ({', '.join(self.links)})"
            )
        return self

    def link_section(self) -> LinkSection:
        """The primary link as a playbook `link` section."""
        return LinkSection(**self.links[self.primary].model_dump())


def load_topology(path: str | Path) -> Topology:
    return load_model(Topology, Path(path))
