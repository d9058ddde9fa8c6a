"""Link impairment of the device <-> server links: tc netem or the userspace NFQUEUE holder.

imp = apply(lab, LinkProfile(rtt_ms=85, loss=0.1))   # all devices; verified in place
results = probe_links(lab)                            # measured RTT and loss per device
clear(lab)
"""

from __future__ import annotations

from testbed.netem.api import Impairment, apply, clear, current, verify
from testbed.netem.detect import choose_backend, netem_available
from testbed.netem.probe import ProbeResult, format_result, probe_link, probe_links
from testbed.netem.profile import LOSS_SEMANTICS, LinkProfile

__all__ = [
    "LOSS_SEMANTICS",
    "Impairment",
    "LinkProfile",
    "ProbeResult",
    "apply",
    "choose_backend",
    "clear",
    "current",
    "format_result",
    "netem_available",
    "probe_link",
    "probe_links",
    "verify",
]
