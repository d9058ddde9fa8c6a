"""Scheduling priority for the link helpers (packet holder, probe)."""

from __future__ import annotations

import contextlib
import os


def set_realtime(prio: int) -> None:
    """SCHED_FIFO at `prio` (else nice -10), so a busy CPU does not delay packet timing."""
    if prio <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -10)
