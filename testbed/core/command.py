"""What one command returned, run on this machine (`testbed.labs.system.SystemRunner`) or on a
lab host over SSH (`testbed.hosts.control.HostControl`): the one result type of both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CommandResult:
    """A command's exit status and output (empty output and rc 0 for a dry-run action)."""

    command: str  # as run (a shell line, or an argv joined with shlex)
    returncode: int
    stdout: str = ""
    stderr: str = ""
    host: str | None = None  # where it ran; None: this machine

    @property
    def ok(self) -> bool:
        return self.returncode == 0
