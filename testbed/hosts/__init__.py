"""Host control over SSH (Fabric) from an Ansible inventory, for emulated and real labs."""

from __future__ import annotations

from testbed.core.fanout import GroupError, GroupResult
from testbed.hosts.control import HostControl, RemoteProcess
from testbed.hosts.inventory import Inventory, InventoryHost, dump_inventory, load_inventory

__all__ = [
    "GroupError",
    "GroupResult",
    "HostControl",
    "Inventory",
    "InventoryHost",
    "RemoteProcess",
    "dump_inventory",
    "load_inventory",
]
