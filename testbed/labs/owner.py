"""Which process owns a lab, recorded on the machine so that a lab left by a dead owner is known.

A lab brought up for a run or a test belongs to that process: it takes the lab down at the end.
If the process dies first (killed, machine session reset), the lab is abandoned and the next
`up` of that name removes it instead of refusing. A lab brought up by `testbed lab up` has no
owner: it stays until `testbed lab down`.

The record lives under /run (a tmpfs, empty after a reboot, as the namespaces are) and holds
the owner's pid and its start time, so that a reused pid is not taken for the owner.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from testbed.labs.discover import process_start

OWNERS_DIR = Path("/run/edge-testbed/labs")


@dataclass(frozen=True)
class Owner:
    """A process, named by its pid and its start time (clock ticks after boot)."""

    pid: int
    started: int

    def alive(self) -> bool:
        """True if that very process still runs (same pid, same start time, not a zombie)."""
        return process_start(self.pid) == self.started


def _path(lab: str) -> Path:
    return OWNERS_DIR / f"{lab}.json"


def claim(lab: str, pid: int | None = None) -> Owner:
    """Record process `pid` (this one by default) as the owner of lab `lab`."""
    pid = pid if pid is not None else os.getpid()
    started = process_start(pid)
    if started is None:
        raise ValueError(f"process {pid} is not running")
    owner = Owner(pid, started)
    OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    tmp = _path(lab).with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": owner.pid, "started": owner.started}))
    tmp.replace(_path(lab))
    return owner


def release(lab: str) -> None:
    """Forget lab `lab`'s owner (the lab is down, or now persistent)."""
    _path(lab).unlink(missing_ok=True)


def recorded(lab: str) -> Owner | None:
    """The owner recorded for lab `lab`; None if none is, or the record is unreadable."""
    try:
        data = json.loads(_path(lab).read_text())
        return Owner(int(data["pid"]), int(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def abandoned_by(lab: str) -> Owner | None:
    """The recorded owner of lab `lab` if that process has ended (the lab is abandoned)."""
    owner = recorded(lab)
    return owner if owner is not None and not owner.alive() else None
