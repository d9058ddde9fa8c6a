"""The agents of a condition, watched for as long as it runs.

Every agent the runner starts is kept here (`keep`): those that end by themselves (device
agents, BALANCE clients, a server-alone answerer) may exit with status 0; a server may not exit
at all before the runner stops it (`release`, then stop). Any other end is a fault
(`FaultRecord`): the host, the agent, its exit status or the signal that ended it, when (the
exit-status file's time on the host's clock moved onto the controller's, or the time it was
seen gone), and the last lines of its log. A host that no longer answers is a fault too.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from testbed.core.errors import AgentEnded, AgentError
from testbed.hosts.control import HostControl, RemoteProcess, remote_path
from testbed.metrics.clocks import CONTROLLER, ClockOffset
from testbed.metrics.schemas import FaultRecord

POLL_S = 0.5
LOG_LINES = 12


def exit_reason(status: int | None) -> tuple[str, str | None]:
    """How an exit status reads, and the signal it names: a shell gives 128 + n for a process
    that signal n ended."""
    if status is None:
        return "ended with no exit status (its process group was killed)", None
    if status > 128:
        try:
            name = signal.Signals(status - 128).name
        except ValueError:
            return f"exited with status {status}", None
        return f"killed by {name} (exit {status})", name
    return f"exited with status {status}", None


@dataclass
class Watched:
    proc: RemoteProcess
    ends_itself: bool  # True: an exit with status 0 is its normal end
    ended: bool = False


class AgentWatch:
    """A condition's agents, polled until they end or the runner stops them."""

    def __init__(
        self,
        hosts: HostControl,
        condition: str,
        started: float,
        dilation: float = 1.0,
        clocks: dict[str, ClockOffset] | None = None,
        say: Callable[[str], None] = print,
        sink: list[FaultRecord] | None = None,
    ) -> None:
        """`sink`: where the faults go (the run's list for the condition, so that a condition
        that fails still names them)."""
        self.hosts, self.condition, self.started = hosts, condition, started
        self.dilation, self.clocks, self.say = dilation, clocks or {}, say
        self._watched: dict[tuple[str, str], Watched] = {}
        self._checks: dict[tuple[str, str], Callable[[], bool]] = {}  # a helper: is it running?
        self._faults: list[FaultRecord] = sink if sink is not None else []
        self._lock = threading.Lock()

    def keep(self, proc: RemoteProcess, ends_itself: bool) -> None:
        """Watch `proc` from now on."""
        with self._lock:
            self._watched[(proc.host, proc.name)] = Watched(proc, ends_itself)

    def keep_all(self, procs: Iterable[RemoteProcess], ends_itself: bool) -> None:
        for p in procs:
            self.keep(p, ends_itself)

    def keep_check(self, host: str, agent: str, running: Callable[[], bool]) -> None:
        """Watch a helper the runner did not start per condition (the lab's failover monitor)
        by asking `running()`: once it says no, that is a fault (no exit status to read)."""
        with self._lock:
            self._checks[(host, agent)] = running

    def release(self, proc: RemoteProcess) -> None:
        """The runner (or an injected fault) ends `proc` next: no longer watched."""
        with self._lock:
            self._watched.pop((proc.host, proc.name), None)

    def condition_s(self, t: float) -> float:
        """Controller time `t` as emulated seconds since the condition's start."""
        return (t - self.started) / self.dilation

    def record(self, fault: FaultRecord) -> None:
        with self._lock:
            self._faults.append(fault)
        kind = "asked for" if fault.injected else "FAULT"
        self.say(f"{self.condition}: {kind}: {fault.reason}")

    def records(self) -> list[FaultRecord]:
        with self._lock:
            return list(self._faults)

    def poll(self) -> None:
        """Look at every watched agent once; record each that ended as a fault, but an
        agent that ends by itself with status 0."""
        with self._lock:
            todo = [w for w in self._watched.values() if not w.ended]
            checks = list(self._checks.items())
        for (host, agent), running in checks:
            if not running():
                with self._lock:
                    self._checks.pop((host, agent), None)
                at = self.condition_s(time.time())
                reason = f"{agent} on {host} stopped running at {at:.1f} s"
                self.record(FaultRecord(self.condition, host, agent, reason, time.time(), at))
        for w in todo:
            try:
                alive = self.hosts.is_alive(w.proc)
            except Exception as exc:  # the host stopped answering: a lost host
                if self._still_watched(w):
                    w.ended = True
                    self.record(self._lost(w.proc, exc))
                continue
            if alive or not self._still_watched(w):
                continue  # running, or released meanwhile (the runner or an injector ends it)
            w.ended = True
            status = self.hosts.exit_code(w.proc)
            if not (w.ends_itself and status == 0):
                self.record(self._exited(w.proc, status))

    def _still_watched(self, w: Watched) -> bool:
        with self._lock:
            return self._watched.get((w.proc.host, w.proc.name)) is w

    def wait(self, timeout_s: float, holds: Callable[[], bool] = lambda: False) -> None:
        """Poll every watched agent until each that ends by itself has ended, and nothing
        `holds` the condition (an injected fault under way); AgentError past `timeout_s`
        real seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            with self._lock:
                pending = [w.proc for w in self._watched.values() if w.ends_itself and not w.ended]
            if not pending and not holds():
                return
            if time.monotonic() > deadline:
                names = ", ".join(f"{p.host}/{p.name}" for p in pending) or "an injected fault"
                raise AgentError(f"agents still running after {timeout_s:.0f} s: {names}")
            time.sleep(POLL_S)

    def _fault(self, proc: RemoteProcess, t: float, what: str, **fields: object) -> FaultRecord:
        return fault_record(self.condition, proc.host, proc.name, what, t,
                            self.condition_s(t), **fields)  # fmt: skip

    def _exited(self, proc: RemoteProcess, status: int | None) -> FaultRecord:
        t = self._exit_time(proc)
        what, sig = exit_reason(status)
        tail = self.hosts.log_tail(proc, LOG_LINES) if not self.hosts.dry_run else ""
        return self._fault(proc, t, what, exit_status=status, signal=sig, log_tail=tail)

    def _lost(self, proc: RemoteProcess, exc: Exception) -> FaultRecord:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return self._fault(proc, time.time(), f"lost: its host stopped answering ({first})")

    def _exit_time(self, proc: RemoteProcess) -> float:
        """When the agent ended, on the controller's clock: its exit-status file's time on
        its host, where there is one; else now."""
        res = self.hosts.run(
            proc.host, f"stat -c %.6Y {remote_path(proc.rc_file)} 2>/dev/null", check=False
        )
        try:
            t_host = float(res.stdout.strip())
        except ValueError:
            return time.time()
        return float(self.clocks.get(proc.host, CONTROLLER).to_controller(t_host))


def fault_record(
    condition: str, host: str, agent: str, what: str, t: float, at: float, **fields: object
) -> FaultRecord:
    """A detected fault: `what` befell `agent` on `host` at controller time `t`, `at`
    emulated seconds into the condition."""
    reason = f"{agent} on {host} {what} at {at:.1f} s"
    return FaultRecord(condition, host, agent, reason, t, at, **fields)  # type: ignore[arg-type]


def agents_ended(exc: BaseException) -> list[AgentEnded]:
    """The agents whose end `exc` reports: itself, the exceptions it was raised from, and
    each host's failure of a fanned-out step (a link probe on several devices)."""
    found: list[AgentEnded] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, AgentEnded):
            found.append(e)
        todo += [e.__cause__, e.__context__]
        todo += list(getattr(getattr(e, "result", None), "failed", {}).values())
    return found


def ended_fault(
    condition: str, ended: AgentEnded, started: float, dilation: float = 1.0
) -> FaultRecord:
    """The fault of an agent that ended by itself before the runner asked (seen now:
    `started`, the condition's start on the controller's clock)."""
    t = time.time()
    what, sig = exit_reason(ended.exit_status)
    return fault_record(condition, ended.host, ended.agent, what, t, (t - started) / dilation,
                        exit_status=ended.exit_status, signal=sig,
                        log_tail=ended.log_tail)  # fmt: skip


def unasked(faults: Iterable[FaultRecord]) -> list[FaultRecord]:
    """The faults nobody asked for: those that make a condition `faulted`."""
    return [f for f in faults if not f.injected]


def fault_fields(faults: list[FaultRecord]) -> dict[str, object]:
    """The journal's fields for a condition's faults: `faults` (each as a dict) and, where any
    was not asked for, `reason` naming them."""
    out: dict[str, object] = {"faults": [dataclasses.asdict(f) for f in faults]}
    bad = unasked(faults)
    if bad:
        out["reason"] = "; ".join(f.reason for f in bad)
    return out
