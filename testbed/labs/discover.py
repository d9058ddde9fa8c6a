"""Find what a lab left on the system: namespaces, root-namespace links, processes.

These look at the system itself, not at a state file, so `clean` and the tests can trust them.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from testbed.labs import naming
from testbed.labs.system import SystemRunner

TAG_FLAG = "--tag"
"""Helper processes (packet holders, probes) carry `--tag tb-<lab>` in their argv."""


def list_netns(runner: SystemRunner, prefix: str = naming.PREFIX) -> list[str]:
    """Network namespaces whose name starts with `prefix`."""
    out = runner.run(["ip", "netns", "list"], query=True, check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def netns_pids(runner: SystemRunner, netns: str) -> list[int]:
    """Processes living in `netns` (empty if it does not exist)."""
    res = runner.run(["ip", "netns", "pids", netns], query=True, check=False)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def root_links(runner: SystemRunner, prefix: str = naming.PREFIX) -> list[str]:
    """Links in the root namespace whose name starts with `prefix`."""
    out = runner.run(["ip", "-o", "link", "show"], query=True, check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return sorted(n for n in names if n.startswith(prefix))


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_lab_process(argv: list[str], prefix: str = naming.PREFIX) -> bool:
    """True for a lab's sshd (config named `tb-...`) or a helper tagged `--tag tb-...`.

    sshd rewrites its argv into one title string ("sshd: /usr/sbin/sshd -f ... [listener]"),
    so the words are compared, not the original arguments.
    """
    words = " ".join(argv).split()
    is_sshd = any(os.path.basename(w).rstrip(":") == "sshd" for w in words[:2])
    for word, nxt in zip(words, words[1:]):
        if word == TAG_FLAG and nxt.startswith(prefix):
            return True
        if is_sshd and word == "-f" and os.path.basename(nxt).startswith(prefix):
            return True
    return False


def tagged_processes(prefix: str = naming.PREFIX) -> list[tuple[int, str]]:
    """(pid, command line) of every lab process on the machine, wherever its namespace."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        argv = _cmdline(int(entry.name))
        if argv and is_lab_process(argv, prefix):
            found.append((int(entry.name), " ".join(argv)))
    return sorted(found)


def process_start(pid: int) -> int | None:
    """The start time of live process `pid` in clock ticks after boot; None if it is gone or
    a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] == "Z":
        return None
    return int(fields[19])  # field 22 of proc(5); these fields start at field 3


def pid_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    return process_start(pid) is not None


def kill_pids(runner: SystemRunner, pids: list[int], grace: float = 2.0) -> list[int]:
    """SIGTERM `pids`, then SIGKILL those still alive after `grace` s; returns those signalled."""
    pids = [p for p in pids if p != os.getpid()]
    hit = [p for p in pids if runner.kill(p, signal.SIGTERM)]
    if runner.dry_run:
        return hit
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in hit):
        time.sleep(0.02)
    for p in hit:
        if pid_alive(p):
            runner.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(pid_alive(p) for p in hit):
        time.sleep(0.02)
    return hit
