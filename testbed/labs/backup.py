"""The backup path: a second link per device to the server, and failover between the two.

    bridge netns tb-<lab>-sw:  br0 ── p-<host> ── eth0 in each host   (primary, lab subnet)
                               br1 ── b-<host> ── eth1 in each host   (backup, its own subnet)

Devices keep addressing the server's primary IP. A link monitor (`agents.failover`, one
process for the whole lab, tagged `tb-<lab>-failover`) probes the server's primary IP from every
device over the primary interface alone and echoes the probes in the server's namespace. When
a device's probes go unanswered past the timeout (at least `min_rto_ms`, more on a slow link),
it adds the route `<server ip>/32 dev eth1` in that device's namespace: the longer prefix wins
over the primary subnet's, so the device's traffic (and the server's replies, sent to the
device's backup address) moves to the backup link. When `up_after` probes in a row are answered
again, the route is deleted and traffic returns to the primary. Each switch is one JSON line in
the failover log (`Failover`, time-stamped) for the run's records.

Backup ports are named `b-<host>`; `backup_site(lab)` is the lab seen through them, the way
backup traffic looks there: from a device's backup address to the server's primary one. The
impairment backends impair both paths in one go (`testbed.links.apply_each(lab, primary,
backup=...)`: one rule set and one holder per bridge namespace); `probe_backup` measures the
backup links over the devices' backup interfaces, whichever path their traffic takes now.
"""

from __future__ import annotations

import ipaddress
import select
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from agents.failover import Failover
from testbed.core.errors import LabError
from testbed.labs import naming
from testbed.labs.discover import TAG_FLAG, tagged_processes
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner
from testbed.topo.topology import PathKind

BACKUP_BRIDGE = "br1"
BACKUP_IFACE = "eth1"
MONITOR_PORT = 9877
PLAN_FILE = "backup-plan.json"
FAILOVER_LOG = "failovers.jsonl"
DILATION_FILE = "monitor-dilation"  # the time dilation the link monitor runs at, per condition


def backup_port(host: str) -> str:
    """A host's backup veth end on the bridge."""
    return f"b-{host}"


def monitor_tag(lab: str) -> str:
    return f"{naming.netns_prefix(lab)}failover"


class PathEnd(BaseModel):
    """One host's two addresses and namespace, as the monitor needs them, and where its backup
    link is."""

    name: str
    netns: str
    primary_ip: str
    backup_ip: str
    iface: str = Field(BACKUP_IFACE, description="the host's own backup interface")
    port: str | None = Field(
        None,
        description="where its backup link is impaired: a middlebox port or (a lab impaired "
        "on its hosts) its own interface; None: the backup bridge's `b-<host>`",
    )

    @property
    def site_port(self) -> str:
        return self.port or backup_port(self.name)


class BackupPlan(BaseModel):
    """The backup network of a lab and how its monitor judges the primary links."""

    lab: str
    subnet: ipaddress.IPv4Network
    server: PathEnd
    devices: list[PathEnd]
    primary_iface: str = naming.HOST_IFACE
    port: int = MONITOR_PORT
    interval_ms: float = Field(20.0, gt=0, description="probe period per device")
    down_after: int = Field(3, ge=1, description="unanswered probes in a row: primary down")
    up_after: int = Field(5, ge=1, description="answered probes in a row: primary back")
    min_rto_ms: float = Field(
        200.0,
        gt=0,
        description="a probe counts as lost after max(this, srtt + 4 rttvar): as long as the "
        "device's own verification timeout, so a profile change that raises the RTT is not "
        "taken for a cut",
    )


def default_backup_subnet(primary: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The subnet right after the lab's (same size)."""
    return ipaddress.IPv4Network(
        (int(primary.network_address) + primary.num_addresses, primary.prefixlen)
    )


def _backup_ends(
    lab: LinkSite, subnet: ipaddress.IPv4Network | None, prefix_len: int
) -> tuple[ipaddress.IPv4Network, dict[str, PathEnd]]:
    """(backup subnet, every host's two addresses): host i of the lab gets address i of
    `subnet` (default: the subnet after the lab's)."""
    primary = ipaddress.IPv4Network(f"{lab.server.ip}/{prefix_len}", strict=False)
    subnet = subnet or default_backup_subnet(primary)
    base = int(subnet.network_address)
    ends = {}
    for host in lab.hosts:
        offset = int(ipaddress.IPv4Address(host.ip)) - int(primary.network_address)
        ip = str(ipaddress.IPv4Address(base + offset))
        ends[host.name] = PathEnd(
            name=host.name, netns=host.netns or "", primary_ip=host.ip, backup_ip=ip
        )
    return subnet, ends


def plan_backup(
    lab: LinkSite, subnet: ipaddress.IPv4Network | None = None, *, prefix_len: int = 24
) -> BackupPlan:
    """Where a lab's backup links go (nothing is made; see `build_backup`)."""
    subnet, ends = _backup_ends(lab, subnet, prefix_len)
    return BackupPlan(
        lab=lab.name,
        subnet=subnet,
        server=ends[lab.server.name],
        devices=[ends[d.name] for d in lab.devices],
    )


def build_backup(
    lab: LinkSite, subnet: ipaddress.IPv4Network | None = None, *, prefix_len: int = 24
) -> BackupPlan:
    """Add the backup bridge and every host's backup link to a running lab; returns the plan.

    Hosts keep their place: host i of the lab gets address i of `subnet` (default: the subnet
    after the lab's). The links go when the lab's namespaces go.
    """
    r: SystemRunner = lab.runner
    sw = lab.bridge_netns
    if sw is None:
        raise LabError(f"lab {lab.name}: no bridge namespace to add a backup path to")
    subnet, ends = _backup_ends(lab, subnet, prefix_len)
    r.run(["ip", "-n", sw, "link", "add", BACKUP_BRIDGE, "type", "bridge"])
    r.run(["ip", "-n", sw, "link", "set", BACKUP_BRIDGE, "up"])
    for end in ends.values():
        port = backup_port(end.name)
        r.run(
            ["ip", "link", "add", BACKUP_IFACE, "netns", end.netns, "type", "veth"]
            + ["peer", "name", port, "netns", sw]
        )
        r.run(["ip", "-n", sw, "link", "set", port, "master", BACKUP_BRIDGE, "up"])
        cidr = f"{end.backup_ip}/{subnet.prefixlen}"
        r.run(["ip", "-n", end.netns, "addr", "add", cidr, "dev", BACKUP_IFACE])
        r.run(["ip", "-n", end.netns, "link", "set", BACKUP_IFACE, "up"])
    plan = plan_backup(lab, subnet, prefix_len=prefix_len)
    r.write_file(lab.runtime_dir / PLAN_FILE, plan.model_dump_json(indent=2))
    return plan


class _BackupSite:
    """A lab seen through its backup ports (`b-<host>`), for the impairment backends: each
    device at its backup address, the server at its primary one (the address devices keep
    using after a failover). Its runtime dir is its own, so an impairment is never applied to
    it alone (that would replace the primary path's): impair both with `apply_each`."""

    def __init__(self, lab: LinkSite, plan: BackupPlan) -> None:
        self._lab = lab
        self._backup_ip = {end.name: end.backup_ip for end in plan.devices}
        self._port = {end.name: end.site_port for end in [plan.server, *plan.devices]}
        self.runner = lab.runner

    @property
    def name(self) -> str:
        return self._lab.name

    @property
    def bridge_netns(self) -> str | None:
        return self._lab.bridge_netns

    @property
    def impaired_on_hosts(self) -> bool:
        return self._lab.impaired_on_hosts

    def _backup(self, h: LabHost) -> LabHost:
        ip = self._backup_ip.get(h.name, h.ip)
        return h.model_copy(update={"port": self._port[h.name], "ip": ip})

    @property
    def hosts(self) -> list[LabHost]:
        return [self._backup(h) for h in self._lab.hosts]

    @property
    def server(self) -> LabHost:
        return self._backup(self._lab.server)

    @property
    def devices(self) -> list[LabHost]:
        return [self._backup(h) for h in self._lab.devices]

    @property
    def runtime_dir(self) -> Path:
        return self._lab.runtime_dir / "backup"

    def host(self, name: str) -> LabHost:
        return self._backup(self._lab.host(name))

    def host_runner(self, name: str) -> SystemRunner:
        return self._lab.host_runner(name)

    def agent_python(self, name: str) -> str:
        return self._lab.agent_python(name)


def backup_site(lab: LinkSite, plan: BackupPlan | None = None) -> LinkSite:
    """The lab's backup links as a `LinkSite` (LabError if the lab has no backup path)."""
    plan = plan or load_plan(lab)
    if plan is None:
        raise LabError(f"lab {lab.name} has no backup path (its topology has no backup links)")
    return _BackupSite(lab, plan)


def path_site(lab: LinkSite, path: PathKind) -> LinkSite:
    """Where the `path` links of `lab` are impaired: the lab itself, or its backup site."""
    return lab if path == "primary" else backup_site(lab)


def backup_ports(lab: LinkSite) -> list[str]:
    """The backup ports of a lab with a backup path (empty otherwise)."""
    plan = load_plan(lab)
    return [end.site_port for end in [plan.server, *plan.devices]] if plan is not None else []


# --- the monitor ---------------------------------------------------------------------------


def start_monitor(lab: LinkSite, plan: BackupPlan, python: str = sys.executable) -> Path:
    """Start the lab's link monitor (in the root namespace); returns its failover log.

    Waits until it has its sockets in every namespace (it prints `ready`).
    """
    run_dir = lab.runtime_dir
    plan_file, log = run_dir / PLAN_FILE, failover_log(lab)
    lab.runner.write_file(plan_file, plan.model_dump_json(indent=2))
    argv = [python, "-m", "agents.failover", "--plan", str(plan_file), "--log", str(log)]
    argv += [TAG_FLAG, monitor_tag(plan.lab), "--dilation-file", str(run_dir / DILATION_FILE)]
    proc = lab.runner.spawn(argv, stdout=subprocess.PIPE, stderr_path=run_dir / "failover.err")
    if proc is None:
        return log
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20.0)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if line != "ready":
        proc.kill()
        err = (run_dir / "failover.err").read_text()[-2000:]
        raise LabError(f"lab {plan.lab}: the failover monitor did not start: {line!r} {err}")
    return log


def monitor_running(lab: str) -> bool:
    """True while lab `lab`'s link monitor runs (found by its tag, wherever it runs)."""
    return bool(tagged_processes(monitor_tag(lab)))


def set_monitor_dilation(lab: LinkSite, dilation: float) -> None:
    """Tell the lab's link monitor the time dilation of the condition about to run."""
    lab.runner.write_file(lab.runtime_dir / DILATION_FILE, f"{dilation:g}\n")


def load_plan(lab: LinkSite) -> BackupPlan | None:
    """The backup plan of a lab that has a backup path (None otherwise). A dry run writes no
    plan: a dry-run namespace lab whose topology has backup links gets the one `up` makes."""
    declared = getattr(lab, "backup_plan", None)  # a physical lab's, from its inventory
    if isinstance(declared, BackupPlan):
        return declared
    path = lab.runtime_dir / PLAN_FILE
    if path.exists():
        return BackupPlan.model_validate_json(path.read_text())
    topology = getattr(lab, "topology", None)
    if lab.runner.dry_run and getattr(lab, "kind", None) == "namespaces" and topology is not None:
        return plan_backup(lab) if topology.has_backup else None
    return None


def failover_log(lab: LinkSite) -> Path:
    """Where the lab's monitor logs its failovers (read it with `read_failovers`)."""
    return lab.runtime_dir / FAILOVER_LOG


def read_failovers(log: Path, since: float = 0.0, until: float = float("inf")) -> list[Failover]:
    """The switches the monitor logged between wall-clock times `since` and `until` (e.g. one
    condition's span), in order."""
    if not log.exists():
        return []
    events = [Failover.from_json(x) for x in log.read_text().splitlines() if x.strip()]
    return [e for e in events if since <= e.t <= until]
