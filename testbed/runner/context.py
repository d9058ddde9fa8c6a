"""What every condition of a run shares, and what each condition is run with."""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from testbed.config.playbook import Condition
from testbed.hosts.control import HostControl
from testbed.hosts.inventory import Inventory, InventoryHost
from testbed.labs.interface import Lab
from testbed.metrics.schemas import FaultRecord
from testbed.runner.reference import ReferenceBook


@dataclass
class RunContext:
    """The lab, the hosts, the models and the console of a run."""

    lab: Lab
    hosts: HostControl
    draft_model: str
    target_model: str
    # the run's reference answers (testbed.runner.reference: computed on the server host)
    references: ReferenceBook
    say: Callable[[str], None]
    dry_run: bool = False
    # device -> why it stopped answering during the run (left out of every later condition)
    lost: dict[str, str] = field(default_factory=dict)
    # the faults of the condition now running (testbed.runner.watch), pilots' included
    faults: list[FaultRecord] = field(default_factory=list)


def condition_devices(
    inv: Inventory, cond: Condition, lost: Collection[str] = ()
) -> list[InventoryHost]:
    """The devices a condition runs on: the first `lab.devices` of the lab's devices (all if
    unset), those `lost` during the run left out, each of class `lab.device_class` if set."""
    devices = [d for d in inv.devices if d.name not in lost]
    count, cls = cond.playbook.lab.devices, cond.playbook.lab.device_class
    chosen = devices if count is None else devices[:count]
    return [d if cls is None else d.model_copy(update={"host_class": cls}) for d in chosen]


def condition_dilation(cond: Condition) -> float:
    """The condition's time dilation (the runner resolves `auto` before the condition)."""
    value = cond.playbook.lab.time_dilation
    if value == "auto":
        raise ValueError(f"{cond.id}: lab.time_dilation auto was not resolved before the run")
    return float(value)
