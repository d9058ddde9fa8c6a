"""Faults, without a lab: the playbook's `faults` checked at `testbed validate` (file and key
named), exit statuses read as signals, a faulted condition shown and resumed as such, and the
recovery figures computed from rounds and requests."""

from __future__ import annotations

import json
import subprocess
import time

import pandas as pd
import pytest
from typer.testing import CliRunner

from testbed.cli import app
from testbed.config.playbook import condition_id, shown_value
from testbed.core.errors import AgentEnded, LabError, shell_status
from testbed.core.fanout import fan_out, raise_failures
from testbed.metrics.clocks import ClockOffset
from testbed.metrics.recovery import fault_recovery, recovery_figures, request_figures
from testbed.metrics.schemas import FaultRecord
from testbed.results.condition_table import condition_frame, flatten
from testbed.results.marks import status_counts
from testbed.results.store import RunStore
from testbed.runner.watch import agents_ended, ended_fault, exit_reason, fault_fields

BASE = "name: f\ntopology: topologies/star.yaml\ncondition_timeout_s: 60\n"


@pytest.mark.parametrize(
    ("faults", "needle"),
    [
        ("[{name: a, at_s: 1, action: kill, agent: device, hosts: [dev9]}]",
         "faults[0] (a).hosts: dev9 not a device of the condition (dev1, dev2)"),
        ("[{name: a, at_s: 55, action: kill, restart_after_s: 10}]",
         "faults[0] (a).at_s: 55 s (+ 10 s) is past the condition's end"),
        ("[{name: a, at_s: 1, action: kill, restart_after_s: -2}]", "restart_after_s"),
        ("[{name: a, at_s: -1, action: freeze, duration_s: 1}]", "at_s"),
        ("[{name: a, at_s: 1, action: freeze}]", "duration_s: action freeze needs"),
        ("[{name: a, at_s: 1, action: kill, signal: BOGUS}]", "signal: 'BOGUS' is not"),
        ("[{name: a, at_s: 1, action: kill, agent: gpu}]", "agent"),
        ("[{name: a, at_s: 1, action: kill, agent: device}]", "give hosts"),
        ("[{name: a, at_s: 1, action: fill_kv}]", "duration_s: action fill_kv needs"),
        ("[{name: a, at_s: 1, action: fill_kv, agent: device, hosts: [dev1], duration_s: 1}]",
         "fill_kv fills the server's KV pool"),
        ("[{name: a, at_s: 1, action: kill}, {name: a, at_s: 2, action: kill}]",
         "names must differ"),
    ],
)  # fmt: skip
def test_bad_fault_specs_name_file_and_key_at_validate(tmp_path, faults, needle):
    path = tmp_path / "bad-faults.yaml"
    path.write_text(BASE + f"faults: {faults}\n")
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "bad-faults.yaml" in flat and needle in flat, flat


def test_good_fault_specs_validate_and_sweep_under_their_names(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(
        BASE + "sweep:\n  faults:\n    - []\n"
        "    - [{name: crash, at_s: 2, action: kill, restart_after_s: 1}]\n"
        "    - [{name: cut, at_s: 2, action: cut, agent: device, share: 0.5, duration_s: 3},\n"
        "       {name: stall, at_s: 8, action: freeze, duration_s: 1}]\n"
        "    - [{name: full, at_s: 2, action: fill_kv, duration_s: 3}]\n"
    )
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 0 and "4 conditions" in result.output, result.output
    values = [{"name": "cut"}, {"name": "stall"}]
    assert shown_value(values) == "cut+stall" and shown_value([]) == "none"
    assert condition_id(2, {"faults": values}).startswith("c02-faults=cut_stall-")


def test_exit_statuses_read_as_signals():
    assert exit_reason(137) == ("killed by SIGKILL (exit 137)", "SIGKILL")
    assert exit_reason(143)[1] == "SIGTERM"
    assert exit_reason(3) == ("exited with status 3", None)
    assert exit_reason(None)[1] is None and "no exit status" in exit_reason(None)[0]


def fault(**kw) -> FaultRecord:
    base = dict(condition="c00", host="server", agent="sled-server", reason="r", t=100.0,
                t_condition_s=5.0)  # fmt: skip
    return FaultRecord(**(base | kw))  # type: ignore[arg-type]


def entry(cid: str, index: int, status: str, faults: list[FaultRecord]) -> dict:
    return {"condition": cid, "index": index, "status": status, "values": {"i": index},
            "metrics": {"system_verified_tok_s": 1.0}, **fault_fields(faults)}  # fmt: skip


def test_a_faulted_condition_is_counted_named_and_resumed_only_when_asked(tmp_path):
    crash = fault(reason="sled-server on server killed by SIGKILL (exit 137) at 5.0 s",
                  exit_status=137, signal="SIGKILL")  # fmt: skip
    asked = fault(injected=True, action="kill", reason="crash: asked")
    store = RunStore(tmp_path / "run")
    store.create({"conditions": ["c00", "c01", "c02"]})
    for e in (entry("c00", 0, "faulted", [crash]), entry("c01", 1, "done", [asked]),
              entry("c02", 2, "failed", [])):  # fmt: skip
        (store.root / "conditions" / e["condition"]).mkdir(parents=True)
        store.commit(e["condition"], store.staging(e["condition"]), e)
    rows = condition_frame(store)
    assert list(rows["faults"]) == [1, 0, 0] and list(rows["faults_injected"]) == [0, 1, 0]
    assert rows.loc[0, "reason"] == crash.reason  # the unasked fault named; the asked one not
    assert rows.loc[1, "reason"] == ""
    assert status_counts(rows) == "1 done, 1 faulted, 1 failed"
    assert store.finished() == {"c00", "c01", "c02"}
    assert store.finished(rerun_faulted=True) == {"c01", "c02"}
    assert store.finished(retry_failed=True, rerun_faulted=True) == {"c01"}
    assert flatten(entry("c09", 9, "done", []))["faults"] == 0


def rounds_frame(rows: list[tuple[str, float, str, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"dev": d, "t_end": t, "mode": m, "tokens": n} for d, t, m, n in rows])


def test_recovery_is_the_last_device_back_to_verification():
    """Server back at 110: dev1 verifies at 110.5, dev2 at 112; dev3 had finished by 108."""
    rounds = rounds_frame([
        ("dev1", 104, "verified", 4), ("dev1", 106, "fallback", 3), ("dev1", 110.5, "verified", 4),
        ("dev2", 107, "fallback", 2), ("dev2", 111, "fallback", 5), ("dev2", 112, "verified", 4),
        ("dev3", 108, "fallback", 9),
    ])  # fmt: skip
    got = fault_recovery(fault(t=105.0, back_t=110.0, injected=True), rounds,
                         {}, lambda t: t)  # fmt: skip
    assert got.recovery_s == pytest.approx(2.0)
    assert got.unverified_tokens == 3 + 2 + 5 + 9
    # a device fault counts its own device only, its clock's offset taken off (1 s behind)
    mine = fault_recovery(fault(host="dev1", t=105.0, back_t=110.0, injected=True), rounds,
                          {"dev1": ClockOffset(-1.0, 0.0)}, lambda t: t)  # fmt: skip
    assert mine.recovery_s == pytest.approx(1.5) and mine.unverified_tokens == 3


def test_a_device_that_never_verifies_again_has_no_recovery():
    rounds = rounds_frame([("dev1", 104, "verified", 4), ("dev1", 112, "fallback", 4)])
    got = fault_recovery(fault(t=105.0, back_t=110.0, injected=True), rounds, {}, lambda t: t)
    assert got.recovery_s is None
    assert recovery_figures([got]) == {"recovery_s_max": None, "recovery_unverified_tokens": 0,
                                       "recovered_all": False}  # fmt: skip


def test_requests_lost_and_duplicated_are_counted():
    requests = pd.DataFrame(
        [{"dev": "dev1", "problem": "p1", "fallback_tokens": 0, "matches_target": True},
         {"dev": "dev1", "problem": "p1", "fallback_tokens": 2, "matches_target": False},
         {"dev": "dev2", "problem": "p3", "fallback_tokens": 0, "matches_target": True}]
    )  # fmt: skip
    got = request_figures({"dev1": ["p1", "p2"], "dev2": ["p3"]}, requests)
    assert got == {"requests_lost": 1, "requests_duplicated": 1,
                   "verified_answers_match_target": True}  # fmt: skip
    requests.loc[2, "matches_target"] = False
    assert request_figures({}, requests)["verified_answers_match_target"] is False


def test_fault_fields_keep_every_fault_in_the_journal():
    fields = fault_fields([fault(), fault(injected=True, action="freeze")])
    assert [f["injected"] for f in fields["faults"]] == [False, True]  # type: ignore[index]
    assert json.loads(json.dumps(fields))["reason"] == "r"


def test_an_agent_that_ended_by_itself_is_found_behind_a_fanned_out_failure():
    """A probe's responder killed on one device's link: the fan-out's GroupError, raised in
    turn from another error, still names it, and it becomes a fault naming host and signal."""
    proc = subprocess.Popen(["sleep", "30"])
    proc.kill()
    proc.wait()
    status = shell_status(proc.returncode)
    assert status == 137

    def probe(dev: str) -> str:
        if dev == "dev2":
            raise AgentEnded("responder died", "server", "link-probe-responder", status, "x")
        return dev

    try:
        try:
            raise_failures("probing the links", fan_out(probe, ["dev1", "dev2"], key=str))
        except Exception as exc:
            raise LabError("the condition's links") from exc
    except LabError as outer:
        (ended,) = agents_ended(outer)
    fault = ended_fault("c05", ended, started=time.time() - 4.0, dilation=2.0)
    assert fault.agent == "link-probe-responder" and fault.host == "server"
    assert fault.signal == "SIGKILL" and fault.exit_status == 137 and not fault.injected
    assert fault.reason.startswith(
        "link-probe-responder on server killed by SIGKILL (exit 137) at 2.")  # fmt: skip
    assert agents_ended(LabError("no agent in it")) == []
