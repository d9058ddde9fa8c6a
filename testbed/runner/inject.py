"""The playbook's `faults`, injected on a thread at their emulated times (testbed.config.faults).

A kill signals the agent's Python process (not its wrapper shell, which then writes the exit
status a crash would leave) and, with `restart_after_s`, starts the same command again as
`<name>-r<n>`: a restarted server is back once it listens again; a restarted device agent
answers the problems it has not finished (none asked twice, the one in flight again). A freeze
stops the process (SIGSTOP) and lets it go on (SIGCONT). A cut drops, on both ends' INPUT
chains, every packet between the host and the server. A KV fill has the server's pool filled
(SIGUSR1: ballast as large as its budget) and emptied again (SIGUSR2). Each injected fault is
recorded in the condition's watch (`AgentWatch`) as asked for, with when its agent or link
was back.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.config.faults import FaultSpec
from testbed.hosts.control import HostControl, RemoteProcess, remote_path
from testbed.hosts.inventory import InventoryHost
from testbed.metrics.schemas import FaultRecord
from testbed.runner.watch import AgentWatch

READY_TIMEOUT_S = 120.0


@dataclass
class Slot:
    """An agent the injector may hit: its process now and how to start it again."""

    host: InventoryHost
    proc: RemoteProcess
    command: str
    env: dict[str, str]
    ends_itself: bool
    records: str  # its records folder on the host
    ready_file: str | None = None  # a server: written once it listens
    earlier: list[RemoteProcess] = field(default_factory=list)  # processes it replaced


class Injector:
    """Runs a condition's faults on a thread; `stop()` ends it (a fault not reached yet is
    recorded as not injected)."""

    def __init__(
        self,
        hosts: HostControl,
        watch: AgentWatch,
        faults: list[FaultSpec],
        slots: dict[str, Slot],
        server: InventoryHost,
        dilation: float,
        on_restart: Callable[[Slot], None],
    ) -> None:
        self.hosts, self.watch, self.faults, self.slots = hosts, watch, faults, slots
        self.server, self.dilation, self.on_restart = server, dilation, on_restart
        self._stop = threading.Event()
        self._busy = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._one, args=(f,), daemon=True)
                         for f in faults]  # fmt: skip

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def busy(self) -> bool:
        """True while a fault is under way (its agent killed but not yet restarted)."""
        with self._lock:
            return self._busy > 0

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _sleep_until(self, t: float) -> bool:
        """Wait until controller time `t`; False if the condition ended first."""
        return not self._stop.wait(max(0.0, t - time.time()))

    def _one(self, spec: FaultSpec) -> None:
        at = self.watch.started + spec.at_s * self.dilation
        devices = [h for h, s in self.slots.items() if s.host.role == "device"]
        targets = spec.targets(devices, self.server.name)
        if not self._sleep_until(at) or (
            spec.action != "cut" and not any(self._running(h) for h in targets)
        ):
            for host in targets:
                self._record(spec, host, time.time(), None, "not injected: the agents had ended")
            return
        with self._lock:
            self._busy += 1
        try:
            workers = [threading.Thread(target=self._hit, args=(spec, h)) for h in targets]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            with self._lock:
                self._busy -= 1

    def _running(self, host: str) -> bool:
        slot = self.slots.get(host)
        return slot is not None and self.hosts.is_alive(slot.proc)

    def _hit(self, spec: FaultSpec, host: str) -> None:
        t0 = time.time()
        try:
            hit = {"kill": self._kill, "freeze": self._freeze, "cut": self._cut,
                   "fill_kv": self._fill_kv}[spec.action]  # fmt: skip
            back = hit(spec, host)
        except Exception as exc:  # the fault could not be injected: said, never fatal
            self._record(spec, host, t0, None, f"could not be injected: {exc}")
            return
        self._record(spec, host, t0, back, "")

    def _signal(self, slot: Slot, name: str) -> None:
        """Send signal `name` to the agent's Python process (its group's process whose command
        starts with a python running `-m agents.`; the wrapper shell is left to see it end)."""
        pattern = "^[^ ]*python[^ ]* -m agents[.]"
        self.hosts.run(slot.host, f"pkill -{name} -g {slot.proc.pid} -f '{pattern}'")

    def _kill(self, spec: FaultSpec, host: str) -> float | None:
        slot = self.slots[host]
        self.watch.release(slot.proc)
        self._signal(slot, spec.signal_name)
        if spec.restart_after_s is None:
            return None
        if not self._sleep_until(time.time() + spec.restart_after_s * self.dilation):
            return None
        self._restart(slot)
        return time.time()

    def _restart(self, slot: Slot) -> None:
        """Start the agent again: a server listens before this returns; a device answers
        what it had not finished."""
        n = len(slot.earlier) + 1
        command = slot.command
        if slot.ready_file:
            self.hosts.run(slot.host, f"rm -f {remote_path(slot.ready_file)}")
        if slot.host.role == "device":
            command = self._remaining(slot, n)
        slot.earlier.append(slot.proc)
        slot.proc = self.hosts.start(slot.host, f"{slot.earlier[0].name}-r{n}", command,
                                     env=slot.env)  # fmt: skip
        self.on_restart(slot)
        self.watch.keep(slot.proc, slot.ends_itself)
        if slot.ready_file:
            deadline = time.monotonic() + READY_TIMEOUT_S
            test = f"test -f {remote_path(slot.ready_file)}"
            while not self.hosts.run(slot.host, test, check=False).ok:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{slot.proc.name} not listening after restart")
                time.sleep(0.1)

    def _remaining(self, slot: Slot, n: int) -> str:
        """The device's problems it has no request record of, as `problems-r<n>.jsonl`, and
        its command reading them."""
        folder = slot.records
        done = set()
        text = self.hosts.run(slot.host, f"cat {remote_path(folder + '/requests.jsonl')}",
                              check=False).stdout  # fmt: skip
        for line in text.splitlines():
            try:
                done.add(str(json.loads(line)["problem"]))
            except (ValueError, KeyError, TypeError):
                continue
        source, again = f"{folder}/problems.jsonl", f"{folder}/problems-r{n}.jsonl"
        keep = ("import json,sys; done=set(json.loads(sys.argv[1])); "
                "[print(l, end='') for l in open(sys.argv[2]) if l.strip() and "
                "str(json.loads(l)['id']) not in done]")  # fmt: skip
        self.hosts.run(slot.host, shlex.join([slot.host.agent_python, "-c", keep,
                                              json.dumps(sorted(done)), source])
                       + f" > {remote_path(again)}")  # fmt: skip
        return slot.command.replace(source, again)  # quoted or not, the path is in it

    def _freeze(self, spec: FaultSpec, host: str) -> float:
        slot = self.slots[host]
        self._signal(slot, "STOP")
        self._stop.wait(spec.lasts_s() * self.dilation)
        self._signal(slot, "CONT")
        return time.time()

    def _fill_kv(self, spec: FaultSpec, host: str) -> float:
        """The server's KV pool full for the fault's duration (emptied even if the condition
        ends first)."""
        slot = self.slots[host]
        self._signal(slot, "USR1")
        try:
            self._stop.wait(spec.lasts_s() * self.dilation)
        finally:
            self._signal(slot, "USR2")
        return time.time()

    def _cut(self, spec: FaultSpec, host: str) -> float:
        """Drop every packet between `host` and the server on both INPUT chains, for the
        fault's duration; the rules are taken out even if the condition ends first."""
        pairs = self._cut_pairs(host)
        tag = f"testbed-cut-{spec.name}"
        try:
            for h, peer in pairs:
                self.hosts.run(h, f"iptables -I INPUT -s {peer} -m comment --comment {tag} "
                                  "-j DROP")  # fmt: skip
            self._stop.wait(spec.lasts_s() * self.dilation)
        finally:
            for h, peer in pairs:
                self.hosts.run(h, f"iptables -D INPUT -s {peer} -m comment --comment {tag} "
                                  "-j DROP", check=False)  # fmt: skip
        return time.time()

    def _cut_pairs(self, host: str) -> list[tuple[InventoryHost, str]]:
        """(host, address whose packets it drops) for a cut of `host` (a device: it and the
        server; the server: it from every device, and every device from it)."""
        server = self.server
        if host == server.name:
            devices = [s.host for s in self.slots.values() if s.host.role == "device"]
            return [(server, d.link_address) for d in devices] + [
                (d, server.link_address) for d in devices
            ]
        dev = self.slots[host].host
        return [(dev, server.link_address), (server, dev.link_address)]

    def _record(self, spec: FaultSpec, host: str, t: float, back: float | None,
                note: str) -> None:  # fmt: skip
        slot = self.slots.get(host)
        agent = slot.earlier[0].name if slot and slot.earlier else (slot.proc.name if slot else "")
        at = self.watch.condition_s(t)
        what = {"kill": f"killed by SIG{spec.signal_name}", "freeze": "frozen", "cut": "cut off",
                "fill_kv": "had its KV pool filled"}  # fmt: skip
        again = "" if back is None else f", back after {(back - t) / self.dilation:.1f} s"
        reason = f"{spec.name}: {agent or 'link'} on {host} {what[spec.action]} at {at:.1f} s"
        reason += again
        self.watch.record(FaultRecord(
            self.watch.condition, host, agent, reason + (f" ({note})" if note else ""), t, at,
            injected=True, action=spec.action, back_t=back,
            signal=f"SIG{spec.signal_name}" if spec.action == "kill" else None,
        ))  # fmt: skip
