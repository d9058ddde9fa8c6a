"""The emulated lab: network namespaces on a bridge with an sshd per host (see `emulated`)."""

from __future__ import annotations

from testbed.lab.clean import clean_all, leftovers
from testbed.lab.emulated import EmulatedLab, LabStatus
from testbed.lab.spec import LabHost, LabSpec
from testbed.lab.system import SystemRunner

__all__ = [
    "EmulatedLab",
    "LabHost",
    "LabSpec",
    "LabStatus",
    "SystemRunner",
    "clean_all",
    "leftovers",
]
