"""A topology bound to an inventory's hosts: the hosts fill the topology's roles and classes by
their groups (`verifiers`, `drafters`) and `host_class`, whatever they are called.

    bound = bind_topology(load_topology("topologies/star.yaml"), inventory, down={"pi5-2"})
    bound.topology.hosts   # a100 (server, a100), pi5-1 (device, pi5), pi5-3 (device, pi5)

Each topology host takes, in the topology's order, an inventory host of its role and class that
answers: the one of its own name if there is one (a namespace lab's `server`, `dev1`, ...),
else the first unused in inventory order. Links follow their hosts. An inventory with too few
hosts of a role and class is a bad input naming what is missing; a device whose hosts are all
down (but the inventory has them) is left out, and the lab says so: a run goes on with the
devices that answer. A server that does not answer is a lab error.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from testbed.core.errors import BadInputError, LabError
from testbed.hosts.inventory import GROUP_OF, Inventory, InventoryHost
from testbed.topo.topology import TopoHost, Topology


@dataclass(frozen=True)
class Binding:
    """The bound topology, which inventory host each topology host became, and the topology's
    devices left out because their hosts did not answer."""

    topology: Topology
    hosts: dict[str, str] = field(default_factory=dict)  # topology name -> inventory name
    left_out: list[str] = field(default_factory=list)  # topology names


def bind_topology(topo: Topology, inventory: Inventory, down: Collection[str] = ()) -> Binding:
    """`topo` with its hosts replaced by `inventory`'s (see the module docstring); `down`:
    inventory hosts that do not answer."""
    used: set[str] = set()
    names: dict[str, str] = {}
    left_out: list[str] = []
    for want in topo.by_role("server") + topo.by_role("device"):
        kind = (want.role, want.host_class)
        fits = [h for h in inventory.hosts if (h.role, h.host_class) == kind]
        if len(fits) < _needed(topo, want):
            raise BadInputError(_missing(topo, want, inventory))
        live = [h for h in fits if h.name not in used and h.name not in down]
        own = next((h for h in live if h.name == want.name), None)
        chosen = own or (live[0] if live else None)
        if chosen is None:
            if want.role == "server":
                gone = ", ".join(h.name for h in fits if h.name in down)
                raise LabError(f"{inventory.source}: the server does not answer ({gone})")
            left_out.append(want.name)
            continue
        used.add(chosen.name)
        names[want.name] = chosen.name
    return Binding(_renamed(topo, names), names, left_out)


def _needed(topo: Topology, want: TopoHost) -> int:
    return sum(1 for h in topo.hosts if h.role == want.role and h.host_class == want.host_class)


def _missing(topo: Topology, want: TopoHost, inventory: Inventory) -> str:
    """What the inventory lacks for `want`'s role and class, and what it has."""
    group = GROUP_OF[want.role]
    have = [h for h in inventory.hosts if h.role == want.role]
    listed = ", ".join(f"{h.name} ({_class_of(h)})" for h in have) or "none"
    return (
        f"{inventory.source}: topology {topo.name} needs {_needed(topo, want)} {want.role}(s) "
        f"of class {want.host_class} (group {group}, host_class: {want.host_class}); "
        f"the inventory's {group}: {listed}"
    )


def _class_of(h: InventoryHost) -> str:
    return f"host_class {h.host_class}" if h.host_class else "no host_class"


def _renamed(topo: Topology, names: dict[str, str]) -> Topology:
    """The topology's bound hosts under their inventory names, with their links."""
    hosts = [h.model_copy(update={"name": names[h.name]}) for h in topo.hosts if h.name in names]
    links = [
        k.model_copy(update={"a": names[k.a], "b": names[k.b]})
        for k in topo.links
        if k.a in names and k.b in names
    ]
    return Topology(name=topo.name, description=topo.description, hosts=hosts, links=links)
