"""The BALANCE scheduler: exact solvers agree, the proven bound holds, admission refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from testbed.balance.admission import AdmissionController, refusals
from testbed.balance.algorithm import _lp_vertex, schedule
from testbed.balance.baselines import ad_only, naive_greedy, sd_only
from testbed.balance.bench import proven_bound
from testbed.balance.costmodel import load_cost_model
from testbed.balance.exact import solve_exact, solve_exhaustive
from testbed.balance.instances import random_instance
from testbed.balance.problem import AD, SD, UNSERVED, Instance, is_feasible, usage
from testbed.errors import BadInputError


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
    assert any("compute" in r or "memory" in r for r in reasons)
    used = usage(inst, modes)
    assert ctl.free_compute == pytest.approx(inst.compute_capacity - used.compute)
    assert ctl.free_memory == pytest.approx(inst.memory_capacity - used.memory)
    for i in np.flatnonzero(modes != UNSERVED):
        ctl.release(int(modes[i]), inst.compute[i], inst.memory[i])
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


def test_cost_model_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "cost.json"
    bad.write_text(json.dumps({"target": {"weights_bytes": 1}}))
    with pytest.raises(BadInputError, match=r"cost\.json: key 'target\.kv_bytes_per_token'"):
        load_cost_model(bad)
