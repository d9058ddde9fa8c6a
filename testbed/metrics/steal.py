"""CPU time the hypervisor took from this VM (`steal` in /proc/stat), to tell a VM stall from a
fault of the code measured: a run that lost tens of milliseconds to steal shows it in its tail."""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def steal_ms(stat: Path = PROC_STAT) -> float | None:
    """Steal time of all CPUs together since boot, in ms; None where the kernel reports none."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if len(first) < 9 or first[0] != "cpu" or not first[8].isdigit():
        return None
    return int(first[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")
