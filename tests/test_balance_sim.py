"""The BALANCE engine loop and simulator, driven by a fixed cost model (no torch)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agents.balance.admission import AdmissionController
from agents.balance.costmodel import CostModel, LoopStep, ModelCost, StepCost
from agents.balance.loop import HybridLoop
from agents.balance.modes import AD, SD, UNSERVED
from agents.balance.problem import (
    Users,
    default_service,
    make_instance,
    servable_alone,
    timing_of,
    user_demands,
)
from agents.balance.rescue import move_lagging_sd_users
from agents.balance.serve import Workload, workload_span_s
from testbed.balance.cost_file import read_cost_model
from testbed.balance.simulator import SimulatedExecutor, random_workload, simulate
from testbed.core.errors import BadInputError

COST = CostModel(
    target=ModelCost(weights_bytes=5_000_000, kv_bytes_per_token=3072, prefill_per_token_s=0.00017),
    draft=ModelCost(weights_bytes=430_000, kv_bytes_per_token=512, prefill_per_token_s=0.00004),
    ad_step=LoopStep(
        busy=StepCost(fixed_s=0.002, per_seq_s=0.0004),
        after_idle=StepCost(fixed_s=0.0025, per_seq_s=0.0004),
    ),
    sd_round=LoopStep(
        busy=StepCost(fixed_s=0.0076, per_seq_s=0.00098),
        after_idle=StepCost(fixed_s=0.0086, per_seq_s=0.00098),
    ),
    draft_len=4,
    acceptance=0.85,
    round_tokens=[0.15, 0.11, 0.09, 0.08, 0.57],
    logits_row_bytes=1_700,
)
SERVICE = default_service(COST)


def test_cost_model_round_trips_through_its_json(tmp_path):
    path = tmp_path / "cost.json"
    COST.save(path)
    assert read_cost_model(path) == COST


def test_sd_rounds_yield_tokens_as_the_profile_measured_them():
    rng = np.random.default_rng(0)
    users = Users(np.full(4000, 8), np.full(4000, 10_000), np.full(4000, 1e9))
    ex = SimulatedExecutor(COST, users, rng)
    for u in range(4000):
        ex.start(u, SD)
    got, _ = ex.step(SD, list(range(4000)))
    counts = np.bincount(list(got.values()), minlength=COST.draft_len + 2)[1:]
    assert counts.sum() == 4000  # every draw is 1..g+1 tokens
    assert counts / 4000 == pytest.approx(COST.round_tokens, abs=0.025)
    assert np.mean(list(got.values())) == pytest.approx(COST.tokens_per_round, rel=0.03)


def test_the_first_step_after_the_loop_waited_costs_the_after_idle_time():
    users = Users(np.full(3, 8), np.full(3, 10_000), np.full(3, 1e9))
    ex = SimulatedExecutor(COST, users, np.random.default_rng(0))
    for u in range(3):
        ex.start(u, AD)
    ex.wait_until(ex.clock() + 0.01)
    t0 = ex.clock()
    ex.step(AD, [0, 1, 2])
    t1 = ex.clock()
    ex.step(AD, [0, 1, 2])
    assert t1 - t0 == pytest.approx(COST.ad_step.after_idle.time(3))
    assert ex.clock() - t1 == pytest.approx(COST.ad_step.busy.time(3))
    assert COST.ad_step.after_idle.time(3) > COST.ad_step.busy.time(3)


@pytest.mark.parametrize(
    "round_tokens", [[0.5, 0.5], [0.2, 0.2, 0.2, 0.2, 0.1], [1.2, -0.2, 0.0, 0.0, 0.0]]
)
def test_a_profile_whose_round_tokens_are_no_distribution_is_refused(tmp_path, round_tokens):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**COST.as_dict(), "round_tokens": round_tokens}))
    with pytest.raises(BadInputError, match=r"cost\.json.*round_tokens: expected 5 probabilities"):
        read_cost_model(path)


def test_a_profile_of_arbitrary_bytes_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cost.json"
    path.write_bytes(b"\xff\xfe{\x00")
    with pytest.raises(BadInputError, match=r"cost\.json: not valid JSON"):
        read_cost_model(path)


def test_a_user_moved_between_modes_gets_exactly_its_tokens_and_one_prefill():
    users = Users(np.array([20]), np.array([30]), np.array([100.0]))
    ex = SimulatedExecutor(COST, users, np.random.default_rng(1))
    loop = HybridLoop(ex, {AD: 200.0, SD: 100.0}, period_s=0.05)
    loop.add(0, AD, pace=1000.0)
    loop.run_period()
    before = loop.members[0].delivered
    assert 0 < before < 30
    loop.move(0, SD)
    finished = {}
    while not finished:
        finished = loop.run_period()
    assert loop.steps[SD] > 0 and 0 not in loop.members
    assert 0 not in ex.left  # stopped; prefill ran once (start() only on a new user)


def test_work_at_the_top_of_a_period_counts_inside_it():
    users = Users(np.array([20]), np.array([30]), np.array([100.0]))
    ex = SimulatedExecutor(COST, users, np.random.default_rng(1))
    loop = HybridLoop(ex, {AD: 200.0, SD: 100.0}, period_s=0.05)
    loop.add(0, AD, pace=10.0)
    ex.wait_until(1.0)
    top = ex.clock()
    ex.wait_until(1.02)  # 20 ms of admission and planning
    loop.run_period(top)
    assert ex.clock() == pytest.approx(1.05)  # the next period starts on time
    assert loop.most_behind_s == 0.0
    ex.wait_until(1.07)
    loop.run_period()  # not told when it began: the period starts now
    assert ex.clock() == pytest.approx(1.12)
    assert loop.most_behind_s == pytest.approx(0.02)  # it started 20 ms after it was due


def test_a_loop_that_waited_for_work_is_not_counted_late():
    users = Users(np.array([20, 20]), np.array([10, 10]), np.array([1.0, 1.0]))
    ex = SimulatedExecutor(COST, users, np.random.default_rng(1))
    loop = HybridLoop(ex, {AD: 200.0, SD: 100.0}, period_s=0.05)
    loop.add(0, AD, pace=100.0)
    while loop.members:
        loop.run_period()
    ex.wait_until(3.0)  # nobody to serve until the next arrival
    loop.rest()
    loop.add(1, AD, pace=100.0)
    loop.run_period()
    assert loop.most_behind_s == 0.0
    ex.wait_until(ex.clock() + 0.03)  # a period that starts 30 ms late still counts
    loop.run_period()
    assert loop.most_behind_s == pytest.approx(0.03)
    # the simulator rests its loop while it waits for arrivals 2 s apart
    work = Workload(users, np.array([0.0, 2.0]))
    assert simulate(COST, work, 64 * 2**20, SERVICE, "ad-only").most_behind_s < 0.01


def test_user_demands_refuse_a_pace_the_mode_cannot_step_at():
    users = Users(np.array([10, 10]), np.array([40, 40]), np.array([0.06, 10.0]))
    d = user_demands(COST, users, SERVICE)
    assert np.isinf(d.compute[0]).all()  # 40 tokens in ~10 ms: no mode steps that fast
    assert np.isfinite(d.compute[1]).all() and (d.memory[1, 1] > d.memory[1, 0])


@pytest.mark.parametrize("budget", [6.5e6, 1.2e7, 2.4e7])
def test_memory_never_exceeds_the_budget(budget):
    work = random_workload(np.random.default_rng(2), 400, rate_per_s=80)
    for policy in ("ad-only", "sd-only", "hybrid"):
        res = simulate(COST, work, budget, SERVICE, policy)
        assert res.peak_memory_bytes <= budget
        assert (res.mode != UNSERVED).sum() > 0


def test_without_prefill_bursts_every_admitted_user_meets_its_deadline():
    """The admission model and the paced loop agree; prefill bursts are the known gap."""
    free = {"prefill_per_token_s": 0.0}
    cost = replace(COST, target=replace(COST.target, **free), draft=replace(COST.draft, **free))
    work = random_workload(np.random.default_rng(2), 400, rate_per_s=80)
    for policy in ("ad-only", "sd-only", "hybrid"):
        res = simulate(cost, work, 2.4e7, SERVICE, policy)
        assert (res.mode != UNSERVED).sum() > 100
        assert res.late == 0


def test_hybrid_matches_the_better_single_mode_where_one_resource_binds():
    work = random_workload(np.random.default_rng(3), 400, rate_per_s=80)
    for budget in (6.5e6, 2.4e7):  # memory-bound (AD wins), compute-bound (SD wins)
        served = {
            p: simulate(COST, work, budget, SERVICE, p).served_in_time
            for p in ("ad-only", "sd-only", "hybrid")
        }
        assert served["hybrid"] >= max(served["ad-only"], served["sd-only"])
        assert served["ad-only"] != served["sd-only"]


def test_hybrid_serves_more_than_either_single_mode_where_memory_is_tight():
    """Memory tight, compute loaded: the priced mix of AD and SD beats both single modes."""
    work = random_workload(np.random.default_rng(3), 400, rate_per_s=80)
    served = {
        p: simulate(COST, work, 8e6, SERVICE, p).served_in_time
        for p in ("ad-only", "sd-only", "hybrid")
    }
    assert served["hybrid"] > max(served["ad-only"], served["sd-only"])


def test_a_user_is_servable_alone_only_if_some_mode_meets_its_pace_and_memory():
    users = Users(
        prompt=np.array([10, 10, 4000]),
        output=np.array([20, 40, 20]),
        deadline=np.array([5.0, 0.06, 50.0]),  # loose; no mode steps that fast; too long
    )
    d = user_demands(COST, users, SERVICE)
    assert np.isinf(d.compute[1]).all()
    assert servable_alone(make_instance(COST, users, 6e6, SERVICE)).tolist() == [
        True,
        False,
        False,
    ]
    # 300 kB beside the target's weights: SD's weights do not fit, AD does
    tight = make_instance(COST, users, COST.target.weights_bytes + 3e5, SERVICE)
    assert tight.setup_memory[1] > tight.memory_capacity >= tight.memory[0, 0]
    assert servable_alone(tight).tolist() == [True, False, False]


def test_instance_pays_the_small_models_weights_only_for_sd_and_logits_per_user():
    users = Users(np.array([10]), np.array([10]), np.array([5.0]))
    inst = make_instance(COST, users, 1e7, SERVICE)
    assert inst.setup_memory[0] == 0
    assert inst.setup_memory[1] == COST.draft.weights_bytes
    # a user holds its KV cache and its rows of the step's logits: one position in AD; in SD
    # the draft_len + 1 verified and the last draft forward's
    assert inst.memory[0, 0] == 3072 * 20 + 1_700
    assert inst.memory[0, 1] == (3072 + 512) * (20 + 4) + 6 * 1_700
    assert inst.memory_capacity == 1e7 - COST.target.weights_bytes


def test_task_throughput_is_users_in_time_over_the_span_every_policy_shares():
    work = random_workload(np.random.default_rng(3), 60, 40.0)
    span = workload_span_s(work.arrival, work.users.deadline)
    assert span == pytest.approx(max(work.arrival + work.users.deadline) - min(work.arrival))
    results = [simulate(COST, work, 8e6, SERVICE, p) for p in ("ad-only", "sd-only", "hybrid")]
    for r in results:
        assert r.span_s == span and r.makespan_s > 0
        assert r.task_throughput == pytest.approx(r.served_in_time / span)
    # more users in time is more throughput, whenever each policy's last user finished
    by_count = sorted(results, key=lambda r: r.served_in_time)
    assert [r.task_throughput for r in by_count] == sorted(r.task_throughput for r in by_count)


def poor_draft_lab(ad_user: bool):
    """User 1 in SD on an executor whose draft gets none of its tokens right, while admission
    budgets the profile's 3.81 tokens a round; with ad_user, user 0 is served in AD beside it."""
    poor = replace(COST, round_tokens=[1.0, 0, 0, 0, 0])
    users = Users(np.array([20, 20]), np.array([30, 30]), np.array([5.0, 0.6]))
    arrival = np.zeros(2)
    demands = user_demands(COST, users, SERVICE)
    inst = make_instance(COST, users, 1e7, SERVICE, demands)
    admission = AdmissionController(inst, timing_of(COST, users, arrival, SERVICE, demands))
    executor = SimulatedExecutor(poor, users, np.random.default_rng(0))
    loop = HybridLoop(executor, {AD: SERVICE.ad_steps_per_s, SD: SERVICE.sd_rounds_per_s})
    for uid, mode in ((0, AD), (1, SD))[0 if ad_user else 1 :]:
        (decision,) = admission.offer_batch(np.array([uid]), (mode,), now=0.0)
        assert decision.mode == mode
        loop.add(uid, mode, float(demands.pace[uid, mode - 1]), since=0.0)
    finish, why = {}, {}
    while 1 in loop.members:
        now = executor.clock()
        finish.update(loop.run_period(now))
        why.update(
            move_lagging_sd_users(loop, admission, COST, users, arrival, SERVICE, executor.clock())
        )
    return finish[1], why


def test_an_sd_user_whose_rounds_yield_too_little_moves_to_ad_and_makes_its_deadline():
    finish, why = poor_draft_lab(ad_user=True)
    assert finish <= 0.6
    assert list(why) == [1] and "yielded 1.00 tokens each" in why[1]


def test_a_lagging_sd_user_does_not_open_ad_for_itself():
    finish, why = poor_draft_lab(ad_user=False)
    assert why == {} and finish > 0.6  # AD's setup would come out of everyone else's share


def test_bench_balance_sim_says_where_the_hybrid_stands_at_each_point(tmp_path):
    from typer.testing import CliRunner

    from testbed.cli import app

    path = tmp_path / "cost.json"
    path.write_text(json.dumps(COST.as_dict()))
    args = ["--users", "30", "--budgets-mib", "6,64", "--rates", "20,80", "--seeds", "0,1"]
    result = CliRunner().invoke(app, ["bench", "balance-sim", "--cost", str(path), *args])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[1:-1]]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        (s, r, m) for s in ("0", "1") for r in ("20", "80") for m in ("6.0", "64.0")
    ]
    stand = {"above": 0, "equal": 0, "below": 0}
    for r in rows:
        ad, sd, hybrid = (int(r[k].split("/")[0]) for k in (4, 5, 6))
        margin = hybrid - max(ad, sd)
        where = "above" if margin > 0 else ("below" if margin < 0 else "equal")
        assert r[-2:] == [where, f"({margin:+d})"]
        stand[where] += 1
    assert result.output.splitlines()[-1] == (
        "hybrid against the better single mode: "
        f"above at {stand['above']}, equal at {stand['equal']}, "
        f"below at {stand['below']} of 8 points"
    )


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--rates", "20,abc", "expected comma-separated numbers, got '20,abc'"),
        ("--rates", "0", "expected numbers of at least 1e-09, got 0.0"),
        ("--users", "30.5", "expected comma-separated integers"),
        ("--budgets-mib", "8,nan", "expected numbers of at least 1e-09, got nan in '8,nan'"),
        ("--seeds", "-1", "expected integers of at least 0, got -1"),
    ],
)
def test_bench_balance_sim_names_a_bad_list_option(tmp_path, option, value, says):
    from typer.testing import CliRunner

    from testbed.cli import app

    path = tmp_path / "cost.json"
    path.write_text(json.dumps(COST.as_dict()))
    result = CliRunner().invoke(app, ["bench", "balance-sim", "--cost", str(path), option, value])
    assert result.exit_code == 2, result.output  # a usage error, not a traceback
    text = " ".join(result.output.replace("│", " ").split())  # the error box may wrap it
    assert option in text and says in text
