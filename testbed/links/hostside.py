"""Impairment on the hosts themselves: an inventory lab without a middlebox.

Each direction of a device link is impaired on one of its two ends, through that host's own
runner (over SSH; here for `ansible_connection: local`), on the interface the inventory names
for the link (`link_iface`):
- `netem` (kernels with sch_netem, such as Pi OS and Ubuntu): on the sender's egress, one HTB
  class per peer with a netem leaf, as on a middlebox port. Up is impaired on the device (its
  class to the server), down on the server (one class per device).
- `nfqueue` (kernels without it): on the receiver's ingress, never on the sender's OUTPUT
  chain (that collapses TCP). A mangle PREROUTING chain queues the peer's packets to a packet
  holder on that host. Up is held on the server (one queue per device), down on each device.
  Rate limits stay HTB classes on the sender's egress.
A lab with a backup path has its backup links impaired the same way, on each end's
`backup_iface`, with their own classes and queues. Only device <-> server packets are
classified (both addresses in every match), so the controller's SSH is never impaired. Each
host keeps its holder's config, pid, log and profile changes in `<workdir>/impair/`
(testbed.links.holder_process), so the same code drives a Pi over SSH and a namespace host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, Protocol, TypeVar, cast

from testbed.core.errors import ImpairmentError
from testbed.core.fanout import fan_out, raise_failures
from testbed.labs.backup import load_plan, path_site
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner
from testbed.links.detect import BackendName, netem_available
from testbed.links.holder_process import HolderProcess
from testbed.links.nfqueue import (
    bound_queues,
    chains_text,
    ensure_jumps,
    holder_config,
    holder_tag,
    needs_holder,
    queue_numbers,
    saved_rules,
)
from testbed.links.paths import impaired_paths
from testbed.links.shaper import ShapedFlow, flow_commands, indexed_devices, shaped_ports
from testbed.links.tcnetem import netem_args, netem_count
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import PathKind

HOLD_CHAIN = "TB-HOLD"
IMPAIR_DIR = "impair"
PARALLEL_HOSTS = 8
_T, _R = TypeVar("_T"), TypeVar("_R")
NETEM_PROBE = (
    "test -d /sys/module/sch_netem || modprobe -q sch_netem "
    "|| grep -qs sch_netem /lib/modules/$(uname -r)/modules.builtin"
)


class HostSite(LinkSite, Protocol):
    """A lab whose links are impaired on its hosts: a runner per host and the holder there."""

    def host_runner(self, name: str) -> SystemRunner:
        """Runs commands on host `name`."""
        ...

    def holder_binary(self, name: str) -> str | None:
        """The packet holder's path on host `name` (None: this machine's build)."""
        ...


def host_site(lab: LinkSite) -> HostSite:
    """`lab` as a lab impaired on its hosts; ImpairmentError if it has a forwarding point."""
    if not lab.impaired_on_hosts:
        raise ImpairmentError(f"lab {lab.name} impairs its links at a forwarding point")
    return cast(HostSite, lab)


def hosts_have_netem(lab: LinkSite) -> bool:
    """Whether every host's kernel has sch_netem (loaded, loadable or built in); a dry run
    guesses from this machine's modules, as it touches no host."""
    site = host_site(lab)
    if site.runner.dry_run:
        return netem_available(site.runner)
    return all(
        site.host_runner(h.name).run(["sh", "-c", NETEM_PROBE], query=True, check=False).ok
        for h in site.hosts
    )


CLASS_BASE: dict[PathKind, int] = {"primary": 0x100, "backup": 0x200}


@dataclass(frozen=True)
class Hop:
    """One direction of a device link on one path: its sender and receiver (their ends on
    that path), its profile and its holder queue."""

    device: str
    index: int  # the device's 1-based index in the lab
    path: PathKind
    direction: Literal["up", "down"]
    sender: LabHost
    receiver: LabHost
    profile: LinkProfile

    @property
    def queue(self) -> int:
        up, down = queue_numbers(self.index, self.path)
        return up if self.direction == "up" else down

    @property
    def flow(self) -> ShapedFlow:
        """Its HTB class on the sender's egress."""
        match = ("match", "ip", "src", f"{self.sender.ip}/32")
        match += ("match", "ip", "dst", f"{self.receiver.ip}/32")
        classid = f"1:{CLASS_BASE[self.path] + self.index:x}"
        return ShapedFlow(self.device, self.direction, self.sender.port, classid, match)

    def rule(self) -> list[str]:
        """Its queue rule on the receiver's ingress (iptables-restore words)."""
        src, dst = f"{self.sender.ip}/32", f"{self.receiver.ip}/32"
        return ["-A", HOLD_CHAIN, "-s", src, "-d", dst, "-i", self.receiver.port,
                "-j", "NFQUEUE", "--queue-num", str(self.queue)]  # fmt: skip


def plan_hops(
    lab: LinkSite, profiles: dict[str, LinkProfile], backup: dict[str, LinkProfile] | None = None
) -> list[Hop]:
    """Both directions of every device link that has a profile, on the primary path
    (`profiles`) and on the backup path (`backup`)."""
    hops = []
    for p in impaired_paths(lab, profiles, backup):
        server = p.site.server
        for index, dev in p.devices:
            prof = p.profiles.get(dev.name)
            if prof is not None:
                hops.append(Hop(dev.name, index, p.path, "up", dev, server, prof))
                hops.append(Hop(dev.name, index, p.path, "down", server, dev, prof))
    return hops


@dataclass(frozen=True)
class HostPart:
    """What one host does for the impairment: its egress classes and its ingress holding."""

    host: LabHost
    ports: list[str]  # its interfaces on both paths (cleared before a new apply)
    egress: list[Hop]  # with an HTB class here (netem leaf, or a rate)
    ingress: list[Hop]  # held here (nfqueue only)


def host_parts(
    lab: LinkSite,
    profiles: dict[str, LinkProfile],
    backend: BackendName,
    backup: dict[str, LinkProfile] | None = None,
) -> list[HostPart]:
    """Every host's part (a host with no link to impair has empty lists)."""
    hops = plan_hops(lab, profiles, backup)
    backup_ports = (
        {h.name: h.port for h in path_site(lab, "backup").hosts} if load_plan(lab) else {}
    )
    parts = []
    for host in lab.hosts:
        egress = [
            h
            for h in hops
            if h.sender.name == host.name
            and (backend == "netem" or h.profile.rate_mbit is not None)
        ]
        ingress = [
            h
            for h in hops
            if backend == "nfqueue" and h.receiver.name == host.name and needs_holder(h.profile)
        ]
        ports = list(dict.fromkeys([host.port, *filter(None, [backup_ports.get(host.name)])]))
        parts.append(HostPart(host, ports, egress, ingress))
    return parts


def egress_commands(hops: list[Hop], leaf: Any) -> list[list[str]]:
    """tc commands for the HTB classes (and leaves) of `hops`, each with its own profile."""
    cmds, _ = flow_commands([(h.flow, h.profile) for h in hops], leaf)
    return cmds


def host_holder(site: HostSite, host: LabHost) -> HolderProcess:
    """The packet holder of `host`, in `<workdir>/impair/` there; it stamps the release time
    into probe datagrams, which it holds after the kernel stamped their arrival
    (testbed.links.probe.held_after_kernel_stamp)."""
    return HolderProcess(
        site.host_runner(host.name),
        site.holder_binary(host.name),
        f"{holder_tag(site.name)}-{host.name}",
        str(PurePosixPath(str(host.workdir)) / IMPAIR_DIR),
        flags=("--stamp-probes",),
    )


class HostSideBackend:
    """Either backend (`netem` or `nfqueue`) applied on the hosts of a `HostSite`."""

    def __init__(self, name: BackendName, runner: SystemRunner) -> None:
        self.name = name
        self.runner = runner

    def _leaf(self) -> Any:
        return netem_args if self.name == "netem" else None

    def apply(
        self,
        site: LinkSite,
        profiles: dict[str, LinkProfile],
        backup: dict[str, LinkProfile] | None = None,
    ) -> dict[str, Any]:
        """Replace the impairment on every host by `profiles` (primary links) and `backup`
        (backup links); returns backend state."""
        lab = host_site(site)
        every = indexed_devices(lab, profiles)

        def apply_host(part: HostPart) -> int | None:
            runner = lab.host_runner(part.host.name)
            self._reset_egress(runner, part.ports)
            for argv in egress_commands(part.egress, self._leaf()):
                runner.run(argv, error=ImpairmentError)
            return self._hold(lab, part, every) if self.name == "nfqueue" else None

        parts = host_parts(lab, profiles, self.name, backup)
        pids = self._each(apply_host, parts)
        holders = {part.host.name: pid for part, pid in zip(parts, pids, strict=True)}
        return {"at": "hosts", "holder": "c" if any(pids) else None, "holders": holders}

    def _each(self, work: Callable[[_T], _R], items: list[_T]) -> list[_R]:
        """`work` on every host's item, hosts in parallel (in order in a dry run, so that its
        commands print host by host); the first error is raised after all have finished."""
        done = fan_out(work, items, key=lambda item: item.host.name,  # type: ignore[attr-defined]
                       max_workers=PARALLEL_HOSTS, sequential=self.runner.dry_run)  # fmt: skip
        return list(raise_failures("impairing the hosts' links", done).values())

    def _hold(self, lab: HostSite, part: HostPart, every: list[tuple[int, LabHost]]) -> int | None:
        """Ingress rules and the holder of one host (`every`: the lab's indexed devices)."""
        runner, holder = lab.host_runner(part.host.name), host_holder(lab, part.host)
        ensure_jumps(runner, [(HOLD_CHAIN, "PREROUTING")])
        rules = ["iptables-restore", "--wait=5", "--noflush"]
        if not part.ingress:  # rules go before the holder: a queue without one drops
            runner.run(rules, input=chains_text([HOLD_CHAIN], []), error=ImpairmentError)
            holder.stop()
            return None
        held = {path: {h.device: h.profile for h in part.ingress if h.path == path}
                for path in CLASS_BASE}  # fmt: skip
        config = holder_config(holder.generation() + 1, every, held["primary"], held["backup"],
                           only={h.queue for h in part.ingress})  # fmt: skip
        pid = holder.load(config)  # the holder binds its queues before the rules fill them
        runner.run(
            rules,
            input=chains_text([HOLD_CHAIN], [h.rule() for h in part.ingress]),
            error=ImpairmentError,
        )
        return pid

    def _reset_egress(self, runner: SystemRunner, ports: list[str]) -> None:
        """Remove our HTB roots from a host's link interfaces (not anyone else's qdisc)."""
        for port in ports:
            if runner.dry_run or port in shaped_ports(runner, None):
                runner.run(["tc", "qdisc", "del", "dev", port, "root"], check=False,
                           error=ImpairmentError)  # fmt: skip

    def clear(self, site: LinkSite, state: dict[str, Any]) -> None:
        """Remove every class, rule and holder on every host."""
        lab = host_site(site)

        def clear_host(part: HostPart) -> None:
            runner = lab.host_runner(part.host.name)
            self._reset_egress(runner, part.ports)
            runner.run(["iptables", "-w", "5", "-t", "mangle", "-F", HOLD_CHAIN], check=False,
                       error=ImpairmentError)  # fmt: skip
            host_holder(lab, part.host).stop()

        self._each(clear_host, host_parts(lab, {}, self.name))

    def verify(
        self,
        site: LinkSite,
        profiles: dict[str, LinkProfile],
        state: dict[str, Any],
        backup: dict[str, LinkProfile] | None = None,
    ) -> None:
        """Raise ImpairmentError unless every host's classes, leaves, rules and holder are in
        place (both paths)."""
        if self.runner.dry_run:
            return
        lab = host_site(site)
        parts = host_parts(lab, profiles, self.name, backup)
        found = self._each(lambda part: self._host_problems(lab, part), parts)
        problems = [
            f"{part.host.name}: {p}" for part, ps in zip(parts, found, strict=True) for p in ps
        ]
        if problems:
            raise ImpairmentError(
                f"impairment on the hosts of lab {lab.name} not in place: " + "; ".join(problems)
            )

    def _host_problems(self, lab: HostSite, part: HostPart) -> list[str]:
        runner, problems = lab.host_runner(part.host.name), []
        for hop in part.egress:
            flow = hop.flow
            out = runner.run(["tc", "class", "show", "dev", flow.port, "classid", flow.classid],
                             query=True, check=False).stdout  # fmt: skip
            if "htb" not in out:
                problems.append(f"class {flow.classid} on {flow.port} ({hop.device} {hop.path} "
                                f"{hop.direction}) missing")  # fmt: skip
        if self.name == "netem":
            for port in part.ports:
                want = sum(h.flow.port == port for h in part.egress)
                got = netem_count(runner, port)
                if got != want:
                    problems.append(f"{port}: {got} netem qdisc(s), expected {want}")
            return problems
        saved = [line.split() for line in saved_rules(runner, [HOLD_CHAIN])]
        for hop in part.ingress:
            if hop.rule() not in saved:
                problems.append(f"missing rule: {' '.join(hop.rule())}")
        if len(saved) != len(part.ingress):
            problems.append(f"{len(saved)} rule(s) in {HOLD_CHAIN}, expected {len(part.ingress)}")
        if part.ingress:
            if host_holder(lab, part.host).pid() is None:
                problems.append("packet holder is not running")
            missing = sorted({h.queue for h in part.ingress} - bound_queues(runner))
            if missing:
                problems.append(f"no holder bound to queue(s) {missing}")
        return problems

    def verify_clear(self, site: LinkSite) -> None:
        if self.runner.dry_run:
            return
        lab = host_site(site)

        def left_on(part: HostPart) -> list[str]:
            runner, left = lab.host_runner(part.host.name), []
            for port in part.ports:
                if port in shaped_ports(runner, None) or netem_count(runner, port):
                    left.append(f"{part.host.name}: qdisc on {port}")
            if saved_rules(runner, [HOLD_CHAIN]):
                left.append(f"{part.host.name}: rules in {HOLD_CHAIN}")
            if host_holder(lab, part.host).pid() is not None:
                left.append(f"{part.host.name}: packet holder still running")
            return left

        left = [x for found in self._each(left_on, host_parts(lab, {}, self.name)) for x in found]
        if left:
            raise ImpairmentError(f"left after clear: {', '.join(left)}")


def link_changes(site: LinkSite) -> list[dict[str, Any]]:
    """Every profile change the holders on the hosts applied, in stamp order, each with the
    `host` whose holder applied it (`at` is on that host's clock)."""
    lab = host_site(site)
    changes = [
        {**c, "host": host.name}
        for host in lab.hosts
        for c in host_holder(lab, host).link_changes()
    ]
    return sorted(changes, key=lambda c: float(c.get("at", 0.0)))
