"""Userspace impairment for kernels without sch_netem: NFQUEUE holder in the bridge namespace.

With br_netfilter on in the bridge namespace, bridged IPv4 packets cross iptables. For each
impaired device link (primary, and backup where the lab has a backup path: its own ports and
queues in the same rule set), in the mangle table, both chains jumped to from PREROUTING:
- chain TB-UP: packets entering from the device's port towards the server are queued to the
  holder (one queue per direction of each link);
- chain TB-DOWN: packets entering from the server's port towards the device, alike.
Both directions are queued where they enter the bridge: the holder holds each packet from its
kernel arrival timestamp, and the bridge clears that stamp when it forwards, so a packet queued
later (at POSTROUTING) could only be held from when the holder read it.
The holder (holder.c) does loss (random or Gilbert-Elliott, seeded), delay, jitter and the
profile's schedule, so one path serves every profile; rate limits are HTB classes (`shaper`).
Only device <-> server packets match (the server's address is in every rule), so the
controller's SSH to every host is never impaired. Holding happens at a forwarding point, never
on a sender's OUTPUT chain (that collapses TCP). One holder process serves every queue; a new
apply rewrites its config file and signals it (SIGHUP), so profiles change while agents run
without dropping held packets, and each change lands time-stamped in `link-changes.jsonl`.
The holder is run through the lab's runner (`holder_process`), here or on a middlebox.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.core.errors import ImpairmentError, PrivilegeError
from testbed.labs import naming
from testbed.labs.discover import kill_pids, pid_alive, tagged_processes
from testbed.labs.interface import LinkSite
from testbed.labs.setup import MAX_DEVICES, LabHost
from testbed.labs.system import SystemRunner
from testbed.links import shaper
from testbed.links.holder_process import HeldUp, HolderProcess, ReleaseCounts
from testbed.links.paths import PathLinks, htb_plan, impaired_paths
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import timeline
from testbed.topo.topology import PathKind

CHAIN_UP, CHAIN_DOWN = "TB-UP", "TB-DOWN"
JUMPS = ((CHAIN_UP, "PREROUTING"), (CHAIN_DOWN, "PREROUTING"))  # (chain, the hook jumping to it)
QUEUE_BASE = 100
BACKUP_QUEUE_BASE = QUEUE_BASE + 2 * (MAX_DEVICES + 1)  # above every primary queue


def holder_tag(lab: str) -> str:
    """`--tag` of a lab's holder process (found by `clean` and by the next apply)."""
    return f"{naming.netns_prefix(lab)}holder"


def queue_numbers(index: int, path: PathKind = "primary") -> tuple[int, int]:
    """(up, down) NFQUEUE numbers of device `index` (1-based) on `path`; queues are per
    namespace."""
    base = QUEUE_BASE if path == "primary" else BACKUP_QUEUE_BASE
    return base + 2 * index, base + 2 * index + 1


def link_label(device: str, path: PathKind = "primary") -> str:
    """How the holder names a link (in `link-changes.jsonl`): `dev1`, `dev1/backup`."""
    return device if path == "primary" else f"{device}/{path}"


def delay_us(profile: LinkProfile) -> int:
    return round(profile.one_way_ms * 1000)


def holder_config(
    generation: int,
    devices: list[tuple[int, LabHost]],
    profiles: dict[str, LinkProfile],
    backup: dict[str, LinkProfile] | None = None,
    only: set[int] | None = None,
) -> str:
    """The holder's config file (format in holder.c): each queue and the phases it steps through;
    `profiles` are the devices' primary links, `backup` their backup links; `only`: just
    these queues (a holder on a host holds one direction of its links)."""
    lines = [f"generation {generation}"]
    for path, path_profiles in (("primary", profiles), ("backup", backup or {})):
        lines += _queue_lines(devices, path_profiles, path, only)  # type: ignore[arg-type]
    return "\n".join(lines) + "\n"


def _queue_lines(
    devices: list[tuple[int, LabHost]],
    profiles: dict[str, LinkProfile],
    path: PathKind,
    only: set[int] | None = None,
) -> list[str]:
    lines = []
    for index, dev in devices:
        prof = profiles.get(dev.name)
        if prof is None:
            continue
        phases = timeline(prof)
        seed = 0 if prof.seed is None else prof.seed + 1
        label = link_label(dev.name, path)
        for direction, queue in zip(("up", "down"), queue_numbers(index, path), strict=True):
            if only is not None and queue not in only:
                continue
            lines.append(
                f"queue {queue} {prof.queue_limit} {seed} {label} {direction} {prof.order}"
            )
            for ph in phases:
                ge = ph.profile.gilbert_elliott(direction)  # type: ignore[arg-type]
                lines.append(
                    f"phase {queue} {round(ph.at_s * 1e6)} {delay_us(ph.profile)} "
                    f"{round(ph.profile.jitter_ms * 1000)} {ph.profile.jitter_dist} "
                    f"{ge.p:.12g} {ge.r:.12g} {ge.one_minus_h:.12g} {ge.one_minus_k:.12g}"
                )
    return lines


def site_holder(lab: LinkSite, runner: SystemRunner) -> HolderProcess:
    """The packet holder of `lab`'s forwarding point (its bridge namespace or middlebox), with
    its files in the lab's runtime folder, run from the lab's `holder_path` (a middlebox's
    own build) or this machine's build."""
    return HolderProcess(
        runner, lab.holder_path, holder_tag(lab.name), str(lab.runtime_dir), netns=lab.bridge_netns
    )


def release_counts(lab: LinkSite) -> list[ReleaseCounts]:
    """Per queue of `lab`'s holder: packets released and how late, once it has stopped."""
    return site_holder(lab, lab.runner).release_counts()


def held_up(lab: LinkSite) -> list[HeldUp]:
    """Per generation of `lab`'s holder: the spells in which neither releaser ran."""
    return site_holder(lab, lab.runner).held_up()


def link_changes(lab: LinkSite) -> list[dict[str, object]]:
    """Every profile change the holder applied in `lab` (one dict per link direction and phase,
    `at` in Unix seconds), oldest first; empty when none was logged."""
    return site_holder(lab, lab.runner).link_changes()


@dataclass(frozen=True)
class Rule:
    """One expected rule, kept structured so it can be both written and verified."""

    chain: str
    device: str
    port: str  # the bridge port the packet enters by: the device's (up) or the server's (down)
    src: str
    dst: str
    queue: int  # NFQUEUE rule to this queue
    path: PathKind = "primary"

    def args(self) -> list[str]:
        out = ["-A", self.chain, "-s", f"{self.src}/32", "-d", f"{self.dst}/32"]
        out += ["-m", "physdev", "--physdev-in", self.port]
        return out + ["-j", "NFQUEUE", "--queue-num", str(self.queue)]


def plan_rules(
    server: LabHost,
    devices: list[tuple[int, LabHost]],
    profiles: dict[str, LinkProfile],
    path: PathKind = "primary",
) -> list[Rule]:
    """One queue rule per direction of every device link on `path` the holder must impair
    (`server` and `devices`: their ends on that path)."""
    rules = []
    for index, dev in devices:
        prof = profiles.get(dev.name)
        if prof is None or not needs_holder(prof):
            continue
        q_up, q_down = queue_numbers(index, path)
        rules.append(Rule(CHAIN_UP, dev.name, dev.port, dev.ip, server.ip, q_up, path))
        rules.append(Rule(CHAIN_DOWN, dev.name, server.port, server.ip, dev.ip, q_down, path))
    return rules


def needs_holder(profile: LinkProfile) -> bool:
    """False for a profile that only limits the rate (HTB does that alone)."""
    return not profile.model_copy(update={"rate_mbit": None}).is_null


def restore_text(rules: list[Rule]) -> str:
    """iptables-restore input (with --noflush) that empties our chains and fills them."""
    return chains_text((CHAIN_UP, CHAIN_DOWN), [r.args() for r in rules])


def chains_text(chains: Sequence[str], rules: list[list[str]]) -> str:
    """iptables-restore input (with --noflush) that empties mangle `chains` and appends
    `rules` (each the words of one `-A CHAIN ...`)."""
    lines = ["*mangle", *(f":{c} - [0:0]" for c in chains), *(" ".join(r) for r in rules)]
    return "\n".join([*lines, "COMMIT", ""])


def ensure_jumps(
    runner: SystemRunner, jumps: Sequence[tuple[str, str]], netns: str | None = None
) -> None:
    """Make each (chain, hook) mangle chain and the hook's jump to it, where missing."""
    for chain, hook in jumps:
        probe = ["iptables", "-w", "5", "-t", "mangle", "-C", hook, "-j", chain]
        if runner.dry_run or not runner.run(probe, netns=netns, query=True, check=False).ok:
            runner.run(["iptables", "-w", "5", "-t", "mangle", "-N", chain], netns=netns,
                       check=False, error=ImpairmentError)  # fmt: skip
            runner.run(["iptables", "-w", "5", "-t", "mangle", "-A", hook, "-j", chain],
                       netns=netns, error=ImpairmentError)  # fmt: skip


def saved_rules(runner: SystemRunner, chains: Sequence[str], netns: str | None = None) -> list[str]:
    """The `-A` lines of mangle `chains` as iptables-save prints them now."""
    out = runner.run(["iptables-save", "-t", "mangle"], netns=netns, query=True, check=False)
    return [line for line in out.stdout.splitlines() if line.startswith(
        tuple(f"-A {c} " for c in chains))]  # fmt: skip


def bound_queues(runner: SystemRunner, netns: str | None = None) -> set[int]:
    """NFQUEUE numbers a process is bound to now (in `netns`)."""
    out = runner.run(["cat", "/proc/net/netfilter/nfnetlink_queue"], netns=netns, query=True,
                     check=False).stdout  # fmt: skip
    return {int(p[0]) for p in (line.split() for line in out.splitlines())
            if len(p) >= 2 and p[0].isdigit() and p[1] != "0"}  # fmt: skip


class NfqueueBackend:
    """The userspace backend: iptables NFQUEUE rules in the bridge namespace, one compiled
    packet holder serving every queue."""

    name = "nfqueue"

    def __init__(self, runner: SystemRunner) -> None:
        self.runner = runner

    # --- apply / clear ---------------------------------------------------------------------

    def apply(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        backup: dict[str, LinkProfile] | None = None,
    ) -> dict[str, object]:
        """Replace the whole impairment of `lab` by `profiles` (primary links) and `backup`
        (backup links): one rule set, one holder config; returns backend state to keep."""
        r, sw = self.runner, lab.bridge_netns
        paths = impaired_paths(lab, profiles, backup)
        self._enable_br_netfilter(sw)
        ensure_jumps(self.runner, JUMPS, sw)
        rules = _all_rules(paths)
        queued = {(rule.path, rule.device) for rule in rules}
        state: dict[str, object] = {"holder_pid": None, "holder": None, "shaped_ports": []}
        holder = site_holder(lab, self.runner)
        if queued:
            held = {p.path: {k: v for k, v in p.profiles.items() if (p.path, k) in queued}
                    for p in paths}  # fmt: skip
            generation = holder.generation() + 1
            config = holder_config(
                generation, paths[0].devices, held["primary"], held.get("backup")
            )
            state["holder"] = "c"
            state["holder_generation"] = generation
            state["holder_pid"] = holder.load(config)
            if not r.remote:  # the probe's clock: the holder's only where it runs here too
                state["clocks"] = holder.clocks()
        else:
            self._flush(sw)
            self._stop_holder(lab)
        cmds, ports = htb_plan(paths)
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

    def clear(self, lab: LinkSite, state: dict[str, object]) -> None:
        """Remove every rule, shaper and holder of `lab`."""
        sw = lab.bridge_netns
        self._flush(sw)
        shaper.reset(self.runner, sw, list(state.get("shaped_ports") or []))
        self._stop_holder(lab)

    # --- verification ----------------------------------------------------------------------

    def verify(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        state: dict[str, object],
        backup: dict[str, LinkProfile] | None = None,
    ) -> None:
        """Raise ImpairmentError unless the rules, queues and holder of both paths are all in
        place."""
        if self.runner.dry_run:
            return
        sw, problems = lab.bridge_netns, []
        paths = impaired_paths(lab, profiles, backup)
        rules = _all_rules(paths)
        saved = saved_rules(self.runner, (CHAIN_UP, CHAIN_DOWN), sw)
        for rule in rules:
            if not any(_matches(rule, line) for line in saved):
                problems.append(f"missing rule: {' '.join(rule.args())}")
        extra = len(saved) - len(rules)
        if extra:
            problems.append(f"{extra} unexpected rule(s) in {CHAIN_UP}/{CHAIN_DOWN}")
        if rules and not self._jumps_present(sw):
            problems.append(f"PREROUTING does not jump to {CHAIN_UP} and {CHAIN_DOWN}")
        queues = {r.queue for r in rules}
        if queues:
            pid = state.get("holder_pid")
            if site_holder(lab, self.runner).pid() != pid:
                problems.append(f"packet holder (pid {pid}) is not running")
            bound = bound_queues(self.runner, sw)
            missing = sorted(queues - bound)
            if missing:
                problems.append(f"no holder bound to queue(s) {missing}")
        for p in paths:
            for flow in shaper.missing_classes(
                self.runner, sw, p.site.server, p.devices, p.profiles
            ):
                problems.append(f"rate limit missing ({p.path}): {flow}")
        if rules and self._sysctl(sw, "net.bridge.bridge-nf-call-iptables") != "1":
            problems.append("bridged packets do not cross iptables (bridge-nf-call-iptables != 1)")
        if problems:
            raise ImpairmentError(
                f"impairment of lab {lab.name} not in place: " + "; ".join(problems)
            )

    def verify_clear(self, lab: LinkSite) -> None:
        if self.runner.dry_run:
            return
        saved = saved_rules(self.runner, (CHAIN_UP, CHAIN_DOWN), lab.bridge_netns)
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

    def _flush(self, netns: str) -> None:
        for chain in (CHAIN_UP, CHAIN_DOWN):
            self.runner.run(
                ["iptables", "-w", "5", "-t", "mangle", "-F", chain],
                netns=netns,
                check=False,
                error=ImpairmentError,
            )

    def _jumps_present(self, netns: str) -> bool:
        out = self.runner.run(
            ["iptables-save", "-t", "mangle"], netns=netns, query=True, check=False
        ).stdout
        return all(f"-A {hook} -j {chain}" in out for chain, hook in JUMPS)

    def _stop_holder(self, lab: LinkSite) -> None:
        """Stop the lab's holder, and here any other process tagged as the lab's holder (one
        left by a run that died)."""
        site_holder(lab, self.runner).stop()
        if self.runner.dry_run or self.runner.remote:
            return
        stray = [pid for pid, _ in tagged_processes(holder_tag(lab.name)) if pid_alive(pid)]
        kill_pids(self.runner, stray, grace=2.0)


def _all_rules(paths: list[PathLinks]) -> list[Rule]:
    """The queue rules of every path's links, in one list (one rule set per bridge namespace)."""
    return [
        rule for p in paths for rule in plan_rules(p.site.server, p.devices, p.profiles, p.path)
    ]


def _matches(rule: Rule, line: str) -> bool:
    """Does an iptables-save line implement `rule`?"""
    words = line.split()

    def after(flag: str) -> str | None:
        return words[words.index(flag) + 1] if flag in words[:-1] else None

    if words[1] != rule.chain or after("--physdev-in") != rule.port:
        return False
    if after("-s") != f"{rule.src}/32" or after("-d") != f"{rule.dst}/32":
        return False
    return after("-j") == "NFQUEUE" and after("--queue-num") == str(rule.queue)
