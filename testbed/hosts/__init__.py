"""Host control over SSH (Fabric) from an Ansible inventory, for emulated and real labs."""

from __future__ import annotations

from testbed.hosts.control import HostControl, RemoteProcess, RunResult
from testbed.hosts.group import GroupError, GroupResult
from testbed.hosts.inventory import Inventory, InventoryHost, dump_inventory, load_inventory

__all__ = [
    "GroupError",
    "GroupResult",
    "HostControl",
    "Inventory",
    "InventoryHost",
    "RemoteProcess",
    "RunResult",
    "dump_inventory",
    "load_inventory",
]
