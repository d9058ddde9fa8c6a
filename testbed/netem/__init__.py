"""Link impairment of the device <-> server links: tc netem or the userspace NFQUEUE holder.

imp = apply(lab, LinkProfile(rtt_ms=85, loss=0.1))   # all devices; verified in place
results = probe_links(lab)                            # measured RTT and loss per device
clear(lab)

Names are imported on first use (PEP 562), so that `testbed.netem.profile` can be imported by
the topology and lab models without pulling in the backends (which import the lab).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Impairment": "api",
    "apply": "api",
    "clear": "api",
    "current": "api",
    "verify": "api",
    "choose_backend": "detect",
    "netem_available": "detect",
    "ProbeResult": "probe",
    "format_result": "probe",
    "probe_link": "probe",
    "probe_links": "probe",
    "LOSS_SEMANTICS": "profile",
    "LinkProfile": "profile",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
