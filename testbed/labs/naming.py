"""Names of everything a lab creates; all start with one prefix so `clean` can find leftovers."""

from __future__ import annotations

import re

PREFIX = "tb-"
"""Every namespace, root-namespace link and holder process name of a lab starts with this."""

LAB_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
"""Lab names are short: the controller's veth `tb-<name>-c` must fit Linux's 15-char limit."""

BRIDGE = "br0"
CONTROLLER_PORT = "p-root"
HOST_IFACE = "eth0"


def netns_prefix(lab: str) -> str:
    """Prefix shared by every namespace of lab `lab`."""
    return f"{PREFIX}{lab}-"


def bridge_netns(lab: str) -> str:
    """The namespace that holds the bridge, the impairment rules and the packet holders."""
    return f"{netns_prefix(lab)}sw"


def host_netns(lab: str, host: str) -> str:
    return f"{netns_prefix(lab)}{host}"


def controller_link(lab: str) -> str:
    """The controller's veth end in the root namespace."""
    return f"{PREFIX}{lab}-c"


def bridge_port(host: str) -> str:
    """The bridge-side veth end of a host (inside the bridge namespace, so names are local)."""
    return f"p-{host}"


def device_name(index: int) -> str:
    """Name of device `index` (1-based)."""
    return f"dev{index}"


def lab_of_netns(netns: str) -> str | None:
    """The lab name a `tb-<lab>-<x>` namespace belongs to, or None if it is not a lab's."""
    if not netns.startswith(PREFIX):
        return None
    rest = netns[len(PREFIX) :]
    lab, sep, _ = rest.partition("-")
    return lab if sep and LAB_NAME_RE.match(lab) else None
