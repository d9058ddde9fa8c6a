"""BALANCE as a runner mode, end to end on a namespace lab: users on two devices send their
requests over their links to the BALANCE server, which stands for an A100 40 GB holding
Llama-3.1-8B and Llama-3.2-1B (paced; the tiny pair computes the tokens); the cost model is
measured on the server host as its engines run, the same users are simulated over the same
link.

Runs use lab `ibal` on 10.86.2.0/24 (TESTBED_LAB_NAME / TESTBED_LAB_SUBNET); they need root.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import require_root_netns

from agents.balance.rescue import MOVED_TO_AD
from testbed.balance.cost_file import read_cost_model
from testbed.config.playbook import load_playbook
from testbed.core.errors import BadInputError
from testbed.labs.clean import leftovers
from testbed.report.charts import Chart
from testbed.report.data import RunData
from testbed.report.figures import balance_throughput_by_policy
from testbed.runner.run import execute
from testbed.topo.catalogue import load_catalogue

LAB, SUBNET = "ibal", "10.86.2.0/24"
REPO = Path(__file__).resolve().parents[1]
BUDGET_GB = 18.65  # the 8B's 16.06 GB, the 1B's 2.47 GB, and caches for a few SD users
USERS = 14
PLAYBOOK = {
    "name": "balance-test",
    "mode": "balance",
    "topology": str(REPO / "topologies" / "balance-edge.yaml"),
    "lab": {"kind": "namespaces", "devices": 2},
    "models": {
        "draft": "tiny",
        "target": "tiny",
        "draft_as": "llama-3.2-1b@bf16",
        "target_as": "llama-3.1-8b@bf16",
    },  # fmt: skip
    "workload": {"kind": "arithmetic", "seed": 7, "max_new_tokens": 32},
    "link_profile": "wifi",
    "balance": {
        "users": USERS,
        "rate_per_s": 10.0,
        "memory_gb": BUDGET_GB,
        "deadline_base_s": 0.2,
        "deadline_per_token_s": [0.025, 0.12],
        "fixed_share": 0.3,
        "profile_repeats": 5,
    },
    "condition_timeout_s": 90,
    "sweep": {"balance.policy": ["ad-only", "sd-only", "hybrid"]},
}


def _run(tmp: Path, playbook: dict, say=None) -> tuple:
    path = tmp / "balance.yaml"
    path.write_text(yaml.safe_dump(playbook))
    lines: list[str] = []

    def hear(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESTBED_LAB_NAME", LAB)
        mp.setenv("TESTBED_LAB_SUBNET", SUBNET)
        outcome = execute(path, out=tmp / "results", say=hear)
    assert outcome.store is not None
    return outcome, lines


@pytest.fixture(scope="module")
def balance_run(tmp_path_factory, tiny_pair):
    """One run of three conditions (AD-only, SD-only, hybrid), shared by the checks below."""
    require_root_netns()
    outcome, lines = _run(tmp_path_factory.mktemp("balance"), PLAYBOOK)
    entries = {e["values"]["balance.policy"]: e for e in outcome.store.journal()}
    return outcome, entries, lines


def users_of(outcome, entry) -> pd.DataFrame:
    return pd.read_parquet(
        outcome.store.condition_dir(entry["condition"]) / "balance_users.parquet"
    )


def test_every_condition_is_done(balance_run):
    outcome, entries, _ = balance_run
    assert outcome.done == 3 and outcome.failed == 0
    assert set(entries) == {"ad-only", "sd-only", "hybrid"}


def test_the_servers_engines_are_paced_to_its_hardware(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        pacing = pd.read_parquet(outcome.store.condition_dir(e["condition"]) / "pacing.parquet")
        assert set(pacing["role"]) == {"target", "draft"} and pacing["paced"].all()
        assert set(pacing["hardware"]) == {"a100-40gb"}
        assert e["metrics"]["paced_forwards"] == int(pacing["forwards"].sum()) > 0


def test_users_come_from_the_devices_over_their_links(balance_run):
    """Each user is on device uid mod 2 and has that device's record; the server learned the
    link from the devices' own measurements (the 20 ms Wi-Fi RTT), not from the controller."""
    outcome, entries, _ = balance_run
    for e in entries.values():
        users = users_of(outcome, e)
        assert len(users) == USERS
        assert (users["dev"] == [f"dev{u % 2 + 1}" for u in users["uid"]]).all()
        assert (users["outcome"] != "no record").all()
        asked = users.dropna(subset=["told_srtt_ms"])
        assert len(asked) == USERS  # every request reached the server
        assert 19 <= asked["told_srtt_ms"].median() < 60  # the 20 ms link, as the devices saw it
        requests = outcome.store.condition_dir(e["condition"]) / "hosts" / "dev1"
        assert (requests / "balance_requests.jsonl").is_file()


def test_every_finished_user_gets_the_large_models_greedy_output(balance_run):
    outcome, entries, _ = balance_run
    for entry in entries.values():
        users = users_of(outcome, entry)
        done = users[users["outcome"] == "done"]
        assert len(done) > 0
        assert done["matches_target"].all(), entry["condition"]
        assert done["completion_s"].notna().all() and done["ttft_s"].notna().all()
        refused = users[users["outcome"] == "refused"]
        assert refused["completion_s"].isna().all() and refused["matches_target"].isna().all()
        assert entry["metrics"]["outputs_equal_target"] == len(done)
    # the greedy output, computed once on the server host by the target its server loads
    manifest = outcome.store.manifest()
    (where,) = manifest["reference"]
    assert (where["host"], where["model"]) == ("server", manifest["models"]["target"])
    book = json.loads(outcome.store.reference_answers.read_text())
    assert [c["problems"] for c in book["computed"]] == [USERS]
    users = users_of(outcome, entries["hybrid"])
    for _, u in users.iterrows():  # each user asks for its reference's length
        answer = book["answers"][f"{u['problem']}@32"]
        assert u["output_tokens"] == len(answer["tokens"])
        assert u["prompt_tokens"] == len(answer["prompt_tokens"])


def test_every_user_is_accounted_for(balance_run):
    _, entries, _ = balance_run
    for e in entries.values():
        m = e["metrics"]
        assert m["done"] + m["refused"] + m["rejected"] + m["unanswered"] == m["users"] == USERS
        assert m["served_in_time"] + m["late"] == m["done"]


def test_policies_use_only_their_modes(balance_run):
    outcome, entries, _ = balance_run
    assert entries["ad-only"]["metrics"]["sd_users"] == 0
    assert entries["sd-only"]["metrics"]["ad_users"] == 0
    for e in entries.values():  # only the hybrid moves a lagging SD user to AD
        moved = users_of(outcome, e)["admission"].fillna("").str.contains(MOVED_TO_AD).sum()
        assert moved == 0 or e["values"]["balance.policy"] == "hybrid"


def test_no_policy_serves_more_in_time_than_a_mode_could_alone(balance_run):
    _, entries, _ = balance_run
    ceilings = {e["metrics"]["servable_alone"] for e in entries.values()}
    assert len(ceilings) == 1  # the same users, server and link under every policy
    for e in entries.values():
        m = e["metrics"]
        assert m["served_in_time"] <= m["servable_alone"] <= m["users"]


def test_memory_is_in_the_catalogue_models_bytes_and_within_the_budget(balance_run):
    outcome, entries, _ = balance_run
    cat = load_catalogue()
    big, small = cat.model("llama-3.1-8b@bf16", "t"), cat.model("llama-3.2-1b@bf16", "t")
    for e in entries.values():
        m = e["metrics"]
        assert m["memory_budget_gb"] == BUDGET_GB and m["memory_within_budget"] is True
        assert m["peak_held_gb"] <= BUDGET_GB and m["peak_reserved_gb"] <= BUDGET_GB
        assert m["peak_held_gb"] >= big.weight_bytes / 1e9
    # SD holds the small model's weights and both caches: above AD-only's peak by the weights
    sd, ad = entries["sd-only"]["metrics"], entries["ad-only"]["metrics"]
    assert sd["peak_held_gb"] - ad["peak_held_gb"] >= small.weight_bytes / 1e9
    cost = read_cost_model(outcome.store.condition_dir(entries["ad-only"]["condition"])
                           / "cost-model.json")  # fmt: skip
    assert cost.target.weights_bytes == int(big.weight_bytes)
    assert cost.target.kv_bytes_per_token == int(big.kv_bytes_per_token)
    assert cost.logits_row_bytes == big.vocab * 4


def test_latency_percentiles_are_the_devices(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        users, m = users_of(outcome, e), e["metrics"]
        done = users[users["outcome"] == "done"]
        assert m["ttft_p50_ms"] == pytest.approx(np.percentile(done["ttft_s"], 50) * 1000)
        assert m["tpot_p90_ms"] == pytest.approx(np.percentile(done["tpot_s"].dropna(), 90) * 1000)
        assert m["ttft_p50_ms"] >= 20  # the link's round trip is inside it
        assert (done["completion_s"] >= done["ttft_s"]).all()


def test_prediction_is_re_derived_from_the_stored_users_and_cost_model(balance_run):
    from testbed.runner.balance import predictions

    outcome, entries, _ = balance_run
    play = load_playbook(outcome.store.root / "playbook.yaml")
    entry = entries["sd-only"]
    cond_dir = outcome.store.condition_dir(entry["condition"])
    users = users_of(outcome, entry).sort_values("uid")
    cost = read_cost_model(cond_dir / "cost-model.json")
    sent = {}
    for dev in ("dev1", "dev2"):
        for line in (cond_dir / "inputs" / f"{dev}.users.jsonl").read_text().splitlines():
            row = json.loads(line)
            sent[row["uid"]] = row
    rows = [{**sent[u], "dev": d} for u, d in zip(users["uid"], users["dev"], strict=True)]
    pb = play.model_copy(update={"balance": play.balance.model_copy(update={"policy": "sd-only"})})
    drawn = predictions(cost, rows, pb)
    m = entry["metrics"]
    assert m["predicted_served_in_time"] == pytest.approx(
        np.mean([o.met(r.finish).sum() for o, r in drawn])
    )
    assert len({tuple(np.round(r.finish, 6)) for _, r in drawn}) > 1  # the draws differ


def test_cost_model_is_measured_once_per_run(balance_run):
    outcome, entries, lines = balance_run
    costs = [
        read_cost_model(outcome.store.condition_dir(e["condition"]) / "cost-model.json")
        for e in entries.values()
    ]
    assert all(c == costs[0] for c in costs)
    assert sum("profiling the cost model" in line for line in lines) == 1


def test_console_report_and_dashboard_carry_the_policy_comparison(balance_run, tmp_path):
    outcome, entries, lines = balance_run
    assert sum("in time (simulated" in line for line in lines) == 3
    table = pd.read_parquet(outcome.store.root / "conditions.parquet")
    assert table["task_throughput"].notna().all()
    chart = balance_throughput_by_policy(RunData(outcome.store.root))
    assert isinstance(chart, Chart)
    assert sorted(s.name for s in chart.series) == [
        f"{p}, {BUDGET_GB:g} GB" for p in ("ad-only", "hybrid", "sd-only")
    ]
    from testbed.report.dashboard import write_run_page

    page = write_run_page(RunData(outcome.store.root)).read_text()
    assert "the hybrid against the better single mode" in page and "TTFT p90" in page
    assert "peak GB" in page


def test_lab_is_gone_after_the_run(balance_run):
    assert leftovers(LAB) == []


def _cut_link(lines: list[str], device: str, after_s: float, for_s: float) -> threading.Thread:
    """A thread that, `after_s` after the runner says its clients start, cuts `device`'s link
    (every datagram lost both ways) on the run's lab for `for_s` seconds, then gives it back
    its 20 ms (the link API `testbed lab impair` uses)."""
    from testbed.labs import EmulatedLab
    from testbed.links.api import apply
    from testbed.topo.profile import LinkProfile

    def cut() -> None:
        while not any("the clients send from" in line for line in lines):
            time.sleep(0.01)
        time.sleep(after_s)
        lab = EmulatedLab.find(LAB, None)
        apply(lab, LinkProfile(rtt_ms=20, loss=1.0), [device])
        time.sleep(for_s)
        apply(lab, LinkProfile(rtt_ms=20), [device])

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def test_users_of_a_device_cut_off_for_a_while_are_refused_or_late_never_lost(tmp_path, tiny_pair):
    """dev1's link loses everything for 2.5 s while its users send: each of them is retried
    until the link heals, then refused (what is left of its deadline is too short) or served
    late, as the scheduler decides; every one has a record saying so."""
    require_root_netns()
    from testbed.runner.balance import CLIENT_LEAD_S

    pb = json.loads(json.dumps(PLAYBOOK))
    pb["sweep"] = {"balance.policy": ["hybrid"]}
    lines: list[str] = []
    cutter = _cut_link(lines, "dev1", CLIENT_LEAD_S + 0.2, 2.5)
    outcome, _ = _run(tmp_path, pb, say=lines.append)
    cutter.join(timeout=30)
    (entry,) = outcome.store.journal()
    assert entry["status"] == "done", entry.get("reason")
    users = users_of(outcome, entry)
    assert (users["outcome"] != "no record").all()
    cut_off = users[(users["dev"] == "dev1") & (users["send_s"] > 0.3)
                    & (users["send_s"] < 2.4)]  # fmt: skip
    assert len(cut_off) >= 2
    assert (cut_off["attempts"] > 1).all()  # retried through the outage
    assert (cut_off["outcome"].isin(["refused", "done"])).all()
    # the link heals no earlier than 2.7 s: a user whose deadline ends before could not make it
    doomed = cut_off[cut_off["send_s"] + cut_off["deadline_s"] < 0.2 + 2.5]
    assert len(doomed) >= 1 and not doomed["met"].any(), cut_off
    refused = cut_off[cut_off["outcome"] == "refused"]
    assert refused["admission"].str.len().gt(10).all()  # with admission's reason
    dev2 = users[users["dev"] == "dev2"]
    assert (dev2["attempts"] == 1).all()  # the other device's link was never cut
    assert leftovers(LAB) == []


def test_dry_run_names_the_server_and_the_clients(tmp_path):
    playbook = tmp_path / "balance.yaml"
    playbook.write_text(yaml.safe_dump({**PLAYBOOK, "sweep": {}}))
    lines: list[str] = []
    execute(playbook, dry_run=True, say=lines.append)
    text = "\n".join(lines)
    assert "agents.balance.server" in text and "--policy" in text
    assert "agents.balance.client" in text and "--start-at" in text
    assert "agents.balance.measure" in text
    assert "start reference:" in text and "-m agents.reference" in text  # on the server host


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"balance": {"memory_gb": 12.0}}, "balance.memory_gb: 12 GB cannot hold"),
        ({"balance": {"memory_gb": 41.0}}, "balance.memory_gb: 41 GB is more than"),
        ({"link_profile": "lte"}, "link_profile: 'lte' is not one of"),
        ({"balance": {"deadline_per_token_s": [0.05, 0.01]}}, "deadline_per_token_s"),
    ],
)
def test_bad_input_names_the_key(tmp_path, change, key):
    bad = json.loads(json.dumps({**PLAYBOOK, "sweep": {}}))
    for section, value in change.items():
        if isinstance(value, dict):
            bad[section].update(value)
        else:
            bad[section] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(BadInputError, match=key):
        execute(path, dry_run=True, say=lambda _: None)


def test_an_unknown_server_gpu_names_the_key(tmp_path):
    topo = yaml.safe_load((REPO / "topologies" / "balance-edge.yaml").read_text())
    topo["server"]["class"] = "l40s"
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topo))
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**PLAYBOOK, "topology": str(tmp_path / "topo.yaml")}))
    with pytest.raises(BadInputError, match="server.class: unknown host class 'l40s'"):
        load_playbook(path)
