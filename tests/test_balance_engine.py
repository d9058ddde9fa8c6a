"""The hybrid loop on the real tiny pair: lossless in AD and SD, moves lose no token."""

from __future__ import annotations

import pytest

from agents.balance.engine import EngineExecutor
from agents.balance.loop import HybridLoop
from agents.balance.modes import AD, SD

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(tiny_pair):
    from agents.engines.torch_hf import TorchEngine

    return TorchEngine(tiny_pair.target_hf, threads=1), TorchEngine(tiny_pair.draft_hf, threads=1)


def test_hybrid_loop_output_equals_target_greedy_with_moves_between_modes(engines):
    from agents.spec.decoding import generate_ad
    from agents.workloads.arithmetic import heldout_problems, prompt
    from agents.workloads.request import NO_STOP

    target, draft = engines
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(6, seed=21)]
    max_new = 40
    # a user is held to its asked length (EOS does not end it), as the executor serves it
    expected = [generate_ad(target, p, max_new, stop_id=NO_STOP).tokens for p in prompts]

    ex = EngineExecutor(target, draft, draft_len=4)
    loop = HybridLoop(ex, {AD: 1000.0, SD: 1000.0}, period_s=0.02, lookahead_s=10.0)
    for uid, p in enumerate(prompts):
        ex.submit(uid, p, max_new)
        loop.add(uid, AD if uid % 2 else SD, pace=1e6)
    periods = 0
    while loop.members:
        loop.run_period()
        periods += 1
        if periods == 1:  # every user changes mode after its first period
            for uid, member in list(loop.members.items()):
                loop.move(uid, SD if member.mode == AD else AD)
    assert loop.steps[AD] > 0 and loop.steps[SD] > 0
    assert [ex.outputs[u] for u in range(len(prompts))] == expected
    assert ex.kv_tokens() == (0, 0)


def test_the_draft_cache_exists_only_while_a_user_is_in_sd(engines):
    target, draft = engines
    ex = EngineExecutor(target, draft, draft_len=4)
    ex.submit(0, target.tokenize("Q: 2+3=?\nA: "), 8)
    ex.start(0, SD)
    assert ex.kv_tokens()[1] > 0
    ex.step(SD, [0])
    ex.start(0, AD)
    assert ex.kv_tokens()[1] == 0 and ex.kv_tokens()[0] > 0
    ex.stop(0)


def test_a_rewound_user_gets_the_same_round_again(engines):
    target, draft = engines
    ex = EngineExecutor(target, draft, draft_len=4)
    prompt = target.tokenize("Q: 12+30=?\nA: ")
    ex.submit(0, prompt, 40)
    ex.start(0, SD)
    first, _ = ex.step(SD, [0])
    out = list(ex.users[0].output)
    assert first[0] == len(out) > 0
    ex.rewind(0, 0)
    assert ex.users[0].output == [] and ex.users[0].committed == prompt
    again, _ = ex.step(SD, [0])
    assert again == first and ex.users[0].output == out
    ex.stop(0)


def test_kv_accounting_matches_the_growth_of_resident_memory(tiny_pair, tmp_path):
    from agents.balance.costmodel import CostModel, LoopStep, ModelCost, StepCost
    from agents.balance.measure import model_config_kv_bytes
    from agents.engines.torch_hf import TorchEngine
    from testbed.balance.validate import check_memory

    step = StepCost(fixed_s=0.001, per_seq_s=0.001)

    def cost_of(path):
        engine = TorchEngine(path, threads=1)
        return ModelCost(
            weights_bytes=1,
            kv_bytes_per_token=model_config_kv_bytes(engine),
            prefill_per_token_s=0.0,
        )

    cost = CostModel(
        target=cost_of(tiny_pair.target_hf),
        draft=cost_of(tiny_pair.draft_hf),
        ad_step=LoopStep(busy=step, after_idle=step),
        sd_round=LoopStep(busy=step, after_idle=step),
        draft_len=4,
        acceptance=0.8,
        round_tokens=[0.2, 0.2, 0.2, 0.2, 0.2],
        logits_row_bytes=4,
    )
    check = check_memory(cost, tiny_pair.draft_hf, tiny_pair.target_hf, users=48, tokens=200)
    assert 0.95 <= check.ratio <= 1.25


def test_profile_times_every_step_in_turns_so_a_slow_moment_costs_one_run_of_each():
    """On a fake clock that each step advances by its own cost, in whole ticks (exact): the
    host is slow (every step 20 times its cost) for round 4 of 7, which then costs one run of
    each step; the medians drop it and equal the steps' usual costs exactly. The idle wait
    before a step named in `idle_before` is slept on the same clock and is not timed."""
    from agents.balance.measure import interleaved_medians

    order: list[str] = []
    ticks = [0]  # the fake clock
    slept: list[int] = []
    costs: dict[str, list[int]] = {"a": [], "b": []}  # what each run of a step took
    host = {"slow": False}

    def step(name: str, cost: int):
        def run() -> None:
            order.append(name)
            took = cost * (20 if host["slow"] else 1)
            costs[name].append(took)
            ticks[0] += took
            if len(order) == 2 + 2 * 3:  # after round 3 of 7 the host slows for one round
                host["slow"] = True
            elif len(order) == 2 + 2 * 4:
                host["slow"] = False

        return run

    def sleep(seconds: int) -> None:
        slept.append(seconds)
        ticks[0] += seconds

    medians = interleaved_medians(
        {"a": step("a", 2), "b": step("b", 1)}, repeats=7, idle_before={"b": 1000},
        now=lambda: ticks[0], sleep=sleep,
    )  # fmt: skip
    assert order == ["a", "b"] * 8  # a warm-up round, then 7 rounds in turns
    # the slow round (round 4, after the warm-up) cost one run of each step, no more
    assert costs == {"a": [2, 2, 2, 2, 40, 2, 2, 2], "b": [1, 1, 1, 1, 20, 1, 1, 1]}
    assert slept == [1000] * 7  # before every timed run of b (not the warm-up)
    assert medians == {"a": 2, "b": 1}


def test_profile_of_the_tiny_pair_fits_every_point_it_timed(tiny_pair):
    from agents.balance.measure import measure_cost_model

    cost = measure_cost_model(
        tiny_pair.draft_hf, tiny_pair.target_hf, batches=(1, 4), repeats=3, idle_s=0.01
    )
    assert set(cost.points) == {
        "ad_step", "ad_step_after_idle", "sd_round", "sd_round_after_idle",
        "target_decode", "draft_decode", "verify",
    }  # fmt: skip
    assert all([b for b, _ in pts] == [1, 4] for pts in cost.points.values())
    assert all(t > 0 for pts in cost.points.values() for _, t in pts)
    for step in (cost.ad_step.busy, cost.ad_step.after_idle, cost.sd_round.after_idle):
        assert step.fixed_s + step.per_seq_s > 0
    # an SD round is g draft forwards and a verification at least
    sd, forwards = dict(cost.points["sd_round"]), dict(cost.points["verify"])
    assert sd[4] > forwards[4]
    assert len(cost.round_tokens) == 5 and sum(cost.round_tokens) == pytest.approx(1)
    assert cost.target.prefill_per_token_s > 0 and cost.draft.prefill_per_token_s > 0
    assert cost.target.weights_bytes > cost.draft.weights_bytes
    assert 0 < cost.acceptance < 1
