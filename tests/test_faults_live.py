"""Faults on a real namespace lab, through `testbed run` as a user runs it: one SLED sweep of
six conditions.

- c00: the verification server is killed by hand (`kill -9`, from outside the testbed) while
  the devices answer; c01: the agent of device dev2 is. Both must be `faulted`, naming the
  agent, the host, SIGKILL and the time, in the terminal table, the journal, the faults table,
  `testbed report`, the dashboard and `testbed compare`; `--resume` leaves them be.
- c02-c04 inject faults from the playbook: the server killed and restarted, dev2's agent killed
  and restarted (a reboot), the server frozen while dev1's link is cut, then its KV pool
  filled. They are recorded as asked for, leave the conditions `done`, and every device comes
  back to verification with its recovery measured; no request is lost or asked twice.
- c05: the link probe's responder on the server is killed by hand while it echoes: a probe the
  runner started ended by itself, so c05 is `faulted` (not `failed`), naming it.

Needs root (namespaces, an sshd per host, iptables inside them): lab `flt` on 10.93.7.0/24.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import require_root_netns

from testbed.labs.clean import leftovers
from testbed.report.dashboard import write_run_page
from testbed.report.data import load_run
from testbed.results.store import RunStore

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
LAB, SUBNET = "flt", "10.93.7.0/24"
pytestmark = [pytest.mark.root, pytest.mark.slow]
PLAYBOOK = """\
name: faults-live
topology: topologies/star.yaml
lab: {kind: namespaces, devices: 2}
models: {draft_as: llama-3.2-1b@q4_0, target_as: llama-3.1-8b@bf16}
workload: {kind: arithmetic, problems_per_device: 8, max_new_tokens: 48}  # work left after restarts
link: {rtt_ms: 20}
impairment: {probe_packets: 30}
condition_timeout_s: 120
sweep:
  faults:
    - []
    - []
    - [{name: server-crash, at_s: 3, action: kill, agent: server, restart_after_s: 2}]
    - [{name: dev2-reboot, at_s: 3, action: kill, agent: device, hosts: [dev2],
        restart_after_s: 2}]
    - [{name: server-stall, at_s: 3, action: freeze, agent: server, duration_s: 2},
       {name: dev1-cut, at_s: 3, action: cut, agent: device, hosts: [dev1], duration_s: 3},
       {name: server-full, at_s: 6, action: fill_kv, agent: server, duration_s: 1.5}]
    - []
"""
OURS = rf".*labs/{LAB}/hosts/.*"  # this lab's agents only, never another run's on the machine
KILLS = {  # condition index -> the agent killed by hand (a pgrep -f pattern)
    0: rf"agents\.sled\.server {OURS}runs/c00-",
    1: rf"agents\.sled\.device --dev dev2 {OURS}runs/c01-",
}
RESPONDER = rf"agents\.link_probe echo .*--tag tb-{LAB}-probe"  # c05's, once c04's devices ran


def env() -> dict[str, str]:
    return {**os.environ, "TESTBED_LAB_NAME": LAB, "TESTBED_LAB_SUBNET": SUBNET}


def pids(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_by_hand(stop: threading.Event, killed: dict[int, float]) -> None:
    """As a crash would: once condition c0N's devices have answered for 3 s, `kill -9` the
    agent (the Python process, not the runner's wrapper shell)."""
    for index, pattern in KILLS.items():
        devices = rf"agents\.sled\.device {OURS}runs/c0{index}-"
        while not stop.is_set() and not pids(devices):
            time.sleep(0.1)
        stop.wait(3.0)
        for pid in pids(pattern):
            argv = Path(f"/proc/{pid}/cmdline").read_text(errors="replace").split("\0")
            if re.search("python", argv[0]):  # the agent, not its wrapper shell
                os.kill(pid, 9)
                killed[index] = time.time()
    while not stop.is_set() and not pids(rf"agents\.sled\.device {OURS}runs/c04-"):
        time.sleep(0.1)
    while not stop.is_set() and 5 not in killed:
        for pid in pids(RESPONDER):
            os.kill(pid, 9)
            killed[5] = time.time()
        time.sleep(0.02)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_pair):
    require_root_netns()
    tmp = tmp_path_factory.mktemp("faults")
    playbook = tmp / "faults-live.yaml"
    playbook.write_text(PLAYBOOK)
    stop, killed = threading.Event(), {}
    killer = threading.Thread(target=kill_by_hand, args=(stop, killed), daemon=True)
    killer.start()
    try:
        done = subprocess.run([*TESTBED, "run", str(playbook), "--out", str(tmp / "results")],
                              capture_output=True, text=True, cwd=REPO, env=env(),
                              timeout=1500)  # fmt: skip
    finally:
        stop.set()
    (folder,) = (tmp / "results").iterdir()
    return {"cli": done, "root": folder, "killed": killed, "tmp": tmp}


def journal(run) -> list[dict]:
    return RunStore(run["root"]).journal()


def test_killed_agents_make_their_conditions_faulted_everywhere(run):
    cli = run["cli"]
    assert sorted(run["killed"]) == [0, 1, 5], (run["killed"], cli.stdout[-3000:], cli.stderr)
    assert cli.returncode == 6, cli.stdout[-3000:]  # a faulted condition: not a clean run
    status = [e["status"] for e in journal(run)]
    assert status == ["faulted", "faulted", "done", "done", "done", "faulted"], (
        status, cli.stdout[-4000:])  # fmt: skip
    named = {0: ("sled-server on server", "SIGKILL"), 1: ("sled-device on dev2", "SIGKILL")}
    for e in journal(run)[:2]:
        (crash,) = [f for f in e["faults"] if not f["injected"]]
        host_agent, sig = named[e["index"]]
        assert crash["reason"].startswith(host_agent) and crash["signal"] == sig, crash
        assert crash["exit_status"] == 137 and crash["t_condition_s"] > 0, crash
        # the time of death is the kill's (the exit-status file's time), not when it was seen
        assert abs(crash["t"] - run["killed"][e["index"]]) < 1.0, crash
        assert crash["log_tail"] is not None
        assert e["reason"] == crash["reason"]
        assert e["metrics"]["system_tok_s"] is not None  # its figures are kept, shown as such
    flat = " ".join(cli.stdout.split())
    assert "faulted" in flat and "c00-faults=none" in flat and "killed by SIGKILL" in flat, flat
    faults = pd.read_parquet(run["root"] / "conditions" / journal(run)[0]["condition"]
                             / "faults.parquet")  # fmt: skip
    assert list(faults["agent"]) == ["sled-server"] and faults["signal"].tolist() == ["SIGKILL"]


def test_report_and_dashboard_name_the_fault(run):
    root = run["root"]
    report = subprocess.run([*TESTBED, "report", str(root)], capture_output=True, text=True,
                            cwd=REPO, env=env())  # fmt: skip
    assert report.returncode == 0, report.stderr
    text = (root / "report" / "report.md").read_text() if (root / "report").exists() else ""
    text = text or next(root.rglob("report.md")).read_text()
    assert "3 done, 3 faulted, 0 failed" in text and "sled-device on dev2 killed by SIGKILL" in text
    page = Path(write_run_page(load_run(root))).read_text()
    assert "3 faulted" in page and "sled-server on server killed by SIGKILL" in page


def test_resume_leaves_faulted_conditions_be(run):
    again = subprocess.run([*TESTBED, "run", "--resume", str(run["root"])], capture_output=True,
                           text=True, cwd=REPO, env=env(), timeout=300)  # fmt: skip
    assert "0 to run" in again.stdout, again.stdout
    assert len(journal(run)) == 6


def test_a_probe_that_ended_by_itself_makes_its_condition_faulted(run):
    probed = journal(run)[5]
    crashes = probed["faults"]  # the responder of one device's probe, or of both (in parallel)
    assert 1 <= len(crashes) <= 2, crashes
    for crash in crashes:
        assert crash["agent"] == "link-probe-responder" and crash["host"] == "server", crash
        assert crash["signal"] == "SIGKILL" and crash["exit_status"] == 137, crash
        assert not crash["injected"], crash
    assert probed["reason"] == "; ".join(c["reason"] for c in crashes), probed
    assert "link-probe-responder on server killed by SIGKILL (exit 137)" in " ".join(
        run["cli"].stdout.split())  # fmt: skip


def test_injected_faults_are_recorded_and_every_device_comes_back(run):
    for e in journal(run)[2:5]:
        m, faults = e["metrics"], e["faults"]
        assert e["status"] == "done" and faults and all(f["injected"] for f in faults), e
        for f in faults:
            assert f["back_t"] is not None, f  # restarted, thawed or reconnected
            assert f["recovery_s"] is not None and f["recovery_s"] >= 0, f
        assert m["recovered_all"] is True, m
        assert m["requests_lost"] == 0 and m["requests_duplicated"] == 0, m
        assert m["verified_answers_match_target"] is True, m
        assert m["recovery_unverified_tokens"] >= 0
    actions = [f["action"] for e in journal(run)[2:5] for f in e["faults"]]
    assert actions == ["kill", "kill", "freeze", "cut", "fill_kv"]
    stalled = run["root"] / "conditions" / journal(run)[4]["condition"] / "hosts" / "server"
    refused = [json.loads(x) for x in (stalled / "refusals.jsonl").read_text().splitlines()]
    assert any(r["reason"] == "kv_pool_full" and r["count"] > 0 for r in refused), refused
    reboot = journal(run)[3]
    logs = {p.name for p in (run["root"] / "conditions" / reboot["condition"] / "hosts"
                             / "dev2").glob("*.log")}  # fmt: skip
    assert {"sled-device.log", "sled-device-r1.log"} <= logs, logs


def test_the_lab_is_left_clean(run):
    assert leftovers(LAB) == []
