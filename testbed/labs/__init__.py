"""Labs: one `Lab` interface (`interface`), its kinds (`kinds`: namespaces, mininet, inventory),
what a lab should look like (`setup`), and every system command through one runner (`system`)."""

from __future__ import annotations

from testbed.labs.clean import clean_all, leftovers
from testbed.labs.emulated import EmulatedLab, LabStatus
from testbed.labs.interface import Lab, LinkSite
from testbed.labs.kinds import LAB_KINDS, lab_class
from testbed.labs.setup import LabHost, LabSetup
from testbed.labs.system import SystemRunner

__all__ = [
    "LAB_KINDS",
    "EmulatedLab",
    "Lab",
    "LabHost",
    "LabSetup",
    "LabStatus",
    "LinkSite",
    "SystemRunner",
    "clean_all",
    "lab_class",
    "leftovers",
]
