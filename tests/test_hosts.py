"""Fabric host control: commands, group results with partial failure, background processes,
files (inventories are tested in test_inventory.py)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import require_root_netns

from testbed.core.errors import AgentError, BadInputError
from testbed.hosts import GroupError, GroupResult, HostControl, Inventory, InventoryHost
from testbed.hosts.control import env_prefix, remote_path, start_script


def two_hosts() -> Inventory:
    """A server and a device that no test connects to."""
    return Inventory(
        source="two hosts",
        hosts=(
            InventoryHost(name="srv", role="server", address="10.0.0.1", user="root", workdir="/w"),
            InventoryHost(name="pi1", role="device", address="10.0.0.2", user="pi",
                          workdir="/home/pi/w"),
        ),
    )  # fmt: skip


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies excluded), from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


# --- shell snippets and dry-run ------------------------------------------------------------


def test_shell_quoting(tmp_path: Path) -> None:
    assert remote_path("~/w x") == "\"$HOME\"/'w x'"
    assert remote_path("/a b") == "'/a b'"
    env = {"A": "it's $HOME", "B": "2"}
    out = subprocess.run(
        ["sh", "-c", f'{env_prefix(env)}printf \'%s|%s\' "$A" "$B"'],
        capture_output=True,
        text=True,
    ).stdout
    assert out == "it's $HOME|2"
    with pytest.raises(BadInputError, match="not valid"):
        env_prefix({"BAD-NAME": "x"})
    with pytest.raises(BadInputError, match="process name"):
        start_script("/w", "../escape", "true")


def test_start_script_runs_detached_locally(tmp_path: Path) -> None:
    """The same script Fabric sends, run by a local shell: pid, log and exit code files."""
    script = start_script(str(tmp_path), "job", 'echo "out $V $PWD"; exit 7', env={"V": "1 2"})
    pid = int(subprocess.run(["sh", "-c", script], capture_output=True, text=True, cwd="/").stdout)
    assert pid > 0
    rc = tmp_path / ".testbed" / "job.rc"
    for _ in range(200):
        if rc.exists() and rc.read_text().strip():
            break
        subprocess.run(["sleep", "0.02"])
    assert rc.read_text().strip() == "7"
    assert (tmp_path / ".testbed" / "job.log").read_text() == f"out 1 2 {tmp_path}\n"


def test_dry_run_prints_and_connects_to_nothing(tmp_path: Path) -> None:
    inv = two_hosts()
    printed: list[str] = []
    hc = HostControl(inv, dry_run=True, echo=printed.append)
    hc.run_all("uname -a")
    proc = hc.start("pi1", "drafter", "python -m agents.sled.device", env={"SEED": "1"})
    hc.stop(proc)
    hc.get("srv", "records.parquet", tmp_path / "out" / "r.parquet")
    assert hc._conns == {}
    text = "\n".join(printed)
    assert "[dry-run] ssh root@10.0.0.1 (srv): cd /w && uname -a" in text
    assert (
        "ssh pi@10.0.0.2 (pi1): start drafter: export SEED=1 && python -m agents.sled.device"
        in text
    )
    assert "get /w/records.parquet ->" in text
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_the_facts_it_would_read() -> None:
    """`with_provisioned_facts` in a dry run: each read printed, no host contacted, the
    inventory as it is and no host said to lack facts."""
    from testbed.hosts.provisioned import with_provisioned_facts

    inv = two_hosts()
    printed: list[str] = []
    hc = HostControl(inv, dry_run=True, echo=printed.append)
    got = with_provisioned_facts(hc)
    assert got.inventory == inv and got.taken == got.missing == {} and hc._conns == {}
    text = "\n".join(printed)
    for host, work in (("root@10.0.0.1 (srv)", "/w"), ("pi@10.0.0.2 (pi1)", "/home/pi/w")):
        for name in ("models", "netem"):
            path = f"{work}/facts/{name}.json"
            assert f"[dry-run] ssh {host}: cd / && test -e {path} || exit 66; cat {path}" in text


# --- root: over SSH to the emulated lab ----------------------------------------------------


@pytest.fixture(scope="module")
def hc(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    from testbed.labs import EmulatedLab, LabSetup

    setup = LabSetup(
        name="fhost", devices=2, subnet="10.80.2.0/24", state_dir=tmp_path_factory.mktemp("fh")
    )
    with EmulatedLab.running(setup) as lab, HostControl(lab.inventory()) as control:
        yield control


def test_run_in_workdir_with_env(hc: HostControl) -> None:
    res = hc.run("dev1", 'echo "$PWD $GREETING"', env={"GREETING": "hi there"})
    assert res.stdout.strip() == f"{hc.inventory.host('dev1').workdir} hi there"


def test_failures_name_the_host(hc: HostControl) -> None:
    with pytest.raises(AgentError, match=r"dev2: command failed \(exit 3\)"):
        hc.run("dev2", "exit 3")
    with pytest.raises(AgentError, match=r"dev2: timed out"):
        hc.run("dev2", "sleep 5", timeout=1)
    results = hc.run_all('test $(hostname) && [ "$PWD" != /nowhere ]', check=True)
    assert all(r.ok for r in results.values())
    with pytest.raises(GroupError, match="failed on 1 of 3 host.*server: exit 1") as err:
        hc.run_all("case $PWD in */server) echo no >&2; exit 1;; esac; echo yes")
    # Fabric's shape: the successes are kept beside the failure, each keyed by host
    assert isinstance(err.value.result, GroupResult)
    assert set(err.value.result.succeeded) == {"dev1", "dev2"}
    assert all(r.stdout == "yes\n" for r in err.value.result.succeeded.values())
    assert list(err.value.result.failed) == ["server"]
    assert err.value.result.reasons()["server"] == "server: exit 1 no"
    relaxed = hc.run_all("case $PWD in */server) exit 1;; esac", check=False)
    assert relaxed["server"].returncode == 1 and not relaxed.failed


def test_unreachable_host_fails_alone(hc: HostControl) -> None:
    """A host that cannot be reached is one failure naming it; the others still answer."""
    ghost = hc.inventory.devices[0].model_copy(update={"name": "ghost", "address": "10.80.2.250"})
    inv = hc.inventory.model_copy(update={"hosts": (*hc.inventory.hosts, ghost)})
    with HostControl(inv, connect_timeout=2) as control, pytest.raises(GroupError) as err:
        control.run_all("hostname")
    assert set(err.value.result.succeeded) == {"server", "dev1", "dev2"}
    assert "ghost (10.80.2.250): cannot run" in err.value.result.reasons()["ghost"]


def test_background_process_lifecycle(hc: HostControl) -> None:
    proc = hc.start("server", "agent", 'echo "$ROLE in $PWD"; exec sleep 60', env={"ROLE": "srv"})
    assert hc.is_alive(proc)
    workdir = hc.inventory.host("server").workdir
    assert proc.log_file == f"{workdir}/.testbed/agent.log"
    assert Path(proc.pid_file).read_text().strip() == str(proc.pid)
    assert f"srv in {workdir}" in hc.log_tail(proc)
    assert hc.stop(proc, grace_s=3) is False  # went on SIGTERM
    assert not hc.is_alive(proc)


def test_stop_kills_what_ignores_sigterm(hc: HostControl) -> None:
    proc = hc.start("dev1", "stubborn", "trap '' TERM; sleep 60")
    assert hc.stop(proc, grace_s=0.5) is True
    assert not hc.is_alive(proc)
    assert live_group_members(proc.pid) == []


def test_exit_code_of_finished_process(hc: HostControl) -> None:
    proc = hc.start("dev2", "short", "exit 4")
    for _ in range(100):
        if hc.exit_code(proc) is not None:
            break
    assert hc.exit_code(proc) == 4 and not hc.is_alive(proc)


def test_put_and_get_files(hc: HostControl, tmp_path: Path) -> None:
    src = tmp_path / "payload.txt"
    src.write_text("payload ✓\n")
    hc.put("dev2", src, "payload.txt")
    res = hc.run("dev2", "cat payload.txt")
    assert res.stdout == "payload ✓\n"
    got = hc.get("dev2", "payload.txt", tmp_path / "back" / "p.txt")
    assert got.read_text() == "payload ✓\n"
    with pytest.raises(AgentError, match=r"dev2: cannot fetch"):
        hc.get("dev2", "missing.txt", tmp_path / "m.txt")


def test_start_and_stop_on_every_device(hc: HostControl) -> None:
    devices = hc.inventory.devices
    procs = hc.start_all(
        "drafter",
        lambda h: f'echo "$DEVICE at {h.address}"; exec sleep 60',
        devices,
        env=lambda h: {"DEVICE": h.name},
    )
    assert set(procs) == {"dev1", "dev2"}
    assert all(hc.is_alive(p) for p in procs.values())
    assert "dev2 at 10.80.2.3" in hc.log_tail(procs["dev2"])
    stopped = hc.stop_all(procs.values(), grace_s=2)
    assert dict(stopped) == {"dev1/drafter": False, "dev2/drafter": False}
    assert not any(hc.is_alive(p) for p in procs.values())


def write_facts(hc: HostControl, host: str, /, **files: str) -> Path:
    """Facts files (name -> text) in `host`'s facts folder, as the site playbook leaves them;
    returns the folder."""
    folder = Path(hc.inventory.host(host).workdir) / "facts"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.json").write_text(text)
    return folder


@pytest.fixture
def facts_folders(hc: HostControl) -> Iterator[None]:
    """Every host without facts again after the test (the hosts are shared)."""
    yield
    for h in hc.inventory.hosts:
        shutil.rmtree(Path(h.workdir) / "facts", ignore_errors=True)


def test_facts_read_back_per_host(hc: HostControl, facts_folders: None) -> None:
    """`read_facts`: each host's facts file as a dict; None for a host without one (the site
    playbook has not provisioned it)."""
    from testbed.hosts.provisioned import read_facts

    write_facts(hc, "dev1", netem='{"sch_netem": false, "backend": "userspace"}')
    read = read_facts(hc, "netem", ["dev1", "dev2"])
    assert read["dev1"]["backend"] == "userspace" and read["dev2"] is None


def test_provisioned_facts_fill_what_the_inventory_leaves_unset(
    hc: HostControl, facts_folders: None
) -> None:
    """Paths from the facts where the inventory names none (one it names wins); a host
    without facts keeps its variables and is listed with the files it lacks."""
    from testbed.hosts.provisioned import with_provisioned_facts

    write_facts(hc, "dev1", models='{"draft_model": "/m/d.gguf", "draft_model_name": "x"}',
                netem='{"backend": "userspace", "holder_path": "/b/tb-holder"}',
                host='{"host": "dev1"}')  # fmt: skip
    write_facts(hc, "dev2", models='{"draft_model": "/m/d2.gguf"}',
                netem='{"backend": "userspace", "holder_path": "/b/tb-holder"}',
                host='{"host": "dev2"}')  # fmt: skip
    dev2 = hc.inventory.host("dev2")
    own = dev2.model_copy(update={"vars": {**dev2.vars, "draft_model": "/mine/d.gguf"}})
    inv = hc.inventory.model_copy(
        update={"hosts": tuple(own if h.name == "dev2" else h for h in hc.inventory.hosts)}
    )
    with HostControl(inv) as control:
        got = with_provisioned_facts(control)
    assert got.taken == {
        "dev1": {"draft_model": "/m/d.gguf", "holder_path": "/b/tb-holder"},
        "dev2": {"holder_path": "/b/tb-holder"},
    }
    assert got.inventory.host("dev1").vars["draft_model"] == "/m/d.gguf"
    assert got.inventory.host("dev2").vars["draft_model"] == "/mine/d.gguf"
    assert got.inventory.host("server").vars == hc.inventory.host("server").vars
    assert got.missing == {"server": ["facts/models.json", "facts/netem.json", "facts/host.json"]}


def test_bad_facts_name_host_file_and_key(hc: HostControl, facts_folders: None) -> None:
    """A facts file that is not JSON (or not an object), or a path of the wrong type: an
    error naming the host, the file and the key."""
    from testbed.hosts.provisioned import with_provisioned_facts

    dev1 = write_facts(hc, "dev1", models='{"draft_model": "/m/d.gguf",')
    dev2 = write_facts(hc, "dev2", models='{"draft_model": 3}')
    with pytest.raises(GroupError) as err:
        with_provisioned_facts(hc)
    reasons = err.value.result.reasons()
    assert set(reasons) == {"dev1", "dev2"}
    assert reasons["dev1"].startswith(f"dev1: {dev1}/models.json: not JSON (")
    assert reasons["dev2"] == (
        f"dev2: {dev2}/models.json: draft_model: expected a path (a non-empty string), got 3"
    )
    assert "reading facts/models.json failed on 2 of 3 host(s)" in str(err.value)
    write_facts(hc, "dev1", models='["/m/d.gguf"]')
    write_facts(hc, "dev2", models="{}", netem='{"backend": "userspace", "holder_path": null}')
    with pytest.raises(GroupError, match=r"dev1: \S+/models\.json: expected a JSON object, got"):
        with_provisioned_facts(hc)
    write_facts(hc, "dev1", models="{}")
    with pytest.raises(GroupError) as err:
        with_provisioned_facts(hc, ["dev1", "dev2"])
    assert err.value.result.reasons() == {
        "dev2": f"dev2: {dev2}/netem.json: holder_path: expected a path (a non-empty string), "
        "got None"
    }
