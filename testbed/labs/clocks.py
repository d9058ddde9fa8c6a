"""The clocks of a lab's machines against the controller's (`testbed.metrics.clocks`).

A command runner stands for the machine it runs on: one that runs here (a namespace host, the
emulated lab's bridge) shares the controller's kernel clock, offset exactly 0; one that runs
over SSH (a physical lab's host or middlebox, a rehearsal host) is probed with `date`, each
probe timed around the whole command, so its error bound covers the connection's round trip.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from testbed.core.errors import LabError
from testbed.labs.interface import LinkSite
from testbed.labs.system import SystemRunner
from testbed.metrics.clocks import CONTROLLER, ClockOffset, measure_offset

PROBES = 3  # the best of these is kept
TIMEOUT_S = 20.0  # one probe, over SSH


def machine_clock(runner: SystemRunner, probes: int = PROBES) -> ClockOffset:
    """The offset of the clock of the machine `runner` runs on: `CONTROLLER` for this machine,
    and in a dry run (which measures nothing), else measured over the runner's connection."""
    if not runner.remote or runner.dry_run:
        return CONTROLLER

    def remote_time() -> float:
        out = runner.run(["date", "+%s.%N"], query=True, timeout=TIMEOUT_S).stdout.strip()
        try:
            return float(out)
        except ValueError:
            raise LabError(
                f"`date +%s.%N` through {shlex.join(runner.remote)} printed {out!r}; expected "
                "seconds since the epoch (GNU date)"
            ) from None

    return measure_offset(remote_time, probes=probes)


def host_clocks(lab: LinkSite, names: Iterable[str]) -> dict[str, ClockOffset]:
    """Each named lab host's clock offset (`machine_clock` through the lab's runner for it)."""
    return {name: machine_clock(lab.host_runner(name)) for name in names}
