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


def lab_class(kind: str) -> type[Lab]:
    """The class implementing lab kind `kind`."""
    where = LAB_KINDS.get(kind)
    if where is None:
        raise BadInputError(f"lab.kind: expected one of {', '.join(LAB_KINDS)}, got {kind!r}")
    module, _, name = where.partition(":")
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise BadInputError(f"lab.kind {kind}: not available here ({exc})") from None
