"""What each host of a condition stands for, and the time it runs in: the agents' emulation.

Every lab host has a class (`topologies/host-classes.yaml`) naming the hardware it stands
for (`topologies/hardware.yaml`); the playbook's `models.draft_as` / `models.target_as` name
the models its engines stand for. On an emulated lab the agents pace every forward to that
hardware's modelled time (`agents.emulation.pacing`); on an inventory lab of real hardware
they only predict it beside each measured forward. `lab.time_dilation` slows every imposed
time down N times; the condition's `ConditionTime` maps the controller's own times onto the
same emulated clock as the agents' (each host's epoch on its own clock: `on_host`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from agents.emulation.clock import Clock
from testbed.config.playbook import Mode, Playbook
from testbed.core.errors import BadInputError
from testbed.hosts.inventory import InventoryHost
from testbed.metrics.clocks import ClockOffset
from testbed.topo.catalogue import Catalogue, load_catalogue
from testbed.topo.classes import host_class

EMULATION_FILE = "emulation.json"


def engine_roles(mode: Mode, role: str) -> tuple[str, ...]:
    """The engines a host of `role` runs in `mode`: "draft" and/or "target"."""
    if role == "device":
        return ("draft",) if mode in ("sled", "device-only") else ()
    if role == "server":
        return ("target", "draft") if mode in ("server-sd", "balance") else ("target",)
    return ()


def model_refs(pb: Playbook) -> dict[str, str]:
    """Engine role -> the catalogue model it stands for (model@format)."""
    return {"draft": pb.models.draft_as, "target": pb.models.target_as}


def hardware_of(host_class_name: str | None, source: str) -> str | None:
    """The catalogue hardware a host class stands for (None: a host with no class)."""
    if host_class_name is None:
        return None
    return host_class(host_class_name, source).hardware


@dataclass(frozen=True)
class ConditionTime:
    """A condition's time: its dilation, and the real wall time where both clocks agree."""

    dilation: float = 1.0
    epoch: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dilation", float(self.dilation))
        object.__setattr__(self, "epoch", float(self.epoch))

    @classmethod
    def starting_now(cls, dilation: float) -> ConditionTime:
        return cls(float(dilation), time.time())

    @property
    def clock(self) -> Clock:
        return Clock(self.dilation, self.epoch)

    def wall(self, real_wall: float) -> float:
        """A real wall-clock time of the controller's on the emulated wall clock."""
        return self.clock.wall(real_wall)

    def on_host(self, clock: ClockOffset) -> ConditionTime:
        """The condition's time as a host whose clock is `clock` keeps it: the epoch on that
        host's clock, so that the host's emulated clock differs from the controller's by the
        offset itself (which `ClockOffset.to_controller` takes off its times)."""
        return ConditionTime(self.dilation, clock.to_host(self.epoch))

    def real_s(self, emulated_s: float) -> float:
        """Real seconds for `emulated_s` seconds of the condition's time."""
        return emulated_s * self.dilation


def host_emulation(
    host: InventoryHost,
    pb: Playbook,
    paced: bool,
    when: ConditionTime,
    catalogue: Catalogue | None = None,
) -> dict[str, Any]:
    """The `--emulation` document of one host's agent (agents.emulation.settings)."""
    doc: dict[str, Any] = {
        "time_dilation": when.dilation,
        "clock_epoch": when.epoch,
        "pace": paced,
    }
    roles = engine_roles(pb.mode, host.role)
    hw_name = hardware_of(host.host_class, f"host {host.name}")
    if not roles or hw_name is None:
        return doc
    cat = catalogue or load_catalogue()
    refs = model_refs(pb)
    doc["hardware"] = cat.hardware(hw_name, f"host {host.name} (class {host.host_class})").as_dict()
    doc["models"] = {r: cat.model(refs[r], f"models.{r}_as").as_dict() for r in roles}
    return doc


def emulation_tag(doc: dict[str, Any]) -> str:
    """A short name for what an emulation document makes a host (its epoch left out), for
    caching what was measured under it."""
    same = {k: v for k, v in doc.items() if k != "clock_epoch"}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:10]


def check_emulation(pb: Playbook, hosts: list[tuple[str, str, str | None]], source: str) -> None:
    """Refuse, naming the key, a model the catalogue lacks or that does not fit the memory of
    a host that runs it. `hosts`: (name, role, host class) of every lab host."""
    cat = load_catalogue()
    refs = model_refs(pb)
    for role, ref in refs.items():
        cat.model(ref, f"{source}: models.{role}_as")
    for name, role, cls in hosts:
        hw = hardware_of(cls, f"{source}: host {name}")
        wanted = [refs[r] for r in engine_roles(pb.mode, role)]
        if hw is not None and wanted:
            cat.check_fits(hw, wanted, f"{source}: host {name} (class {cls})")


def time_dilation(pb: Playbook, source: str) -> float | None:
    """The playbook's fixed dilation (None for `auto`); BadInputError for an inventory lab
    asked to dilate (real hardware cannot run slower than it does)."""
    value = pb.lab.time_dilation
    if pb.lab.kind == "inventory" and value != 1:
        raise BadInputError(
            f"{source}: lab.time_dilation: {value!r} on an inventory lab; real hardware "
            "runs in real time (expected 1)"
        )
    return None if value == "auto" else float(value)
