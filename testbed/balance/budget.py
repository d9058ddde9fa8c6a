"""A BALANCE memory budget checked against what it must hold and what the server has.

`balance.memory_gb` is in GB (1e9 bytes) of the hardware the server host stands for (its host
class's catalogue entry): it must hold at least the large model's weights
(`models.target_as`) and cannot exceed that hardware's memory.
"""

from __future__ import annotations

from agents.emulation.stepcost import GB
from testbed.config.playbook import Playbook
from testbed.core.errors import BadInputError
from testbed.topo.catalogue import load_catalogue
from testbed.topo.classes import host_class


def check_budget(pb: Playbook, server_class: str | None, source: str) -> None:
    """Refuse, naming the key, a budget below the large model's weights or above the
    server's memory (BadInputError)."""
    cat = load_catalogue()
    budget = pb.balance.memory_gb * GB
    target = cat.model(pb.models.target_as, f"{source}: models.target_as")
    if budget < target.weight_bytes:
        raise BadInputError(
            f"{source}: balance.memory_gb: {pb.balance.memory_gb:g} GB cannot hold the large "
            f"model's weights ({pb.models.target_as}: {target.weight_bytes / GB:.2f} GB); "
            "expected at least that"
        )
    if server_class is None:
        return
    name = host_class(server_class, f"{source}: server").hardware
    hw = cat.hardware(name, f"{source}: server (class {server_class})")
    if budget > hw.memory_bytes:
        raise BadInputError(
            f"{source}: balance.memory_gb: {pb.balance.memory_gb:g} GB is more than the "
            f"server's {hw.memory_bytes / GB:g} GB ({hw.name}, class {server_class}); "
            "expected at most that"
        )
