"""The BALANCE scheduler: exact solvers agree, the proven bound holds, admission refuses."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agents.balance.admission import PRICE_LIMIT, AdmissionController, Plan, plan_modes, refusals
from agents.balance.algorithm import _lp_vertex, schedule
from agents.balance.exhaustive import solve_exhaustive
from agents.balance.problem import AD, SD, UNSERVED, Instance, Timing, is_feasible, usage
from testbed.balance.baselines import ad_only, naive_greedy, sd_only
from testbed.balance.bench import proven_bound
from testbed.balance.cost_file import read_cost_model
from testbed.balance.exact import solve_exact
from testbed.balance.instances import random_instance
from testbed.core.errors import BadInputError


def test_integer_program_matches_exhaustive_search():
    rng = np.random.default_rng(11)
    for _ in range(25):
        inst = random_instance(rng, int(rng.integers(2, 8)))
        ilp, brute = solve_exact(inst), solve_exhaustive(inst)
        assert is_feasible(inst, ilp.modes)
        assert ilp.served == brute.served


def test_algorithm_is_feasible_and_keeps_its_bound_on_random_instances():
    rng = np.random.default_rng(12)
    for _ in range(150):
        inst = random_instance(rng, int(rng.integers(3, 25)))
        optimum = solve_exact(inst).served
        sched = schedule(inst)
        assert is_feasible(inst, sched.modes)
        assert optimum >= sched.served >= proven_bound(optimum)


def test_hybrid_serves_at_least_ad_only_and_sd_only():
    rng = np.random.default_rng(13)
    for _ in range(60):
        inst = random_instance(rng, int(rng.integers(3, 40)))
        hybrid, ad, sd = schedule(inst), ad_only(inst), sd_only(inst)
        assert set(np.unique(ad.modes)) <= {UNSERVED, AD}
        assert set(np.unique(sd.modes)) <= {UNSERVED, SD}
        assert hybrid.served >= max(ad.served, sd.served)


def test_lp_vertex_has_at_most_two_fractional_users():
    rng = np.random.default_rng(14)
    for _ in range(40):
        inst = random_instance(rng, int(rng.integers(5, 60)))
        x = _lp_vertex(inst.compute, inst.memory, np.ones((len(inst), 2), dtype=bool))
        fractional = ((x > 1e-7) & (x < 1 - 1e-7)).any(axis=1)
        assert fractional.sum() <= 2


def partition_instance(sizes: list[int], tau_ad: float = 3.0, tau_sd: float = 1.0) -> Instance:
    """The reduction of docs/balance.md: all users fit iff sizes split into two equal halves."""
    s = np.array(sizes, dtype=float)
    half = s.sum() / 2
    deadline = 2 * half * tau_sd + (tau_ad - tau_sd) * half
    kv_large, kv_small = 1.0, 0.5
    return Instance(
        compute=np.stack([tau_ad * s, tau_sd * s], axis=1) / deadline,
        memory=np.stack([kv_large * s, (kv_large + kv_small) * s], axis=1),
        compute_capacity=1.0,
        memory_capacity=kv_large * 2 * half + kv_small * half,
    )


@pytest.mark.parametrize(
    ("sizes", "splits"),
    [([3, 1, 1, 2, 2, 1], True), ([5, 3, 3, 1], True), ([6, 2, 2], False), ([7, 3, 1, 1], False)],
)
def test_partition_reduction_serves_everyone_exactly_when_a_partition_exists(sizes, splits):
    inst = partition_instance(sizes)
    assert (solve_exhaustive(inst).served == len(sizes)) is splits


def test_naive_greedy_is_feasible_and_can_lose_to_the_scheduler():
    rng = np.random.default_rng(15)
    gaps = []
    for _ in range(40):
        inst = random_instance(rng, 20)
        greedy = naive_greedy(inst)
        assert is_feasible(inst, greedy.modes)
        gaps.append(schedule(inst).served - greedy.served)
    assert max(gaps) > 0


def test_admission_never_exceeds_capacity_and_names_the_short_resource():
    rng = np.random.default_rng(16)
    inst = random_instance(rng, 200)
    ctl = AdmissionController(inst)
    modes = np.full(len(inst), UNSERVED, dtype=np.int8)
    reasons = []
    for batch in np.array_split(np.arange(len(inst)), 20):
        for i, decision in zip(batch, ctl.offer_batch(batch)):
            modes[i] = decision.mode
            if not decision.admitted:
                reasons.append(decision.reason)
        assert is_feasible(inst, modes)
    assert reasons and all(r.startswith(("no mode fits", "deadline too short")) for r in reasons)
    single = AdmissionController(inst).offer_batch(np.arange(len(inst)), (AD,))
    refused = [d.reason for d in single if not d.admitted]
    assert refused and all(r.startswith(("no room in AD", "only SD", "deadline")) for r in refused)
    assert any("compute" in r or "memory" in r for r in reasons)
    used = usage(inst, modes)
    assert ctl.free_compute == pytest.approx(inst.compute_capacity - used.compute)
    assert ctl.free_memory == pytest.approx(inst.memory_capacity - used.memory)
    for i in np.flatnonzero(modes != UNSERVED):
        ctl.release(int(i))
    assert ctl.free_compute == pytest.approx(inst.compute_capacity)
    assert ctl.members == {AD: 0, SD: 0}


def test_users_who_cannot_use_one_mode_are_scheduled_in_the_other():
    rng = np.random.default_rng(17)
    inst = random_instance(rng, 12)
    inst.compute[::2, 1] = np.inf  # even users: no SD round rate is fast enough for them
    sched = schedule(inst)
    assert is_feasible(inst, sched.modes)
    assert not (sched.modes[::2] == SD).any()
    assert proven_bound(solve_exact_finite(inst)) <= sched.served


def solve_exact_finite(inst: Instance) -> int:
    """The optimum with an unusable mode priced out of every capacity instead of inf."""
    big = np.where(np.isfinite(inst.compute), inst.compute, 10 * inst.compute_capacity)
    return solve_exact(
        Instance(
            big,
            inst.memory,
            inst.compute_capacity,
            inst.memory_capacity,
            inst.setup_compute,
            inst.setup_memory,
        )
    ).served


def test_a_user_whose_deadline_cannot_be_met_alone_is_refused_with_that_reason():
    inst = Instance(compute=np.array([[2.0, 1.5], [0.1, 0.05]]), memory=np.ones((2, 2)) * 0.1)
    sched = schedule(inst)
    assert list(sched.modes) == [UNSERVED, sched.modes[1]] and sched.modes[1] != UNSERVED
    assert refusals(inst, sched)[0].startswith("deadline too short")


def test_a_refusal_names_the_mode_the_policy_lacks_or_the_setup_that_does_not_fit():
    mib = 2.0**20
    inst = Instance(
        compute=np.array([[np.inf, 0.1], [np.inf, np.inf], [0.1, 0.1]]),
        memory=np.array([[0.2, 0.3]] * 3) * mib,
        compute_capacity=1.0,
        memory_capacity=1.0 * mib,
        setup_compute=np.array([0.1, 0.1]),
        setup_memory=np.array([0.0, 0.8]) * mib,
    )
    only_sd, hopeless, _ = AdmissionController(inst).offer_batch(np.arange(3), (AD,))
    assert only_sd.reason == "only SD can make its deadline, and this server runs AD only"
    assert hopeless.reason.startswith("deadline too short: neither mode")
    plan = Plan((AD,), (AD, SD), True, price_compute=1.0, price_memory=0.1 / mib, span_s=1.0)
    ctl = AdmissionController(inst)
    ctl.offer_batch(np.array([2]), (AD,))  # AD holds 0.2 of the 1.0: SD's 0.8 setup + 0.3 fail
    setup_short, hopeless = ctl.offer_priced(np.arange(2), plan, np.ones(3))
    assert setup_short.reason == (
        "no mode fits (SD would be cheapest): "
        "memory: needs 1.10 MiB with the mode's setup, 0.80 MiB free"
    )
    assert hopeless.reason.startswith("deadline too short: neither mode")


def test_cost_model_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "cost.json"
    bad.write_text(json.dumps({"target": {"weights_bytes": 1}}))
    with pytest.raises(BadInputError, match=r"cost\.json: key 'target\.kv_bytes_per_token'"):
        read_cost_model(bad)


def test_priced_admission_sends_each_user_where_the_binding_resource_costs_least():
    inst = Instance(
        compute=np.array([[0.02, 0.01]] * 2),  # SD needs less compute
        memory=np.array([[1.0, 2.0]] * 2),  # AD needs less memory
        compute_capacity=1.0,
        memory_capacity=100.0,
    )
    deadline = np.ones(2)
    memory_bound = Plan((AD, SD), (AD, SD), True, price_compute=0.0, price_memory=0.1, span_s=1.0)
    compute_bound = Plan((AD, SD), (AD, SD), True, price_compute=10.0, price_memory=0.0, span_s=1.0)
    users = np.arange(2)
    by_memory = AdmissionController(inst).offer_priced(users, memory_bound, deadline)
    by_compute = AdmissionController(inst).offer_priced(users, compute_bound, deadline)
    assert [d.mode for d in by_memory] == [AD, AD]
    assert [d.mode for d in by_compute] == [SD, SD]


def test_priced_admission_serves_the_cheapest_first_and_refuses_one_not_worth_its_share():
    inst = Instance(
        compute=np.array([[0.6, np.inf], [0.5, np.inf], [0.3, np.inf]]),
        memory=np.array([[1.0, 1.0], [1.0, 1.0], [10.0, 10.0]]),
        compute_capacity=1.0,
        memory_capacity=100.0,
    )
    plan = Plan((AD,), (AD,), True, price_compute=2.0, price_memory=0.2, span_s=1.0)
    ctl = AdmissionController(inst)
    first, second, dear = ctl.offer_priced(np.arange(3), plan, np.ones(3))
    assert second.mode == AD  # priced 1.2 against user 0's 1.4: admitted first
    assert first.mode == UNSERVED and "compute" in first.reason  # 0.6 needed, 0.5 free
    assert dear.mode == UNSERVED and f"above {PRICE_LIMIT}" in dear.reason  # 0.6 + 2.0
    assert ctl.free_compute == pytest.approx(0.5)


def window_instance(n: int, memory_each: float, setup_compute: float) -> Instance:
    """n users who fit either mode, SD cheaper in compute, AD in memory."""
    return Instance(
        compute=np.tile([0.02, 0.01], (n, 1)),
        memory=np.tile([memory_each, 1.2 * memory_each], (n, 1)),
        compute_capacity=1.0,
        memory_capacity=1.0,
        setup_compute=np.array([setup_compute, setup_compute]),
        setup_memory=np.array([0.0, 0.1]),
    )


def split_instance(setup_compute: float) -> Instance:
    """10 users: 0-4 only AD steps fast enough for, 5-9 only SD."""
    inf = np.inf
    return Instance(
        compute=np.array([[0.02, inf]] * 5 + [[inf, 0.01]] * 5),
        memory=np.full((10, 2), 0.01),
        compute_capacity=1.0,
        memory_capacity=1.0,
        setup_compute=np.array([setup_compute, setup_compute]),
        setup_memory=np.array([0.0, 0.1]),
    )


def test_plan_opens_both_modes_only_when_both_serve_more():
    window, deadline = np.arange(10), np.ones(10)
    both = plan_modes(split_instance(0.2), window, deadline, 1.0, (AD, SD))
    assert both.modes == (AD, SD)  # each mode alone serves 5 of the 10
    tight = plan_modes(split_instance(0.45), window, deadline, 1.0, (AD, SD))
    assert len(tight.modes) == 1  # 0.9 of the server minus two setups of 0.45: nothing left
    # every user fits either mode: one mode serves all 10, and the second stays shut
    tie = plan_modes(window_instance(10, 0.01, 0.2), window, deadline, 1.0, (AD, SD))
    assert len(tie.modes) == 1 and tie.priced


def test_a_plan_on_too_few_arrivals_opens_only_the_modes_they_use():
    inst = split_instance(0.2)  # a priced plan on all 10 opens both
    window, deadline = np.arange(10), np.ones(10)
    assert plan_modes(inst, window, deadline, 1.0, (AD, SD)).modes == (AD, SD)
    first = plan_modes(inst, window[:1], deadline, 1.0, (AD, SD))
    assert not first.priced and first.modes == (AD,)  # not both setups for one user


def test_a_user_no_open_mode_can_serve_may_open_a_shut_one_in_a_batch():
    inst = Instance(
        compute=np.array([[0.1, 0.05], [np.inf, 0.1]]),  # user 1: only SD steps fast enough
        memory=np.array([[1.0, 1.0], [1.0, 1.0]]),
        compute_capacity=1.0,
        memory_capacity=10.0,
        setup_compute=np.array([0.1, 0.1]),
        setup_memory=np.array([0.0, 2.0]),
    )
    batch = AdmissionController(inst).offer_batch(np.arange(2), (AD,), shut=(SD,))
    assert [d.mode for d in batch] == [
        AD,
        SD,
    ]  # user 0 stays in the open mode, though cheaper in SD
    alone = AdmissionController(inst).offer_batch(np.arange(2), (AD,))
    assert [d.mode for d in alone] == [AD, UNSERVED]


def test_plan_averages_the_window_over_the_time_each_user_holds_its_share():
    inst = window_instance(10, 0.3, 0.1)  # together 3x the memory if all were present at once
    window, deadline = np.arange(10), np.full(10, 0.1)
    spread = plan_modes(inst, window, deadline, 1.0, (AD, SD))  # each holds 0.1 s of 1 s
    crowded = plan_modes(inst, window, deadline, 0.1, (AD, SD))  # all present at once
    assert spread.priced and crowded.priced
    assert spread.price_memory == 0  # 10 x 0.03 of the memory on average: nothing binds
    assert crowded.price_memory > 0
    few = plan_modes(inst, window[:3], deadline, 1.0, (AD, SD))
    assert not few.priced  # too few arrivals to price the resources


def test_a_user_only_a_shut_mode_can_serve_opens_it_when_its_setup_fits_now():
    inst = Instance(
        compute=np.array([[np.inf, 0.1]]),  # AD cannot step fast enough for this user
        memory=np.array([[1.0, 1.0]]),
        compute_capacity=1.0,
        memory_capacity=10.0,
        setup_compute=np.array([0.1, 0.1]),
        setup_memory=np.array([0.0, 2.0]),
    )
    plan = Plan((AD,), (AD, SD), True, price_compute=1.0, price_memory=0.1, span_s=1.0)
    (roomy,) = AdmissionController(inst).offer_priced(np.arange(1), plan, np.ones(1))
    assert roomy.mode == SD
    small = replace(inst, memory_capacity=2.5)  # SD's setup and the user need 3.0
    (short,) = AdmissionController(small).offer_priced(np.arange(1), plan, np.ones(1))
    assert short.mode == UNSERVED and "setup" in short.reason


PERIOD = 0.05
SLACK_PLAN = Plan((AD, SD), (AD, SD), True, price_compute=0.0, price_memory=0.0, span_s=1.0)


def waiting_lab(memory: list[float], arrival: list[float], deadline: list[float]):
    """An admission controller over users with one memory need in both modes, a small
    compute share, a window of their deadline less two periods and a pace far below the top."""
    n = len(memory)
    mem = np.array(memory, dtype=float)
    inst = Instance(
        compute=np.full((n, 2), 0.05),
        memory=np.stack([mem, mem], axis=1),
        compute_capacity=1.0,
        memory_capacity=1.0,
    )
    window = np.array(deadline)[:, None] - 2 * PERIOD + np.zeros((1, 2))
    timing = Timing(
        arrival=np.array(arrival, dtype=float),
        deadline=np.array(deadline, dtype=float),
        window=window,
        pace=10 / window,
        top_pace=np.array([1e3, 1e3]),
        period_s=PERIOD,
    )
    return AdmissionController(inst, timing)


def test_a_user_with_slack_waits_for_memory_and_starts_when_it_frees():
    ctl = waiting_lab([0.8, 0.5], arrival=[0.0, 0.1], deadline=[1.0, 2.0])
    (first,) = ctl.offer_batch(np.array([0]), (AD,), now=0.0, may_wait=True)
    assert first.admitted and not first.waits
    (second,) = ctl.offer_batch(np.array([1]), (AD,), now=0.1, may_wait=True)
    assert second.mode == AD and second.waits
    assert "starting in 0.90 s" in second.reason and "memory" in second.reason
    assert ctl.start_due(0.5) == [] and ctl.free_memory == pytest.approx(0.2)
    ctl.release(0)  # user 0 finished early, at 0.6 s: user 1 need not wait for 1.0 s
    (start,) = ctl.start_due(0.6)
    assert (start.uid, start.mode, start.since) == (1, AD, 0.6)
    late = 0.6 - 0.1 - PERIOD  # its first period of waiting is inside its margin
    window = 2.0 - 2 * PERIOD
    assert start.pace == pytest.approx(10 / window * window / (window - late))
    assert ctl.free_memory == pytest.approx(0.5)
    assert not ctl.waiting


def test_a_user_without_the_slack_to_wait_is_refused_at_once_saying_so():
    ctl = waiting_lab([0.8, 0.5], arrival=[0.0, 0.1], deadline=[1.0, 0.9])
    ctl.offer_batch(np.array([0]), (AD,), now=0.0, may_wait=True)
    (short,) = ctl.offer_batch(np.array([1]), (AD,), now=0.1, may_wait=True)
    assert short.mode == UNSERVED
    assert "memory: needs" in short.reason and "no later start meets its deadline" in short.reason


def test_without_slack_in_the_plan_no_user_is_made_to_wait():
    ctl = waiting_lab([0.8, 0.5], arrival=[0.0, 0.1], deadline=[1.0, 2.0])
    ctl.offer_batch(np.array([0]), (AD,), now=0.0)
    (second,) = ctl.offer_batch(np.array([1]), (AD,), now=0.1)
    assert second.mode == UNSERVED and "later start" not in second.reason


def test_a_later_arrival_never_takes_memory_promised_to_a_waiting_user():
    ctl = waiting_lab([0.8, 0.9, 0.15], arrival=[0.0, 0.1, 0.2], deadline=[1.0, 2.0, 1.3])
    ctl.offer_batch(np.array([0]), (AD,), now=0.0, may_wait=True)
    (waits,) = ctl.offer_batch(np.array([1]), (AD,), now=0.1, may_wait=True)
    assert waits.waits  # starts at 1.0 s with 0.9 of the memory
    (third,) = ctl.offer_batch(np.array([2]), (AD,), now=0.2, may_wait=True)
    # 0.15 fits beside user 0 now, but would still hold it at 1.0 s beside user 1's 0.9
    assert third.mode == UNSERVED
    ctl.release(0)
    assert [s.uid for s in ctl.start_due(1.0)] == [1]
    assert ctl.free_memory == pytest.approx(0.1)


def test_the_most_urgent_of_equally_priced_arrivals_is_admitted_first():
    """Zero prices (nothing binds on average): the user who cannot wait goes first, and the
    one with slack waits for what the first one holds."""
    ctl = waiting_lab([0.6, 0.6], arrival=[0.0, 0.02], deadline=[1.0, 0.3])
    ctl.inst.compute[1, 0] = np.inf  # only SD is fast enough for the urgent user
    relaxed, urgent = ctl.offer_priced(np.arange(2), SLACK_PLAN, ctl.timing.deadline, now=0.05)
    assert urgent.mode == SD and not urgent.waits
    assert relaxed.mode in (AD, SD) and relaxed.waits


def test_a_user_offered_a_start_after_its_window_passed_is_told_it_came_too_late():
    ctl = waiting_lab([0.1], arrival=[0.0], deadline=[0.5])
    # its window is 0.4 s and its first period of waiting is in its margin: offered a start
    # at 0.47 s, it is 0.42 s late, and no time is left for its 10 tokens
    (late,) = ctl.offer_batch(np.array([0]), (AD,), now=0.47, may_wait=True)
    assert late.mode == UNSERVED
    assert late.reason.startswith("offered a start 470 ms after it arrived: too late for AD")
    on_time = waiting_lab([0.1], arrival=[0.0], deadline=[0.5])
    (served,) = on_time.offer_batch(np.array([0]), (AD,), now=0.05, may_wait=True)
    assert served.admitted and not served.waits
    plan_late = waiting_lab([0.1], arrival=[0.0], deadline=[0.5])
    (priced,) = plan_late.offer_priced(np.array([0]), SLACK_PLAN, np.array([0.5]), now=0.47)
    assert priced.mode == UNSERVED and "too late for AD or SD" in priced.reason
