"""Fabric host control: the same calls drive the emulated lab and physical hosts.

    with HostControl(load_inventory("lab.yml")) as hc:
        hc.run_all("uname -a")
        proc = hc.start("server", "verifier", "python -m agents.sled.server", env={"X": "1"})
        hc.is_alive(proc)
        hc.stop(proc)
        hc.get("server", "records.parquet", "results/run1/server.parquet")

Background processes run under `setsid` in the host's working directory, with a pid file, a
log file and an exit-code file in `<workdir>/.testbed/`; `stop` signals the whole process group
(SIGTERM, then SIGKILL after a grace period). In dry-run every action is printed, none is done.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.core.command import CommandResult
from testbed.core.errors import AgentError, BadInputError
from testbed.core.fanout import GroupResult, fan_out, raise_failures
from testbed.hosts.inventory import Inventory, InventoryHost

T = TypeVar("T")
PROC_DIR = ".testbed"
"""Per-host folder (inside the workdir) holding background processes' pid/log/rc files."""


@dataclass(frozen=True)
class RemoteProcess:
    """A background process started by `HostControl.start`."""

    host: str
    name: str
    pid: int
    workdir: str
    pid_file: str
    log_file: str
    rc_file: str


def remote_path(path: str) -> str:
    """Shell word for a remote path: quoted, but a leading `~/` still expands to $HOME."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _check_name(name: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise BadInputError(f"process name {name!r}: expected letters, digits, '-', '_' or '.'")


def env_prefix(env: Mapping[str, str] | None) -> str:
    """`export K=V && ` prefix (inline, so the sshd needs no AcceptEnv; `$K` works too)."""
    if not env:
        return ""
    for key in env:
        if not key.isidentifier():
            raise BadInputError(f"environment variable name {key!r} is not valid")
    return "export " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) + " && "


def start_script(
    workdir: str, name: str, command: str, env: Mapping[str, str] | None = None
) -> str:
    """Shell script that starts `command` detached in `workdir` and prints its pid.

    A `setsid sh` wrapper (the new session's leader, so `stop` can signal the whole group)
    writes its pid, runs the command in a subshell, then writes the command's exit code.
    """
    _check_name(name)
    d = f"{remote_path(workdir)}/{PROC_DIR}"
    pid, rc, log = f"{d}/{name}.pid", f"{d}/{name}.rc", f"{d}/{name}.log"
    inner = f"echo $$ > {pid}; ({env_prefix(env)}{command}); echo $? > {rc}"
    return (
        f"mkdir -p {d} && cd {remote_path(workdir)} && rm -f {pid} {rc} && "
        f"(setsid sh -c {shlex.quote(inner)} > {log} 2>&1 < /dev/null &) && "
        f"for i in $(seq 250); do [ -s {pid} ] && break; sleep 0.02; done; cat {pid}"
    )


def stop_script(pid: int, grace_s: float) -> str:
    """SIGTERM the process group of `pid`, SIGKILL it if still alive after `grace_s`."""
    steps = max(1, int(grace_s / 0.1))
    return (
        f"kill -TERM -- -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null; "
        f"for i in $(seq {steps}); do {alive_script(pid)} || exit 0; sleep 0.1; done; "
        f"kill -KILL -- -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; echo killed"
    )


def alive_script(pid: int) -> str:
    """Exit 0 while any process of the group led by `pid` runs (zombies do not count)."""
    return f"ps -e -o pgid=,stat= | awk '$1 == {pid} && $2 !~ /^Z/ {{f = 1}} END {{exit !f}}'"


class HostControl:
    """A pool of Fabric connections to an inventory's hosts; thread-safe per host."""

    def __init__(
        self,
        inventory: Inventory,
        dry_run: bool = False,
        connect_timeout: int = 10,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.inventory = inventory
        self.dry_run = dry_run
        self.connect_timeout = connect_timeout
        self.echo = echo or (lambda line: print(line, flush=True))
        self.actions: list[str] = []
        self._conns: dict[str, Any] = {}
        self._locks = {h.name: threading.Lock() for h in (*inventory.hosts, *inventory.middleboxes)}
        self._pool_lock = threading.Lock()

    # --- connections -----------------------------------------------------------------------

    def host(self, name: str | InventoryHost) -> InventoryHost:
        return name if isinstance(name, InventoryHost) else self.inventory.host(name)

    def connection(self, name: str | InventoryHost) -> Any:
        """The (cached) `fabric.Connection` to a host: key auth only, new host keys accepted."""
        h = self.host(name)
        with self._pool_lock:
            conn = self._conns.get(h.name)
            if conn is None:
                from fabric import Config, Connection

                kwargs: dict[str, Any] = {"allow_agent": False, "look_for_keys": h.key_file is None}
                if h.key_file is not None:
                    kwargs["key_filename"] = str(h.key_file)
                conn = Connection(
                    host=h.address,
                    user=h.user,
                    port=h.port,
                    connect_timeout=self.connect_timeout,
                    connect_kwargs=kwargs,
                    config=Config(overrides={"load_ssh_configs": False}),
                )
                self._conns[h.name] = conn
            return conn

    def close(self) -> None:
        with self._pool_lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()

    def __enter__(self) -> HostControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- commands --------------------------------------------------------------------------

    def _note(self, h: InventoryHost, text: str) -> bool:
        """Record an action; True if it should be skipped (dry-run)."""
        line = f"ssh {h.user}@{h.address} ({h.name}): {text}"
        self.actions.append(line)
        if self.dry_run:
            self.echo(f"[dry-run] {line}")
        return self.dry_run

    def _exec(self, h: InventoryHost, full: str, timeout: float | None = None) -> CommandResult:
        """Run `full` on `h` over SSH (no record, no check); AgentError naming the host."""
        from invoke.exceptions import CommandTimedOut

        try:
            with self._locks[h.name]:
                started = time.monotonic()
                res = self.connection(h).run(
                    full, hide=True, warn=True, timeout=timeout, in_stream=False
                )
                ran_s = time.monotonic() - started
            # invoke's timer closes the channel before it counts as expired, so a kill
            # can surface as exit -1 instead of CommandTimedOut: judge by the clock too.
            if timeout is not None and res.exited == -1 and ran_s >= timeout:
                raise CommandTimedOut(res, timeout=timeout)
        except CommandTimedOut as exc:
            raise AgentError(f"{h.name}: timed out after {timeout} s: {full}") from exc
        except Exception as exc:  # paramiko/socket errors: name the host
            raise AgentError(f"{h.name} ({h.address}): cannot run {full!r}: {exc}") from exc
        return CommandResult(full, res.exited, res.stdout, res.stderr, h.name)

    def run(
        self,
        host: str | InventoryHost,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        check: bool = True,
    ) -> CommandResult:
        """Run a shell command on `host` (in `cwd`, default its workdir); output captured."""
        h = self.host(host)
        full = f"cd {remote_path(cwd or h.workdir)} && {env_prefix(env)}{command}"
        if self._note(h, full):
            return CommandResult(full, 0, host=h.name)
        out = self._exec(h, full, timeout)
        if check and not out.ok:
            raise AgentError(
                f"{h.name}: command failed (exit {out.returncode}): {command}\n"
                f"{out.stderr.strip()[-2000:]}"
            )
        return out

    def run_all(
        self,
        command: str,
        hosts: Iterable[str | InventoryHost] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        check: bool = True,
        max_workers: int = 32,
    ) -> GroupResult:
        """Run `command` on every host (default: all) in parallel, like Fabric's `Group.run`.

        Returns host -> CommandResult. A host that cannot run it (or, with `check`, exits non-zero)
        is a failure: GroupError, whose `.result` keeps the successes and each failure.
        """

        def one(h: InventoryHost) -> CommandResult:
            out = self.run(h, command, env=env, timeout=timeout, check=False)
            if check and not out.ok:
                raise AgentError(f"{h.name}: exit {out.returncode} {out.stderr.strip()[-300:]}")
            return out

        return raise_failures(
            repr(command), fan_out(one, self._targets(hosts), max_workers=max_workers)
        )

    def parallel(
        self,
        fn: Callable[[InventoryHost], T],
        hosts: Iterable[str | InventoryHost] | None = None,
        *,
        max_workers: int = 32,
        what: str = "action",
    ) -> GroupResult:
        """`fn(host)` for each host (default: all) in threads: host -> result, or GroupError."""
        return raise_failures(what, fan_out(fn, self._targets(hosts), max_workers=max_workers))

    def _targets(self, hosts: Iterable[str | InventoryHost] | None) -> list[InventoryHost]:
        return [self.host(h) for h in (hosts if hosts is not None else self.inventory.hosts)]

    def start_all(
        self,
        name: str,
        command: str | Callable[[InventoryHost], str],
        hosts: Iterable[str | InventoryHost] | None = None,
        *,
        env: Mapping[str, str] | Callable[[InventoryHost], Mapping[str, str]] | None = None,
    ) -> GroupResult:
        """Start `name` on every host in parallel (host -> RemoteProcess, or GroupError);
        `command`/`env` may depend on the host."""

        def one(h: InventoryHost) -> RemoteProcess:
            cmd = command(h) if callable(command) else command
            e = env(h) if callable(env) else env
            return self.start(h, name, cmd, env=e)

        return self.parallel(one, hosts, what=f"starting {name}")

    def stop_all(self, procs: Iterable[RemoteProcess], grace_s: float = 5.0) -> GroupResult:
        """Stop several processes in parallel; "host/name" -> whether it had to be killed."""
        result = fan_out(lambda p: self.stop(p, grace_s), procs, lambda p: f"{p.host}/{p.name}")
        return raise_failures("stopping", result)

    # --- background processes --------------------------------------------------------------

    def start(
        self,
        host: str | InventoryHost,
        name: str,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
    ) -> RemoteProcess:
        """Start `command` detached on `host` (setsid, nohup-like); returns its handle.

        Files: `<workdir>/.testbed/<name>.pid|.log|.rc` (rc is written when it exits).
        """
        h = self.host(host)
        wd = workdir or h.workdir
        d = f"{wd}/{PROC_DIR}"
        proc = RemoteProcess(h.name, name, 0, wd, f"{d}/{name}.pid", f"{d}/{name}.log",
                             f"{d}/{name}.rc")  # fmt: skip
        script = start_script(wd, name, command, env)
        if self._note(h, f"start {name}: {env_prefix(env)}{command}"):
            return proc
        res = self._exec(h, script, timeout=30)
        try:
            pid = int(res.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise AgentError(f"{h.name}: {name} did not start: {res.stdout} {res.stderr}") from exc
        return RemoteProcess(h.name, name, pid, wd, proc.pid_file, proc.log_file, proc.rc_file)

    def is_alive(self, proc: RemoteProcess) -> bool:
        """True while the process runs."""
        h = self.host(proc.host)
        if self._note(h, f"alive? {proc.name} (pid {proc.pid})"):
            return True
        return self._exec(h, alive_script(proc.pid), timeout=30).ok

    def exit_code(self, proc: RemoteProcess) -> int | None:
        """The process's exit code once it has ended by itself, else None."""
        res = self.run(proc.host, f"cat {remote_path(proc.rc_file)} 2>/dev/null", check=False)
        text = res.stdout.strip()
        return int(text) if text.lstrip("-").isdigit() else None

    def stop(self, proc: RemoteProcess, grace_s: float = 5.0) -> bool:
        """SIGTERM the process group, SIGKILL after `grace_s`; True if it had to be killed."""
        h = self.host(proc.host)
        if self._note(h, f"stop {proc.name} (pid {proc.pid}, grace {grace_s:g} s)"):
            return False
        res = self._exec(h, stop_script(proc.pid, grace_s), timeout=grace_s + 30)
        return "killed" in res.stdout

    def log_tail(self, proc: RemoteProcess, lines: int = 40) -> str:
        res = self.run(proc.host, f"tail -n {lines} {remote_path(proc.log_file)}", check=False)
        return res.stdout

    # --- files -----------------------------------------------------------------------------

    def put(self, host: str | InventoryHost, local: Path | str, remote: str) -> None:
        """Copy a local file to `remote` (relative paths: under the host's workdir)."""
        h = self.host(host)
        target = remote if remote.startswith("/") else f"{h.workdir}/{remote}"
        if self._note(h, f"put {local} -> {target}"):
            return
        try:
            with self._locks[h.name]:
                self.connection(h).put(str(local), remote=target)
        except Exception as exc:
            raise AgentError(f"{h.name}: cannot copy {local} to {target}: {exc}") from exc

    def get(self, host: str | InventoryHost, remote: str, local: Path | str) -> Path:
        """Fetch `remote` (relative: under the workdir) into the local path; returns it."""
        h = self.host(host)
        source = remote if remote.startswith("/") else f"{h.workdir}/{remote}"
        local = Path(local)
        if self._note(h, f"get {source} -> {local}"):
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self._locks[h.name]:
                self.connection(h).get(source, local=str(local))
        except Exception as exc:
            raise AgentError(f"{h.name}: cannot fetch {source}: {exc}") from exc
        return local
