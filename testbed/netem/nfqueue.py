"""Userspace impairment for kernels without sch_netem: NFQUEUE holder in the bridge namespace.

With br_netfilter on in the bridge namespace, bridged IPv4 packets cross iptables. For each
impaired device, in the mangle table:
- chain TB-UP (jumped to from PREROUTING): packets entering from the device's port towards the
  server are dropped with probability loss_up (`-m statistic`, or a plain DROP at 100 %), then
  queued to the holder, which releases them rtt/2 later;
- chain TB-DOWN (from POSTROUTING): packets from the server leaving by the device's port, alike.
Only device <-> server packets match (the server's address is in every rule), so the
controller's SSH to every host is never impaired. Holding happens at a forwarding point, never
on a sender's OUTPUT chain (that collapses TCP). One holder process serves every queue.
"""

from __future__ import annotations

import contextlib
import select
import subprocess
from dataclasses import dataclass

from testbed.errors import ImpairmentError, PrivilegeError
from testbed.lab import naming
from testbed.lab.discover import kill_pids, pid_alive, tagged_processes
from testbed.lab.emulated import EmulatedLab
from testbed.lab.spec import LabHost
from testbed.lab.system import SystemRunner
from testbed.netem import shaper
from testbed.netem.holder_build import Holder, find_holder
from testbed.netem.profile import LinkProfile
from testbed.netem.shaper import indexed_devices

CHAIN_UP, CHAIN_DOWN = "TB-UP", "TB-DOWN"
QUEUE_BASE = 100
HOLDER_READY_TIMEOUT_S = 10.0
HOLDER_RT_PRIO = 20  # SCHED_FIFO: releases on time even when agents load every CPU
_children: dict[int, subprocess.Popen[bytes]] = {}  # holders this process started (to reap)


def holder_tag(lab: str) -> str:
    """`--tag` of a lab's holder process (found by `clean` and by the next apply)."""
    return f"{naming.netns_prefix(lab)}holder"


def queue_numbers(index: int) -> tuple[int, int]:
    """(up, down) NFQUEUE numbers of device `index` (1-based); queues are per namespace."""
    return QUEUE_BASE + 2 * index, QUEUE_BASE + 2 * index + 1


def delay_us(profile: LinkProfile) -> int:
    return round(profile.one_way_ms * 1000)


@dataclass(frozen=True)
class Rule:
    """One expected rule, kept structured so it can be both written and verified."""

    chain: str
    device: str
    port: str
    src: str
    dst: str
    loss: float | None = None  # DROP rule with this probability (1.0: plain DROP)
    queue: int | None = None  # NFQUEUE rule to this queue

    def args(self) -> list[str]:
        physdev = "--physdev-in" if self.chain == CHAIN_UP else "--physdev-out"
        out = ["-A", self.chain, "-s", f"{self.src}/32", "-d", f"{self.dst}/32"]
        out += ["-m", "physdev", physdev, self.port]
        if self.loss is not None:
            if self.loss < 1:
                out += ["-m", "statistic", "--mode", "random", "--probability", f"{self.loss:.10f}"]
            out += ["-j", "DROP"]
        else:
            out += ["-j", "NFQUEUE", "--queue-num", str(self.queue)]
        return out


def plan_rules(
    server: LabHost, devices: list[tuple[int, LabHost]], profiles: dict[str, LinkProfile]
) -> list[Rule]:
    """Rules for every impaired device: loss first, then the hold."""
    rules = []
    for index, dev in devices:
        prof = profiles.get(dev.name)
        if prof is None:
            continue
        q_up, q_down = queue_numbers(index)
        for chain, src, dst, loss, queue in (
            (CHAIN_UP, dev.ip, server.ip, prof.up_loss, q_up),
            (CHAIN_DOWN, server.ip, dev.ip, prof.down_loss, q_down),
        ):
            base = dict(chain=chain, device=dev.name, port=dev.port, src=src, dst=dst)
            if loss > 0:
                rules.append(Rule(**base, loss=loss))
            if prof.rtt_ms > 0 and loss < 1:
                rules.append(Rule(**base, queue=queue))
    return rules


def restore_text(rules: list[Rule]) -> str:
    """iptables-restore input (with --noflush) that empties our chains and fills them."""
    lines = ["*mangle", f":{CHAIN_UP} - [0:0]", f":{CHAIN_DOWN} - [0:0]"]
    lines += [" ".join(r.args()) for r in rules]
    lines += ["COMMIT", ""]
    return "\n".join(lines)


class NfqueueBackend:
    """The userspace backend; `holder` picks the C or Python holder ('auto' prefers C)."""

    name = "nfqueue"

    def __init__(self, runner: SystemRunner, holder: str = "auto") -> None:
        self.runner = runner
        self.holder_pref = holder

    # --- apply / clear ---------------------------------------------------------------------

    def apply(self, lab: EmulatedLab, profiles: dict[str, LinkProfile]) -> dict[str, object]:
        """Replace the whole impairment of `lab` by `profiles`; returns backend state to keep."""
        r, sw = self.runner, lab.bridge_netns
        devices = indexed_devices(lab, profiles)
        self._enable_br_netfilter(sw)
        self._ensure_chains(sw)
        self._flush(sw)
        self._stop_holder(lab)
        rules = plan_rules(lab.server, devices, profiles)
        queues = {rule.queue: profiles[rule.device] for rule in rules if rule.queue is not None}
        state: dict[str, object] = {"holder_pid": None, "holder": None, "shaped_ports": []}
        if queues:
            holder = (
                Holder("c", ("tb-holder",))  # dry-run: nothing is compiled or started
                if r.dry_run
                else find_holder(self.holder_pref)  # type: ignore[arg-type]
            )
            state["holder"] = holder.kind
            state["holder_pid"] = self._start_holder(lab, holder, queues)
        cmds, ports = shaper.htb_commands(lab.server, devices, profiles)
        state["shaped_ports"] = ports
        shaper.reset(r, sw)
        for argv in cmds:
            r.run(argv, netns=sw, error=ImpairmentError)
        r.run(
            ["iptables-restore", "--wait=5", "--noflush"],
            netns=sw,
            input=restore_text(rules),
            error=ImpairmentError,
        )
        return state

    def clear(self, lab: EmulatedLab, state: dict[str, object]) -> None:
        """Remove every rule, shaper and holder of `lab`."""
        sw = lab.bridge_netns
        self._flush(sw)
        shaper.reset(self.runner, sw, list(state.get("shaped_ports") or []))
        self._stop_holder(lab)

    # --- verification ----------------------------------------------------------------------

    def verify(
        self, lab: EmulatedLab, profiles: dict[str, LinkProfile], state: dict[str, object]
    ) -> None:
        """Raise ImpairmentError unless the rules, queues and holder are all in place."""
        if self.runner.dry_run:
            return
        sw, problems = lab.bridge_netns, []
        rules = plan_rules(lab.server, indexed_devices(lab, profiles), profiles)
        saved = self._saved_rules(sw)
        for rule in rules:
            if not any(_matches(rule, line) for line in saved):
                problems.append(f"missing rule: {' '.join(rule.args())}")
        extra = len(saved) - len(rules)
        if extra:
            problems.append(f"{extra} unexpected rule(s) in {CHAIN_UP}/{CHAIN_DOWN}")
        if rules and not self._jumps_present(sw):
            problems.append(f"PREROUTING/POSTROUTING do not jump to {CHAIN_UP}/{CHAIN_DOWN}")
        queues = {r.queue for r in rules if r.queue is not None}
        if queues:
            pid = state.get("holder_pid")
            if not isinstance(pid, int) or not pid_alive(pid):
                problems.append(f"packet holder (pid {pid}) is not running")
            bound = self._bound_queues(sw)
            missing = sorted(queues - bound)
            if missing:
                problems.append(f"no holder bound to queue(s) {missing}")
        devices = indexed_devices(lab, profiles)
        for flow in shaper.missing_classes(self.runner, sw, lab.server, devices, profiles):
            problems.append(f"rate limit missing: {flow}")
        if rules and self._sysctl(sw, "net.bridge.bridge-nf-call-iptables") != "1":
            problems.append("bridged packets do not cross iptables (bridge-nf-call-iptables != 1)")
        if problems:
            raise ImpairmentError(
                f"impairment of lab {lab.name} not in place: " + "; ".join(problems)
            )

    def verify_clear(self, lab: EmulatedLab) -> None:
        if self.runner.dry_run:
            return
        saved = self._saved_rules(lab.bridge_netns)
        if saved:
            raise ImpairmentError(f"rules left after clear in {lab.bridge_netns}: {saved}")
        shaped = shaper.shaped_ports(self.runner, lab.bridge_netns)
        if shaped:
            raise ImpairmentError(f"rate limits left after clear on {shaped}")

    # --- helpers ---------------------------------------------------------------------------

    def _sysctl(self, netns: str, key: str) -> str | None:
        res = self.runner.run(["sysctl", "-n", key], netns=netns, query=True, check=False)
        return res.stdout.strip() if res.ok else None

    def _enable_br_netfilter(self, netns: str) -> None:
        key = "net.bridge.bridge-nf-call-iptables"
        if not self.runner.dry_run and self._sysctl(netns, key) is None:
            self.runner.run(["modprobe", "br_netfilter"], check=False, error=ImpairmentError)
            if self._sysctl(netns, key) is None:
                raise PrivilegeError(
                    "the kernel has no br_netfilter (needed to filter bridged packets); "
                    "load it with `modprobe br_netfilter`"
                )
        self.runner.run(["sysctl", "-qw", f"{key}=1"], netns=netns, error=ImpairmentError)

    def _ensure_chains(self, netns: str) -> None:
        r = self.runner
        for chain, hook in ((CHAIN_UP, "PREROUTING"), (CHAIN_DOWN, "POSTROUTING")):
            probe = ["iptables", "-w", "5", "-t", "mangle", "-C", hook, "-j", chain]
            if r.dry_run or not r.run(probe, netns=netns, query=True, check=False).ok:
                r.run(["iptables", "-w", "5", "-t", "mangle", "-N", chain], netns=netns,
                      check=False, error=ImpairmentError)  # fmt: skip
                r.run(["iptables", "-w", "5", "-t", "mangle", "-A", hook, "-j", chain],
                      netns=netns, error=ImpairmentError)  # fmt: skip

    def _flush(self, netns: str) -> None:
        for chain in (CHAIN_UP, CHAIN_DOWN):
            self.runner.run(
                ["iptables", "-w", "5", "-t", "mangle", "-F", chain],
                netns=netns,
                check=False,
                error=ImpairmentError,
            )

    def _saved_rules(self, netns: str) -> list[str]:
        out = self.runner.run(
            ["iptables-save", "-t", "mangle"], netns=netns, query=True, check=False
        ).stdout
        return [
            line
            for line in out.splitlines()
            if line.startswith((f"-A {CHAIN_UP} ", f"-A {CHAIN_DOWN} "))
        ]

    def _jumps_present(self, netns: str) -> bool:
        out = self.runner.run(
            ["iptables-save", "-t", "mangle"], netns=netns, query=True, check=False
        ).stdout
        return f"-A PREROUTING -j {CHAIN_UP}" in out and f"-A POSTROUTING -j {CHAIN_DOWN}" in out

    def _bound_queues(self, netns: str) -> set[int]:
        res = self.runner.run(
            ["cat", "/proc/net/netfilter/nfnetlink_queue"], netns=netns, query=True, check=False
        )
        bound = set()
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit() and parts[1] != "0":
                bound.add(int(parts[0]))
        return bound

    def _start_holder(
        self, lab: EmulatedLab, holder: Holder, queues: dict[int, LinkProfile]
    ) -> int | None:
        specs = [
            f"{q}:{delay_us(p)}:{round(p.jitter_ms * 1000)}" for q, p in sorted(queues.items())
        ]
        seeds = [p.seed for p in queues.values() if p.seed is not None]
        argv = [*holder.argv, "--tag", holder_tag(lab.name), "--rt-prio", str(HOLDER_RT_PRIO)]
        if seeds:
            argv += ["--seed", str(seeds[0])]
        log = lab.runtime_dir / "holder.log"
        proc = self.runner.spawn(
            argv + specs, netns=lab.bridge_netns, stdout=subprocess.PIPE, stderr_path=log
        )
        if proc is None:  # dry-run
            return None
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HOLDER_READY_TIMEOUT_S)
        line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        proc.stdout.close()
        if line != "ready":
            proc.kill()
            proc.wait()
            tail = log.read_text()[-500:] if log.exists() else ""
            raise ImpairmentError(
                f"{holder.kind} packet holder did not start in {lab.bridge_netns}: {tail.strip()}"
            )
        _children[proc.pid] = proc
        (lab.runtime_dir / "holder.pid").write_text(str(proc.pid))
        return proc.pid

    def _stop_holder(self, lab: EmulatedLab) -> None:
        """Stop the lab's holder: the one in the pid file and any other tagged as the lab's."""
        if self.runner.dry_run:
            return
        pid_file = lab.runtime_dir / "holder.pid"
        pids = {pid for pid, _ in tagged_processes(holder_tag(lab.name))}
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(pid_file.read_text()))
        kill_pids(self.runner, sorted(p for p in pids if pid_alive(p)), grace=2.0)
        for pid in pids:
            if pid in _children:
                _children.pop(pid).wait(timeout=5)
        pid_file.unlink(missing_ok=True)


def _matches(rule: Rule, line: str) -> bool:
    """Does an iptables-save line implement `rule`? (save normalises number formats)"""
    words = line.split()

    def after(flag: str) -> str | None:
        return words[words.index(flag) + 1] if flag in words[:-1] else None

    physdev = "--physdev-in" if rule.chain == CHAIN_UP else "--physdev-out"
    if words[1] != rule.chain or after(physdev) != rule.port:
        return False
    if after("-s") != f"{rule.src}/32" or after("-d") != f"{rule.dst}/32":
        return False
    if rule.queue is not None:
        return after("-j") == "NFQUEUE" and after("--queue-num") == str(rule.queue)
    if after("-j") != "DROP":
        return False
    prob = after("--probability")
    if rule.loss is not None and rule.loss >= 1:
        return prob is None
    return prob is not None and abs(float(prob) - (rule.loss or 0)) < 1e-6
