"""Host-class limits through cgroups: v2 on a fake cgroup root, v1/v2 detection from mount
tables, dry runs, and the live path of this machine on an emulated lab (with real drafting)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import LabError
from testbed.lab.limits import (
    CgroupTree,
    Hierarchy,
    HostLimiter,
    Limits,
    cgroup_members,
    class_limits,
    detect_cgroups,
)
from testbed.lab.system import SystemRunner
from testbed.topo.hosts import HOST_CLASSES

V2_MOUNTINFO = "30 23 0:26 / {root} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTINFO = (
    "25 24 0:21 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
    "31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
    "32 25 0:28 /ctr /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n"
    "33 25 0:29 / /sys/fs/cgroup/unified rw shared:11 - cgroup2 cgroup2 rw\n"
)
V1_SELF = "4:memory:/ctr/job7\n3:cpu,cpuacct:/\n0::/\n"


def fake_v2(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(V2_MOUNTINFO.format(root=root))
    self_cg = tmp_path / "self"
    self_cg.write_text("0::/user.slice/session-1.scope\n")
    return root, mountinfo, self_cg


def test_v2_chosen_when_unified_hierarchy_offers_cpu_and_memory(tmp_path: Path) -> None:
    root, mountinfo, self_cg = fake_v2(tmp_path)
    tree = detect_cgroups(mountinfo, self_cg)
    assert tree.version == 2
    assert tree.hierarchies == (Hierarchy(root, ("cpu", "memory"), 2),)


def test_v1_chosen_when_unified_hierarchy_lacks_controllers(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(V1_MOUNTINFO)
    self_cg = tmp_path / "self"
    self_cg.write_text(V1_SELF)
    # the unified mount point does not exist here, so it offers no controllers
    tree = detect_cgroups(mountinfo, self_cg)
    assert tree.version == 1
    by_ctl = {h.controllers: h.parent for h in tree.hierarchies}
    assert by_ctl[("cpu",)] == Path("/sys/fs/cgroup/cpu,cpuacct")
    # the memory mount's root is /ctr, so the own group /ctr/job7 lies at <mount>/job7
    assert by_ctl[("memory",)] == Path("/sys/fs/cgroup/memory/job7")


def test_no_cgroup_mounts_is_an_error_naming_the_controllers(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("25 24 0:21 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n")
    self_cg = tmp_path / "self"
    self_cg.write_text("0::/\n")
    with pytest.raises(LabError, match="cpu, memory"):
        detect_cgroups(mountinfo, self_cg)


def test_v2_writes_cpu_max_memory_max_and_moves_the_pid(tmp_path: Path) -> None:
    root, mountinfo, self_cg = fake_v2(tmp_path)
    pid_file = tmp_path / "sshd.pid"
    pid_file.write_text("4242\n")
    tree = detect_cgroups(mountinfo, self_cg)
    limiter = HostLimiter("h2", tmp_path / "state", SystemRunner(), tree, machine_cores=2)
    applied = limiter.confine("dev1", "pi5", Limits(cpu_cores=0.25, memory_bytes=2**30), pid_file)
    group = root / "tb-h2" / "pi5" / "dev1"
    assert applied.cgroups == [str(group)]
    assert (group / "cpu.max").read_text().strip() == "2500 10000"
    assert (group / "memory.max").read_text().strip() == str(2**30)
    assert cgroup_members(group) == [4242]
    # v2: every ancestor enables the controllers for its children
    for parent in (root, root / "tb-h2", root / "tb-h2" / "pi5"):
        assert (parent / "cgroup.subtree_control").read_text().split() == ["+cpu", "+memory"]
    assert applied.settings == {"cpu.max": "2500 10000", "memory.max": str(2**30)}
    assert not (group / "cpu.cfs_quota_us").exists()
    # weights follow the quotas below each level (2 cores: a whole-machine quota weighs 200)
    assert (root / "tb-h2" / "cpu.weight").read_text().strip() == "50"
    limiter.confine("dev2", "pi5", Limits(cpu_cores=0.25), pid_file)
    limiter.confine("dev3", "jetson", Limits(cpu_cores=0.625), pid_file)
    weights = {
        p: (root / "tb-h2" / p / "cpu.weight").read_text().strip()
        for p in ("", "pi5", "jetson", "pi5/dev1", "jetson/dev3")
    }
    assert weights == {
        "": "225",
        "pi5": "100",
        "jetson": "125",
        "pi5/dev1": "50",
        "jetson/dev3": "125",
    }


def test_dry_run_prints_v1_commands_and_creates_nothing(tmp_path: Path) -> None:
    cpu, mem = tmp_path / "cpu", tmp_path / "memory"
    tree = CgroupTree(1, (Hierarchy(cpu, ("cpu",), 1), Hierarchy(mem, ("memory",), 1)))
    runner = SystemRunner(dry_run=True, echo=lambda _line: None)
    limiter = HostLimiter("h1", tmp_path / "state", runner, tree, machine_cores=2)
    pid_file = tmp_path / "sshd.pid"
    limiter.confine("dev1", "pi5", Limits(cpu_cores=0.5, memory_bytes=2**28), pid_file)
    text = "\n".join(runner.actions)
    group = cpu / "tb-h1" / "pi5" / "dev1"
    assert f"echo 5000 > {group}/cpu.cfs_quota_us" in text
    assert f"echo 10000 > {group}/cpu.cfs_period_us" in text
    assert f"echo {2**28} > {mem}/tb-h1/pi5/dev1/memory.limit_in_bytes" in text
    assert f"cat {pid_file} > {group}/cgroup.procs" in text
    assert f"echo 1024 > {cpu}/tb-h1/cpu.shares" in text  # half a core of a 2-core machine
    assert not cpu.exists() and not mem.exists()
    removed = limiter.remove()
    assert set(removed[:2]) == {f"cgroup {cpu}/tb-h1/pi5/dev1", f"cgroup {mem}/tb-h1/pi5/dev1"}
    assert removed[-1].endswith("tb-h1")


def test_unset_limit_uses_no_controller() -> None:
    tree = CgroupTree(1, (Hierarchy(Path("/c"), ("cpu",), 1),))
    assert tree.for_limits(Limits(cpu_cores=1.0)) == list(tree.hierarchies)
    with pytest.raises(LabError, match="memory"):
        tree.for_limits(Limits(memory_bytes=2**30))


def test_class_limits_follow_the_class_table() -> None:
    machine = {"pi5_cores": 0.2, "machine_cores": 2, "machine_bytes": 24 * 2**30}
    pi5 = class_limits(HOST_CLASSES["pi5"], **machine)
    jetson = class_limits(HOST_CLASSES["jetson-orin-nano"], **machine)
    server = class_limits(HOST_CLASSES["a100"], **machine)
    assert pi5.cpu_quota_us == 2_000
    assert jetson.cpu_quota_us == 5_000
    # 4 cores' and 256 GB's worth on a 2-core, 24 GB machine: left unlimited
    assert server.cpu_cores is None and server.memory_bytes is None
    assert server.controllers == ()
    assert pi5.memory_bytes == 8 * 2**30


# --- live, on this machine's cgroups --------------------------------------------------------


def mixed_topology():
    """A server, one Pi 5 (dev1) and one Jetson Orin Nano (dev2)."""
    from testbed.netem.profile import LinkProfile
    from testbed.topo.model import TopoHost, TopoLink, Topology

    hosts = [
        TopoHost(name="server", role="server", host_class="a100"),
        TopoHost(name="dev1", role="device", host_class="pi5"),
        TopoHost(name="dev2", role="device", host_class="jetson-orin-nano"),
    ]
    wifi = LinkProfile(rtt_ms=85)
    links = [TopoLink(a=d, b="server", profile_name="wifi", profile=wifi) for d in ("dev1", "dev2")]
    return Topology(name="hmix", hosts=hosts, links=links)


@pytest.fixture
def limited_lab(root_netns: None, tmp_path: Path):
    """A lab (hlim, 10.85.1.0/24) of `mixed_topology` brought up with host-class limits."""
    from testbed.lab.emulated import EmulatedLab
    from testbed.lab.spec import LabSpec

    spec = LabSpec.build(
        name="hlim",
        topology=mixed_topology(),
        subnet="10.85.1.0/24",
        state_dir=str(tmp_path / "lab"),
        pi5_cores=0.25,
    )
    lab = EmulatedLab.up(spec)
    try:
        yield lab, {a.host: a for a in lab.state.limits}
    finally:
        lab.down()


def _own_group_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        _, ctls, path = line.split(":", 2)
        for c in ctls.split(",") if ctls else [""]:
            out[c] = path
    return out


def test_live_sshd_and_ssh_sessions_land_in_the_class_group(limited_lab) -> None:
    from testbed.hosts.control import HostControl

    lab, applied = limited_lab
    assert set(applied) == {"dev1", "dev2"}  # the A100 server gets the whole machine
    assert lab.describe()["limits"] == [a.model_dump() for a in applied.values()]
    for name, cls, cores in (("dev1", "pi5", 0.25), ("dev2", "jetson-orin-nano", 0.625)):
        a = applied[name]
        assert a.cpu_cores == pytest.approx(cores)
        quota = "cpu.max" if a.cgroup_version == 2 else "cpu.cfs_quota_us"
        assert a.settings[quota].split()[0] == str(round(cores * 10_000))
        sshd_pid = int(lab.state.sshd_pid_files[name].read_text())
        for group in a.cgroups:
            assert sshd_pid in cgroup_members(Path(group))
            assert Path(group).parent.name == cls
    with HostControl(lab.inventory()) as hc:
        seen = _own_group_lines(hc.run("dev1", "cat /proc/self/cgroup").stdout)
    ctl = "" if applied["dev1"].cgroup_version == 2 else "cpu"
    assert seen[ctl].endswith("/tb-hlim/pi5/dev1")


def one_pi_lab(name: str, subnet: str, state_dir: Path):
    """A lab of one Pi 5 and a server, up with host-class limits (Pi 5: 0.3 cores)."""
    from testbed.lab.emulated import EmulatedLab
    from testbed.lab.spec import LabSpec

    spec = LabSpec.build(
        name=name, devices=1, subnet=subnet, state_dir=str(state_dir), pi5_cores=0.3
    )
    return EmulatedLab.up(spec)


def test_live_groups_removed_by_lab_down(root_netns: None, tmp_path: Path) -> None:
    lab = one_pi_lab("hlimd", "10.85.2.0/24", tmp_path / "lab")
    try:
        (applied,) = lab.state.limits
        groups = [Path(g) for g in applied.cgroups]
        assert all(g.is_dir() for g in groups)
    finally:
        removed = lab.down()
    for g in groups:
        assert not g.parents[1].exists()
        assert f"cgroup {g.parents[1]}" in removed


def test_live_pi5_drafting_is_throttled_by_its_quota(limited_lab, tiny_pair) -> None:
    """Real llama.cpp drafting inside the Pi 5 host: the kernel throttles it (cpu.stat)."""
    from testbed.hosts.control import HostControl
    from testbed.lab.drafting_rate import measure_drafting_rate

    lab, applied = limited_lab
    with HostControl(lab.inventory()) as hc:
        rate = measure_drafting_rate(
            hc, "dev1", tiny_pair.draft_gguf, tokens=48, seconds=0.3, threads=1
        )
    assert rate is not None and rate.tokens >= 48 and rate.seconds >= 0.3
    group = Path(applied["dev1"].cgroups[0])
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0


def test_live_clean_removes_groups_of_a_crashed_lab(root_netns: None, tmp_path: Path) -> None:
    """`testbed lab clean --name` finds a lab's cgroups on the system, without its records."""
    from testbed.lab.clean import clean_all

    lab = one_pi_lab("hlimc", "10.85.11.0/24", tmp_path / "lab")
    (applied,) = lab.state.limits
    tops = {Path(g).parents[1] for g in applied.cgroups}
    (tmp_path / "lab" / "cgroups.json").unlink()  # as if the state were lost in a crash
    removed = clean_all("hlimc")
    assert all(not t.exists() for t in tops)
    assert {f"cgroup {t}" for t in tops} <= set(removed)
