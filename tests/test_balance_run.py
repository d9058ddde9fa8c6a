"""BALANCE as a runner mode: a small sweep of experiments/balance-hybrid.yaml's kind, end to end
on a namespace lab (the cost model profiled on the server host, users replayed there through
admission control and the hybrid loop on the tiny pair, the same workload simulated).

Runs use lab `ibal` on 10.86.2.0/24 (TESTBED_LAB_NAME / TESTBED_LAB_SUBNET); they need root.
"""

from __future__ import annotations

import json
from pathlib import Path

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

LAB, SUBNET = "ibal", "10.86.2.0/24"
BUDGET_MIB = 6.5
PLAYBOOK = {
    "name": "balance-test",
    "mode": "balance",
    "lab": {"kind": "namespaces", "devices": 1},
    "models": {"draft": "tiny", "target": "tiny"},
    "workload": {"kind": "arithmetic", "seed": 7, "max_new_tokens": 32},
    "balance": {
        "users": 14,
        "rate_per_s": 10.0,
        "memory_mib": BUDGET_MIB,
        # deadlines loose enough that admission takes users even when the cost model is
        # profiled on a loaded machine (CI): memory, not time, must be what binds here
        "deadline_base_s": 2.0,
        "deadline_per_token_s": [0.05, 0.1],
    },
    "condition_timeout_s": 90,
    "sweep": {"balance.policy": ["ad-only", "sd-only", "hybrid"]},
}


@pytest.fixture(scope="module")
def balance_run(tmp_path_factory, tiny_pair):
    """One run of three conditions (AD-only, SD-only, hybrid), shared by the checks below."""
    require_root_netns()
    tmp = tmp_path_factory.mktemp("balance")
    playbook = tmp / "balance.yaml"
    playbook.write_text(yaml.safe_dump(PLAYBOOK))
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESTBED_LAB_NAME", LAB)
        mp.setenv("TESTBED_LAB_SUBNET", SUBNET)
        outcome = execute(playbook, out=tmp / "results", say=lines.append)
    assert outcome.store is not None
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
    assert all(e["status"] == "done" for e in entries.values())


def test_the_servers_engines_are_paced_to_its_hardware(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        pacing = pd.read_parquet(outcome.store.condition_dir(e["condition"]) / "pacing.parquet")
        assert set(pacing["role"]) == {"target", "draft"} and pacing["paced"].all()
        assert set(pacing["hardware"]) == {"a100-80gb"}
        assert e["metrics"]["paced_forwards"] == int(pacing["forwards"].sum()) > 0


def test_every_served_user_gets_the_target_greedy_output(balance_run):
    outcome, entries, _ = balance_run
    for entry in entries.values():
        users = users_of(outcome, entry)
        served = users[users["mode"].isin(["AD", "SD"])]
        assert len(served) > 0
        assert served["matches_target"].all(), entry["condition"]
        assert served["completion_s"].notna().all()  # every admitted user finished
        refused = users[users["mode"] == "unserved"]
        assert refused["completion_s"].isna().all() and refused["matches_target"].isna().all()
        assert entry["metrics"]["outputs_equal_target"] == len(served)


def test_policies_use_only_their_modes(balance_run):
    outcome, entries, _ = balance_run
    assert entries["ad-only"]["metrics"]["sd_users"] == 0
    assert entries["sd-only"]["metrics"]["ad_users"] == 0
    for e in entries.values():  # only the hybrid moves a lagging SD user to AD
        moved = users_of(outcome, e)["admission"].str.contains(MOVED_TO_AD).sum()
        assert e["metrics"]["moved_to_ad"] == moved
        assert moved == 0 or e["values"]["balance.policy"] == "hybrid"
    for e in entries.values():
        m = e["metrics"]
        assert m["ad_users"] + m["sd_users"] + m["refused"] == m["users"] == 14


def test_no_policy_serves_more_than_the_users_a_mode_could_serve_alone(balance_run):
    outcome, entries, _ = balance_run
    ceilings = {e["metrics"]["servable_alone"] for e in entries.values()}
    assert len(ceilings) == 1  # the same users and server under every policy
    for e in entries.values():
        m = e["metrics"]
        assert m["served_in_time"] <= m["admitted"] <= m["servable_alone"] <= m["users"]


def test_every_user_carries_the_reason_admission_gave(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        users = users_of(outcome, e)
        served = users["mode"].isin(["AD", "SD"])
        assert users.loc[served, "admission"].str.startswith("admitted").all()
        assert not users.loc[~served, "admission"].str.startswith("admitted").any()
        assert (users.loc[~served, "admission"].str.len() > 10).all()


def test_memory_never_exceeds_the_budget(balance_run):
    _, entries, _ = balance_run
    for e in entries.values():
        m = e["metrics"]
        assert m["memory_budget_mib"] == BUDGET_MIB
        assert m["peak_held_mib"] <= BUDGET_MIB and m["peak_reserved_mib"] <= BUDGET_MIB
        assert m["memory_within_budget"] is True
        assert m["loop_behind_max_ms"] >= 0  # how late the server's periods started
        assert m["steal_ms"] is None or m["steal_ms"] >= 0
    # SD holds both models' weights and caches: its peak is above AD-only's
    assert (
        entries["sd-only"]["metrics"]["peak_held_mib"]
        > entries["ad-only"]["metrics"]["peak_held_mib"]
    )


def test_prediction_is_compared_for_every_user_served_in_both(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        users = users_of(outcome, e)
        both = users.dropna(subset=["completion_s", "predicted_completion_s"])
        assert e["metrics"]["completion_compared_users"] == len(both) > 0
        error = (both["predicted_completion_s"] / both["completion_s"] - 1).abs().mean()
        assert e["metrics"]["completion_error_mean_abs"] == pytest.approx(error)


def test_cost_model_is_stored_with_each_condition(balance_run):
    outcome, entries, lines = balance_run
    costs = [
        read_cost_model(outcome.store.condition_dir(e["condition"]) / "cost-model.json")
        for e in entries.values()
    ]
    assert all(c == costs[0] for c in costs)  # profiled once per run, on the server host
    assert sum("profiling the cost model" in line for line in lines) == 1
    assert costs[0].target.kv_bytes_per_token > costs[0].draft.kv_bytes_per_token


def test_console_and_condition_table_carry_task_throughput(balance_run):
    outcome, entries, lines = balance_run
    assert sum("task throughput" in line for line in lines) == 3
    table = pd.read_parquet(outcome.store.root / "conditions.parquet")
    assert table["task_throughput"].notna().all() and (table["task_throughput"] > 0).all()
    # users in time over the workload's span, which is the same under every policy
    spans = {e["metrics"]["span_s"] for e in entries.values()}
    assert len(spans) == 1
    for e in entries.values():
        m = e["metrics"]
        assert m["task_throughput"] == pytest.approx(m["served_in_time"] / m["span_s"])


def test_lab_is_gone_after_the_run(balance_run):
    assert leftovers(LAB) == []


def test_dry_run_names_the_balance_server(tmp_path):
    playbook = tmp_path / "balance.yaml"
    playbook.write_text(yaml.safe_dump({**PLAYBOOK, "sweep": {}}))
    lines: list[str] = []
    execute(playbook, dry_run=True, say=lines.append)
    text = "\n".join(lines)
    assert "agents.balance.server" in text and "--policy" in text
    assert "agents.balance.measure" in text


def test_bad_deadline_range_names_the_key(tmp_path):
    bad = json.loads(json.dumps(PLAYBOOK))
    bad["balance"]["deadline_per_token_s"] = [0.05, 0.01]
    path = Path(tmp_path / "bad.yaml")
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(BadInputError, match="deadline_per_token_s"):
        load_playbook(path)


def test_report_draws_task_throughput_by_policy(balance_run):
    outcome, _, _ = balance_run
    chart = balance_throughput_by_policy(RunData(outcome.store.root))
    assert isinstance(chart, Chart)
    assert sorted(s.name for s in chart.series) == [
        f"{p}, {BUDGET_MIB:g} MiB" for p in ("ad-only", "hybrid", "sd-only")
    ]
    assert all(s.x == [14.0] and s.y[0] > 0 for s in chart.series)


def test_server_gets_requests_without_their_answers(balance_run):
    outcome, entries, _ = balance_run
    for e in entries.values():
        sent = (outcome.store.condition_dir(e["condition"]) / "inputs" / "users.jsonl").read_text()
        rows = [json.loads(line) for line in sent.splitlines()]
        assert len(rows) == 14 and all("reference" not in r and r["prompt"] for r in rows)


def test_predicted_throughput_is_the_mean_of_the_simulated_draws(balance_run):
    """The stored prediction is re-derived from the stored users and cost model: the mean of
    PREDICTION_DRAWS simulated runs, which differ (drafts accepted at random)."""
    import numpy as np

    from agents.balance.problem import default_service
    from testbed.balance.simulator import simulate
    from testbed.runner.balance import PREDICTION_DRAWS, workload_of

    outcome, entries, _ = balance_run
    play = load_playbook(outcome.store.root / "playbook.yaml")
    entry = entries["sd-only"]
    users = users_of(outcome, entry).sort_values("uid")
    cost = read_cost_model(outcome.store.condition_dir(entry["condition"]) / "cost-model.json")
    b = play.balance
    work = workload_of(users.to_dict("records"))
    service = default_service(cost, b.fixed_share, b.period_s)
    draws = [
        simulate(cost, work, BUDGET_MIB * 2**20, service, "sd-only", seed=play.seed + k)
        for k in range(PREDICTION_DRAWS)
    ]
    m = entry["metrics"]
    assert m["predicted_task_throughput"] == pytest.approx(
        np.mean([d.task_throughput for d in draws])
    )
    assert m["predicted_served_in_time"] == pytest.approx(
        np.mean([d.served_in_time for d in draws])
    )
    assert len({tuple(np.round(d.finish, 6)) for d in draws}) > 1  # the draws differ
    error = m["predicted_task_throughput"] / m["task_throughput"] - 1
    assert m["predicted_task_throughput_error"] == pytest.approx(error)
