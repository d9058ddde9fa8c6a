"""Host control over SSH (Fabric) from an Ansible-YAML inventory, for emulated and real labs."""

from __future__ import annotations

from testbed.hosts.control import HostControl, RemoteProcess, RunResult
from testbed.hosts.inventory import Inventory, InventoryHost, load_inventory, parse_inventory

__all__ = [
    "HostControl",
    "Inventory",
    "InventoryHost",
    "RemoteProcess",
    "RunResult",
    "load_inventory",
    "parse_inventory",
]
