"""One place that runs system commands (ip, tc, iptables, sshd...) or, in dry-run, prints them.

Every module of the lab and of the impairment backends goes through a `SystemRunner`, so that
`--dry-run` shows exactly the actions a real run would take and creates nothing.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testbed.core.command import CommandResult
from testbed.core.errors import LabError, PrivilegeError, TestbedError
from testbed.core.files import atomic_replace


def netns_argv(argv: Sequence[str], netns: str | None) -> list[str]:
    """`argv` wrapped in `ip netns exec NETNS` when a namespace is given."""
    return ["ip", "netns", "exec", netns, *argv] if netns else list(argv)


def _default_echo(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


@dataclass
class SystemRunner:
    """Runs commands, or records and prints them when `dry_run` is set.

    `actions` keeps every action (command line or file write) in order, dry or not, so that
    callers and tests can show or check what was done.
    """

    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    actions: list[str] = field(default_factory=list)
    remote: tuple[str, ...] = ()
    """A command prefix that runs one shell line on another machine (`ssh ... user@host`):
    set for a physical lab's hosts and middlebox; empty to run here."""
    become: tuple[str, ...] = ()
    """A prefix that gives each command root where it runs (`sudo -n`): set where the user
    commands run as is not root. Every command of a runner needs it (ip, tc, iptables, nft,
    modprobe, sysctl, the packet holder and the link probe); see `become_prefix`."""
    netns: str | None = None
    """The network namespace every command runs in unless the call names one (a namespace
    host's runner)."""

    def _argv(self, argv: Sequence[str], netns: str | None) -> list[str]:
        full = [*self.become, *netns_argv([str(a) for a in argv], netns or self.netns)]
        return [*self.remote, shlex.join(full)] if self.remote else full

    def record(self, text: str) -> None:
        """Note an action (and print it in dry-run or when an `echo` is set)."""
        self.actions.append(text)
        if self.dry_run:
            (self.echo or _default_echo)(f"[dry-run] {text}")
        elif self.echo is not None:
            self.echo(text)

    def run(
        self,
        argv: Sequence[str],
        *,
        netns: str | None = None,
        check: bool = True,
        query: bool = False,
        input: str | None = None,
        timeout: float = 60.0,
        error: type[TestbedError] = LabError,
    ) -> CommandResult:
        """Run `argv` (in `netns` if given) and return its result.

        `query=True` marks a read-only command: it runs even in dry-run, unrecorded (listing
        namespaces, reading rules). With `check`, a non-zero exit raises `error` with stderr.
        """
        full = self._argv(argv, netns)
        line = shlex.join(full)
        if input and not query:
            line += " <<EOF\n" + input.rstrip("\n") + "\nEOF"
        if not query:
            self.record(line)
            if self.dry_run:
                return CommandResult(line, 0)
        try:
            proc = subprocess.run(
                full, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except FileNotFoundError as exc:
            raise PrivilegeError(f"`{full[0]}` is not installed (needed for: {line})") from exc
        except subprocess.TimeoutExpired as exc:
            raise error(f"timed out after {timeout:.0f} s: {line}") from exc
        res = CommandResult(line, proc.returncode, proc.stdout, proc.stderr)
        if check and not res.ok:
            raise error(f"command failed (exit {res.returncode}): {line}\n{res.stderr.strip()}")
        return res

    def spawn(
        self,
        argv: Sequence[str],
        *,
        netns: str | None = None,
        stdout: int | None = subprocess.DEVNULL,
        stderr_path: Path | None = None,
        detach: bool = True,
        stdin: int | None = subprocess.DEVNULL,
    ) -> subprocess.Popen[bytes] | None:
        """Start a long-running process (in `netns`); `None` in dry-run.

        `detach` puts it in its own session so it outlives this process (a lab outlives the
        `testbed lab up` command that made it). `stdin=subprocess.PIPE` gives the process a
        pipe whose close it sees as end of input, over SSH too (how the link probe's
        responder is told to stop on another machine).
        """
        full = self._argv(argv, netns)
        line = shlex.join(full)
        self.record(line + " &")
        if self.dry_run:
            return None
        err = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            return subprocess.Popen(
                full,
                stdin=stdin,
                stdout=stdout,
                stderr=err,
                start_new_session=detach,
                close_fds=True,
            )
        except FileNotFoundError as exc:
            raise PrivilegeError(f"`{full[0]}` is not installed (needed for: {line})") from exc
        finally:
            if stderr_path:
                err.close()

    def write_file(self, path: Path, text: str, mode: int = 0o644) -> None:
        """Write a file (recorded; skipped in dry-run)."""
        self.record(f"write {path} ({len(text)} bytes)")
        if self.dry_run:
            return
        with atomic_replace(path) as tmp:
            tmp.write_text(text)
            os.chmod(tmp, mode)

    def remove_tree(self, path: Path) -> None:
        """Delete a directory tree (recorded; skipped in dry-run)."""
        self.record(f"rm -r {path}")
        if not self.dry_run:
            shutil.rmtree(path, ignore_errors=True)

    def mkdir(self, path: Path) -> None:
        """Create a directory and its parents (recorded; skipped in dry-run)."""
        self.record(f"mkdir -p {path}")
        if not self.dry_run:
            path.mkdir(parents=True, exist_ok=True)

    def kill(self, pid: int, sig: int) -> bool:
        """Send `sig` to `pid`; False when it no longer exists."""
        self.record(f"kill -{int(sig)} {pid}")
        if self.dry_run:
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True


def become_prefix(user: str, remote: bool) -> tuple[str, ...]:
    """`sudo -n` where commands run as a user other than root: `user` on another machine
    (`remote`), or this process's user here; nothing for root. `-n`: a user without
    passwordless sudo fails at once, naming sudo, instead of waiting for a password."""
    is_root = user == "root" if remote else os.geteuid() == 0
    return () if is_root else ("sudo", "-n")


def require_root() -> None:
    """Raise PrivilegeError unless running as root (namespaces, veths and rules need it)."""
    if os.geteuid() != 0:
        raise PrivilegeError(
            "the emulated lab needs root (network namespaces, veths, netfilter rules); "
            "run as root or use a physical lab inventory"
        )
