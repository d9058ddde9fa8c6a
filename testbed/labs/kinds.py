"""The lab kinds a playbook's `lab.kind` chooses from, each a class with the `Lab` interface.

Classes are imported when chosen, so a kind whose dependencies are missing (Mininet) fails
only when asked for, with a message saying what is missing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from testbed.core.errors import BadInputError

if TYPE_CHECKING:
    from testbed.labs.interface import Lab

LAB_KINDS: dict[str, str] = {
    "namespaces": "testbed.labs.emulated:EmulatedLab",
    "mininet": "testbed.labs.mininet:MininetLab",
    "inventory": "testbed.labs.physical:InventoryLab",
}
"""kind -> `module:Class`. `namespaces` (the default) is one network namespace per host on a
bridge; `mininet` the same hosts made by Mininet; `inventory` a physical lab."""

DEFAULT_KIND = "namespaces"

STANDING_KINDS: dict[str, str] = {
    "namespaces": LAB_KINDS["namespaces"],
    "rehearsal": "testbed.labs.rehearsal:RehearsalLab",
}
"""kind -> `module:Class` of the labs `testbed lab up --kind` brings up and leaves standing
until `testbed lab down`. `rehearsal` is a lab shaped like a real one (hosts named and reached
as the example inventory's, each its own root filesystem and sudo user, a middlebox to make),
rehearsed through its inventory on lab kind `inventory`."""


def lab_class(kind: str, kinds: dict[str, str] = LAB_KINDS, key: str = "lab.kind") -> type[Lab]:
    """The class implementing lab kind `kind` (of `kinds`; `key` names the setting)."""
    where = kinds.get(kind)
    if where is None:
        raise BadInputError(f"{key}: expected one of {', '.join(kinds)}, got {kind!r}")
    module, _, name = where.partition(":")
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise BadInputError(f"lab.kind {kind}: not available here ({exc})") from None
