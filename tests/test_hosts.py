"""Inventory validation and Fabric host control (commands, background processes, files)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import require_root_netns

from testbed.errors import AgentError, BadInputError
from testbed.hosts import HostControl, load_inventory, parse_inventory
from testbed.hosts.control import env_prefix, remote_path, start_script
from testbed.hosts.inventory import dump_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "ansible" / "inventories" / "lab.example.yml"


def _write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "lab.yml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def _doc(**server_vars: object) -> dict:
    server = {"ansible_host": "10.0.0.1", "ansible_user": "root", "workdir": "/w", **server_vars}
    return {
        "all": {
            "children": {
                "servers": {"hosts": {"srv": server}},
                "devices": {
                    "vars": {"ansible_user": "pi", "workdir": "/home/pi/w"},
                    "hosts": {"pi1": {"ansible_host": "10.0.0.2"}},
                },
            }
        }
    }


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


# --- inventory -----------------------------------------------------------------------------


def test_example_inventory_is_valid() -> None:
    inv = load_inventory(EXAMPLE)
    assert [h.name for h in inv.servers] == ["a100"]
    assert [h.name for h in inv.devices] == ["pi5-1", "pi5-2", "jetson-1"]
    jetson = inv.host("jetson-1")
    assert (jetson.user, jetson.workdir) == ("nvidia", "/home/nvidia/edge-testbed")
    assert inv.host("pi5-1").user == "pi"  # group vars
    assert jetson.key_file == Path("~/.ssh/edge_lab_ed25519").expanduser()  # all vars


def test_group_vars_and_relative_key(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, _doc(ansible_ssh_private_key_file="keys/id")))
    assert inv.server.key_file == tmp_path / "keys" / "id"
    assert inv.devices[0].user == "pi" and inv.devices[0].workdir == "/home/pi/w"
    assert inv.server.port == 22 and inv.server.python == "python3"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (_doc(ansible_port="ssh"), r"host 'srv' \(group servers\): ansible_port: .*integer"),
        (_doc(ansible_port=70000), r"host 'srv' \(group servers\): ansible_port: .*65535"),
        (_doc(role="device"), r"host 'srv' \(group servers\): role: expected 'server'"),
        ({"all": {"children": {"devices": {"hosts": {}}}}}, r"at least one host in group"),
        ({"all": {"hosts": {"x": {}}}}, r"all.hosts: put each host under children"),
        (
            {"all": {"children": {"servers": {"hosts": {"s": {"workdir": "/w"}}}}}},
            r"host 's' \(group servers\): missing ansible_host",
        ),  # fmt: skip
        ({"all": {"children": {"servers": []}}}, r"servers: expected a mapping"),
        ("all: [unclosed", r"not valid YAML"),
    ],
)
def test_inventory_errors_name_file_host_and_key(tmp_path: Path, doc, expected: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(BadInputError, match=expected) as err:
        load_inventory(path)
    assert str(path) in str(err.value)


def test_host_in_two_groups_is_refused(tmp_path: Path) -> None:
    doc = _doc()
    doc["all"]["children"]["devices"]["hosts"]["srv"] = {"ansible_host": "10.0.0.9"}
    with pytest.raises(BadInputError, match=r"host 'srv' \(group \w+\): also listed in group \w+"):
        load_inventory(_write(tmp_path, doc))


def test_unknown_host_lookup_names_the_hosts(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, _doc()))
    with pytest.raises(BadInputError, match=r"no host 'nope' \(hosts: srv, pi1\)"):
        inv.host("nope")


def test_dump_then_parse_round_trips(tmp_path: Path) -> None:
    inv = load_inventory(EXAMPLE)
    again = parse_inventory(yaml.safe_load(dump_inventory(list(inv.hosts), inv.vars)), "x")
    assert again.hosts == inv.hosts


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
    inv = load_inventory(_write(tmp_path, _doc()))
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


# --- root: over SSH to the emulated lab ----------------------------------------------------


@pytest.fixture(scope="module")
def hc(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    from testbed.lab import EmulatedLab, LabSpec

    spec = LabSpec(
        name="thost", devices=2, subnet="10.77.203.0/24", state_dir=tmp_path_factory.mktemp("th")
    )
    with EmulatedLab.running(spec) as lab, HostControl(lab.inventory()) as control:
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
    with pytest.raises(AgentError, match="server: exit 1"):
        hc.run_all("case $PWD in */server) exit 1;; esac")


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
    assert "dev2 at 10.77.203.3" in hc.log_tail(procs["dev2"])
    stopped = hc.stop_all(procs.values(), grace_s=2)
    assert stopped == {"dev1/drafter": False, "dev2/drafter": False}
    assert not any(hc.is_alive(p) for p in procs.values())
