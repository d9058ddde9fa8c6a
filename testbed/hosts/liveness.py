"""Which hosts answer: a lab on hardware goes on without a device that is down (a Pi unplugged,
one that froze), and says which."""

from __future__ import annotations

from collections.abc import Iterable

from testbed.core.fanout import fan_out
from testbed.hosts.control import HostControl
from testbed.hosts.inventory import InventoryHost

ANSWER_TIMEOUT_S = 15.0
"""How long a host may take to run `true` over SSH (the connection's own timeout is 10 s)."""


def not_answering(
    hc: HostControl, hosts: Iterable[str | InventoryHost], timeout_s: float = ANSWER_TIMEOUT_S
) -> dict[str, str]:
    """Host name -> why, for each of `hosts` that does not run `true` over SSH within
    `timeout_s`; empty in a dry run, which contacts no host."""
    if hc.dry_run:
        return {}
    targets = [hc.host(h) for h in hosts]
    answered = fan_out(lambda h: hc.run(h, "true", cwd="/", timeout=timeout_s), targets)
    return answered.reasons()
