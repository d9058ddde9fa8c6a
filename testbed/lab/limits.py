"""Host-class resource limits on emulated hosts: a CPU quota and a memory limit through cgroups.

    v2: <unified root>/tb-<lab>/<class>/<host>      cpu.max, memory.max
    v1: <own cpu cgroup>/tb-<lab>/<class>/<host>    cpu.cfs_period_us, cpu.cfs_quota_us
        <own memory cgroup>/tb-<lab>/<class>/<host> memory.limit_in_bytes

Every emulated host gets its own cgroup, grouped by class (an emulated Pi 5 is one Pi, not a
share of all of them), and its sshd is moved into it, so every agent started over SSH inherits
the limit. v2 is used where the unified hierarchy offers the controllers the limits need, v1
where it does not (this machine mounts only v1 `cpu` and `memory`; Pi OS and recent Ubuntu use
v2). v1 groups go under the controller's own cgroup, so they stay inside any limit it already
runs under; v2 groups go under the unified root, because v2 lets only leaf groups hold processes.
Every mkdir, write and rmdir is a command through the lab's SystemRunner, so dry runs print them.
What was made is listed in `<state dir>/cgroups.json`, so `down` from any process removes it.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from testbed.errors import LabError
from testbed.lab import naming
from testbed.lab.spec import LabHost
from testbed.lab.system import SystemRunner
from testbed.topo.hosts import HostClass, host_class

CFS_PERIOD_US = 10_000
"""The CPU quota's accounting period: quota = cores x period. A tenth of the kernel's default,
so that a slow class is slow at the time scale of one drafted token too, not only on average
over 100 ms (the kernel's minimum quota, 1 ms, then allows down to 0.1 cores)."""

CGROUPS_FILE = "cgroups.json"
"""Lists the cgroup folders a lab made (under its state dir)."""

CONTROLLERS = ("cpu", "memory")

PI5_CORES = 0.25
"""CPU quota of an emulated Pi 5, in cores of this machine; other classes scale it by their
`relative_speed` (a Jetson Orin Nano at 2.5x gets 0.625 cores)."""


@dataclass(frozen=True)
class Limits:
    """One host's limits: CPU time in cores (0.5 = half of one core) and memory in bytes.

    None leaves that resource unlimited (and its controller unused).
    """

    cpu_cores: float | None = None
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.cpu_cores is not None and self.cpu_cores <= 0:
            raise ValueError(f"cpu_cores must be > 0, got {self.cpu_cores}")
        if self.memory_bytes is not None and self.memory_bytes < 4096:
            raise ValueError(f"memory_bytes must be at least one page, got {self.memory_bytes}")

    @property
    def controllers(self) -> tuple[str, ...]:
        wanted = {"cpu": self.cpu_cores, "memory": self.memory_bytes}
        return tuple(c for c in CONTROLLERS if wanted[c] is not None)

    @property
    def cpu_quota_us(self) -> int | None:
        """The CFS quota per period, in microseconds (at least the kernel's 1 ms minimum)."""
        if self.cpu_cores is None:
            return None
        return max(1000, round(self.cpu_cores * CFS_PERIOD_US))


def machine_memory() -> int:
    """This machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def class_limits(
    cls: HostClass,
    pi5_cores: float = PI5_CORES,
    machine_cores: int | None = None,
    machine_bytes: int | None = None,
) -> Limits:
    """The limits an emulated host of class `cls` runs under.

    CPU: `pi5_cores` x the class's relative speed; memory: the class's RAM. Either is left
    unlimited where it is at least what this machine has (an emulated A100 server).
    """
    cores = pi5_cores * cls.relative_speed
    memory = int(cls.memory_gb * 2**30)
    return Limits(
        cpu_cores=cores if cores < (machine_cores or os.cpu_count() or 1) else None,
        memory_bytes=memory if memory < (machine_bytes or machine_memory()) else None,
    )


@dataclass(frozen=True)
class Hierarchy:
    """One place cgroups are made: a parent folder and the controllers it carries there."""

    parent: Path
    controllers: tuple[str, ...]
    version: int

    @property
    def weight_file(self) -> str:
        return "cpu.weight" if self.version == 2 else "cpu.shares"

    def weight(self, cores: float, machine_cores: int) -> str:
        """CPU weight of a group whose hosts' quotas add up to `cores`.

        Proportional to the quota, so that on a machine busier than the quotas allow every
        class is slowed alike and their speed ratio holds; a quota of the whole machine weighs
        as much as one process per core. Without weights a lab's whole tree would compete for
        the CPU like a single process.
        """
        if self.version == 2:
            return str(min(10_000, max(1, round(100 * machine_cores * cores))))
        return str(min(262_144, max(2, round(1024 * machine_cores * cores))))

    def settings(self, limits: Limits) -> list[tuple[str, str]]:
        """(file, value) pairs that impose `limits` in this hierarchy."""
        out: list[tuple[str, str]] = []
        quota = limits.cpu_quota_us
        if "cpu" in self.controllers and quota is not None:
            if self.version == 2:
                out.append(("cpu.max", f"{quota} {CFS_PERIOD_US}"))
            else:
                out += [("cpu.cfs_period_us", str(CFS_PERIOD_US)), ("cpu.cfs_quota_us", str(quota))]
        if "memory" in self.controllers and limits.memory_bytes is not None:
            name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
            out.append((name, str(limits.memory_bytes)))
        return out


@dataclass(frozen=True)
class CgroupTree:
    """Where this machine's cgroups live: one v2 hierarchy, or one v1 hierarchy per controller."""

    version: int
    hierarchies: tuple[Hierarchy, ...]

    def for_limits(self, limits: Limits) -> list[Hierarchy]:
        """The hierarchies `limits` needs (LabError naming a controller nobody offers)."""
        needed = limits.controllers
        missing = [c for c in needed if not any(c in h.controllers for h in self.hierarchies)]
        if missing:
            raise LabError(
                f"cgroup v{self.version}: no hierarchy offers the {', '.join(missing)} "
                "controller needed for the host-class limits"
            )
        return [h for h in self.hierarchies if set(h.controllers) & set(needed)]


# --- finding the cgroup hierarchies --------------------------------------------------------


@dataclass(frozen=True)
class _Mount:
    root: str  # the hierarchy path mounted there
    point: Path
    fstype: str
    options: frozenset[str]


def _mounts(mountinfo: str) -> list[_Mount]:
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(fields[4].replace("\\040", " "))
        found.append(_Mount(fields[3], point, tail[0], frozenset(tail[2].split(","))))
    return found


def _own_groups(self_cgroup: str) -> dict[str, str]:
    """Controller (or "" for the unified hierarchy) -> this process's cgroup path."""
    groups: dict[str, str] = {}
    for line in self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            groups[c] = path
    return groups


def _inside(mount: _Mount, group: str) -> Path:
    """The folder of cgroup `group` under `mount` (its mount root may be a sub-path)."""
    rel = group
    if mount.root != "/" and (group == mount.root or group.startswith(mount.root + "/")):
        rel = group[len(mount.root) :]
    return mount.point / rel.lstrip("/")


def detect_cgroups(
    mountinfo: Path = Path("/proc/self/mountinfo"),
    self_cgroup: Path = Path("/proc/self/cgroup"),
    want: Iterable[str] = CONTROLLERS,
) -> CgroupTree:
    """The cgroup tree to use here: v2 if its unified hierarchy has every controller in
    `want`, else v1 (each controller's own cgroup of this process as parent)."""
    want = tuple(want)
    mounts = _mounts(mountinfo.read_text())
    for m in mounts:
        if m.fstype != "cgroup2":
            continue
        try:
            offered = set((m.point / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        if set(want) <= offered:
            return CgroupTree(2, (Hierarchy(m.point, want, 2),))
    own = _own_groups(self_cgroup.read_text())
    v1 = []
    for c in want:
        m = next((m for m in mounts if m.fstype == "cgroup" and c in m.options), None)
        if m is not None:
            v1.append(Hierarchy(_inside(m, own.get(c, "/")), (c,), 1))
    if not v1:
        raise LabError(
            f"no cgroup hierarchy with the {', '.join(want)} controllers is mounted "
            f"(read {mountinfo}); host-class limits need cgroups"
        )
    return CgroupTree(1, tuple(v1))


# --- making, filling and removing a lab's cgroups ------------------------------------------


class AppliedLimits(BaseModel):
    """The limits one host runs under, as read back from its cgroups (for the run's records)."""

    host: str
    host_class: str
    cgroup_version: int
    cpu_cores: float | None
    memory_bytes: int | None
    cgroups: list[str]
    settings: dict[str, str]


class _Made(BaseModel):
    folders: list[str] = []


def lab_dir(hierarchy: Hierarchy, lab: str) -> Path:
    return hierarchy.parent / f"{naming.PREFIX}{lab}"


def _write(runner: SystemRunner, path: Path, value: str) -> None:
    runner.run(["sh", "-c", f"echo {shlex.quote(value)} > {shlex.quote(str(path))}"])


class HostLimiter:
    """Puts a lab's hosts under their class limits and removes the groups again."""

    def __init__(
        self,
        lab: str,
        state_dir: Path,
        runner: SystemRunner,
        tree: CgroupTree | None = None,
        machine_cores: int | None = None,
    ) -> None:
        self.lab = lab
        self.state_dir = state_dir
        self.runner = runner
        self._tree = tree
        self.machine_cores = machine_cores or os.cpu_count() or 1
        self._made = _Made()
        self._cores: dict[Path, float] = {}  # group folder -> quota cores of the hosts below

    @property
    def tree(self) -> CgroupTree:
        if self._tree is None:
            self._tree = detect_cgroups()
        return self._tree

    @property
    def record_file(self) -> Path:
        return self.state_dir / CGROUPS_FILE

    def host_group(self, hierarchy: Hierarchy, host_class: str, host: str) -> Path:
        return lab_dir(hierarchy, self.lab) / host_class / host

    def _mkdir(self, hierarchy: Hierarchy, folder: Path) -> None:
        """Create `folder` unless there (v2: enabling the controllers in its parent first)."""
        if str(folder) in self._made.folders or (not self.runner.dry_run and folder.is_dir()):
            return
        if hierarchy.version == 2:
            wanted = " ".join(f"+{c}" for c in hierarchy.controllers)
            _write(self.runner, folder.parent / "cgroup.subtree_control", wanted)
        self.runner.run(["mkdir", folder])
        self._made.folders.append(str(folder))

    def confine(self, host: str, host_class: str, limits: Limits, pid_file: Path) -> AppliedLimits:
        """Make the host's cgroups, set `limits` and move the process in `pid_file` into them.

        The process is moved by reading the pid file on the system side, so a dry run prints
        the same command. Returns what the cgroups hold afterwards.
        """
        groups: list[Path] = []
        settings: dict[str, str] = {}
        for h in self.tree.for_limits(limits):
            top = lab_dir(h, self.lab)
            group = self.host_group(h, host_class, host)
            for folder in (top, top / host_class, group):
                self._mkdir(h, folder)
            self.runner.write_file(self.record_file, self._made.model_dump_json(indent=2))
            for name, value in h.settings(limits):
                _write(self.runner, group / name, value)
            if "cpu" in h.controllers and limits.cpu_cores is not None:
                for folder in (top, top / host_class, group):
                    self._cores[folder] = self._cores.get(folder, 0.0) + limits.cpu_cores
                    weight = h.weight(self._cores[folder], self.machine_cores)
                    _write(self.runner, folder / h.weight_file, weight)
            procs = shlex.quote(str(group / "cgroup.procs"))
            self.runner.run(["sh", "-c", f"cat {shlex.quote(str(pid_file))} > {procs}"])
            groups.append(group)
            settings |= {
                name: (value if self.runner.dry_run else (group / name).read_text().strip())
                for name, value in h.settings(limits)
            }
        return AppliedLimits(
            host=host,
            host_class=host_class,
            cgroup_version=self.tree.version,
            cpu_cores=limits.cpu_cores,
            memory_bytes=limits.memory_bytes,
            cgroups=[str(g) for g in groups],
            settings=settings,
        )

    def _found(self) -> set[str]:
        """This lab's cgroup folders found in this machine's hierarchies (after a crash)."""
        try:
            tree = self.tree
        except (LabError, OSError):
            return set()
        found = set()
        for h in tree.hierarchies:
            for folder, _dirs, _files in os.walk(lab_dir(h, self.lab)):
                found.add(folder)
        return found

    def remove(self, wait_s: float = 5.0) -> list[str]:
        """Remove every cgroup folder this lab made, deepest first; returns what went.

        Call after the lab's processes are killed: a group is removable once its last task
        has exited, which can take a moment after the kill.
        """
        folders = set(self._made.folders) | self._found()
        if self.record_file.exists():
            folders |= set(_Made.model_validate_json(self.record_file.read_text()).folders)
        removed = []
        for folder in sorted(folders, key=lambda f: (-f.count("/"), f)):
            path = Path(folder)
            if not self.runner.dry_run and not path.is_dir():
                continue
            deadline = time.monotonic() + wait_s
            while True:
                res = self.runner.run(["rmdir", path], check=False)
                if res.ok or self.runner.dry_run:
                    removed.append(f"cgroup {path}")
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"could not remove cgroup {path}: {res.stderr.strip()}")
                time.sleep(0.05)
        self._made = _Made()
        if self.record_file.exists() and not self.runner.dry_run:
            self.record_file.unlink()
        return removed


def confine_hosts(
    limiter: HostLimiter,
    hosts: Iterable[LabHost],
    pid_files: dict[str, Path],
    pi5_cores: float = PI5_CORES,
) -> list[AppliedLimits]:
    """Put every host whose class is limited here (see `class_limits`) under its limits,
    moving the process of its pid file (its sshd); returns what each host got."""
    applied = []
    for host in hosts:
        limits = class_limits(host_class(host.host_class, f"host {host.name}"), pi5_cores)
        if limits.controllers:
            applied.append(
                limiter.confine(host.name, host.host_class, limits, pid_files[host.name])
            )
    return applied


def cgroup_members(group: Path) -> list[int]:
    """The pids in cgroup folder `group`."""
    return [int(p) for p in (group / "cgroup.procs").read_text().split()]
