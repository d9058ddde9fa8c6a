"""Network shapes: host classes (`hosts`), the `Topology` of hosts and links (`model`), and its
loading from `topologies/*.yaml` (`files`).

Import from the submodules: this package imports nothing itself, so that low-level modules
(the inventory, the lab) can use `testbed.topo.classes.Role` without import cycles.
"""
