"""Which impairment backend this kernel supports, found by trying it in a scratch namespace."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from testbed.core.errors import BadInputError, ImpairmentError, PrivilegeError
from testbed.labs import naming
from testbed.labs.system import SystemRunner

BackendName = Literal["netem", "nfqueue"]
_netem_cache: bool | None = None


def netem_available(runner: SystemRunner | None = None) -> bool:
    """True if `tc qdisc add ... netem` works here (tried once per process, then cached).

    In dry-run nothing is created: the answer is guessed from the kernel's module tree.
    """
    global _netem_cache
    runner = runner or SystemRunner()
    if runner.dry_run:
        mods = Path("/lib/modules") / platform.release() / "kernel/net/sched"
        return any(mods.glob("sch_netem.ko*"))
    if _netem_cache is None:
        ns = f"{naming.PREFIX}np{os.getpid()}-probe"
        scratch = SystemRunner()  # a probe, not an action worth showing
        try:
            scratch.run(["ip", "netns", "add", ns])
            res = scratch.run(
                ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                netns=ns,
                check=False,
            )
            _netem_cache = res.ok
        finally:
            scratch.run(["ip", "netns", "del", ns], check=False)
    return _netem_cache


def choose_backend(
    requested: str = "auto",
    runner: SystemRunner | None = None,
    probe: Callable[[], bool] | None = None,
    *,
    varies: bool = False,
) -> tuple[BackendName, str]:
    """(backend, why) for `requested` in auto | netem | nfqueue; `probe` says whether the
    kernel(s) where links are impaired have sch_netem (default: this machine's). A link that
    `varies` (a schedule or a trace) needs the packet holder, whatever the kernel has."""
    if requested not in ("auto", "netem", "nfqueue"):
        raise BadInputError(f"backend: expected auto, netem or nfqueue, got {requested!r}")
    if requested == "nfqueue":
        return "nfqueue", "requested"
    if varies:
        if requested == "netem":
            raise ImpairmentError(
                "tc netem cannot run a schedule or trace: use backend nfqueue or auto, whose "
                "packet holder steps through them"
            )
        return "nfqueue", "a schedule or trace: the packet holder steps through it"
    if requested == "netem" and probe is not None and runner is not None and runner.dry_run:
        return "netem", "requested (unchecked: a dry run touches no host)"
    has_netem = probe() if probe else netem_available(runner)
    if requested == "netem":
        if not has_netem:
            raise PrivilegeError(
                "backend netem requested but this kernel has no sch_netem "
                "(use --backend nfqueue or auto)"
            )
        return "netem", "requested"
    if has_netem:
        return "netem", "kernel has sch_netem"
    return "nfqueue", "kernel has no sch_netem: userspace NFQUEUE holder"
