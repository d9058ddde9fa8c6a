"""Requests that stand for a workload (`workload.stands_for`): their lengths, their answers held
to those lengths and lossless over them, and the acceptance of the pair they stand for.

The answer-length test runs the server-alone SD agent (`agents.sled.local`, the code the
`server-sd` mode starts) over shaped requests and compares the answer lengths it produced with
the whole data set's stood-for answer lengths by a two-sample Kolmogorov-Smirnov test: the run
passes at p > KS_ALPHA. The same requests with their answers not held (EOS ends them, as the
tiny pair's own task does at ~16 tokens) fail that test, so it can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.sled import local
from agents.spec.decoding import generate_ad, generate_sd
from agents.spec.rates import alpha_from_tau, per_token_acceptance, tokens_per_round
from agents.workloads import gsm8k
from agents.workloads.request import NO_STOP
from testbed.config.playbook import Playbook, WorkloadSection
from testbed.core.errors import BadInputError
from testbed.metrics.acceptance_match import MAX_ACCEPTANCE_GAP, acceptance_match
from testbed.runner.workload import (
    check_workload,
    problems_for,
    stood_for_lengths,
    write_problem_file,
)
from testbed.topo.workloads import DEFAULT_PATH as DEFAULT_WORKLOADS
from testbed.topo.workloads import load_workloads, solution_words

needs_gsm8k = pytest.mark.skipif(
    not gsm8k.default_path().is_file(), reason="the shared GSM8K test split is not present"
)
SHAPE = "gsm8k-cot-0shot"
TARGET_AS = "llama-3.1-8b@bf16"
KS_ALPHA = 0.01  # the two-sample test's significance level


def shaped_workload(**extra) -> WorkloadSection:
    return WorkloadSection(stands_for=SHAPE, max_new_tokens=1024, **extra)


def test_solution_words_leave_out_annotations_and_the_answer_line() -> None:
    assert solution_words("She has 4*2=<<4*2=8>>8 eggs.\n#### 8") == 4


@needs_gsm8k
def test_shaped_requests_have_the_stood_for_lengths(tiny_pair) -> None:
    w = shaped_workload(problems_per_device=4, seed=3)
    got = problems_for(w, ["d1", "d2"], str(tiny_pair.target_hf), TARGET_AS)
    ids, lengths, every = stood_for_lengths(w, TARGET_AS, 8)
    problems = got["d1"] + got["d2"]
    assert [p.stands_for for p in problems] == ids
    assert [len(p.prompt_ids) for p in problems] == [x.prompt for x in lengths]
    assert [p.max_new for p in problems] == [x.answer for x in lengths]
    assert len(set(ids)) == 8 and len(every) == len(gsm8k.load_gsm8k(gsm8k.default_path()))
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    for p in problems:  # the question the tiny pair answers ends the prompt, whole
        tail = target.tokenize(f"Q: {p.question}\nA: ")
        assert list(p.prompt_ids[-len(tail) :]) == tail
    other = problems_for(shaped_workload(problems_per_device=4, seed=4), ["d1", "d2"],
                         str(tiny_pair.target_hf), TARGET_AS)  # fmt: skip
    assert [p.stands_for for p in other["d1"]] != [p.stands_for for p in got["d1"]]
    # no published mean answer length: each answer is its reference solution's length
    cat = load_workloads()
    assert cat.mean_answer(SHAPE, "llama-3.1-8b", "test") is None
    solutions = [item.answer for item in gsm8k.load_gsm8k(gsm8k.default_path())]
    per_word = cat.tokens_per_word(SHAPE)
    assert [x.answer for x in every] == [
        max(1, round(solution_words(s) * per_word)) for s in solutions]  # fmt: skip


def test_a_published_mean_answer_length_scales_the_counted_lengths(tmp_path: Path) -> None:
    text = DEFAULT_WORKLOADS.read_text().replace(
        "mean_tokens: {}", "mean_tokens: {llama-3.1-8b: 200}"
    )
    path = tmp_path / "workloads.yaml"
    path.write_text(text)
    cat = load_workloads(path)
    pairs = [("a b c", "one two three four"), ("d e", "five six")]
    lengths = cat.lengths(SHAPE, "llama-3.1-8b", pairs, pairs, "test")
    assert np.mean([x.answer for x in lengths]) == pytest.approx(200, abs=1)
    assert lengths[0].answer == pytest.approx(2 * lengths[1].answer, abs=1)
    assert cat.mean_answer(SHAPE, "llama-3.1-70b", "test") is None
    bad = text.replace("{llama-3.1-8b: 200}", "{llama-3.2-1b: 200}")
    path.write_text(bad)
    with pytest.raises(BadInputError, match="mean_tokens.llama-3.2-1b: not one of this answer"):
        load_workloads(path)


@needs_gsm8k
def test_answer_lengths_of_a_run_match_the_asked_distribution(tiny_pair, tmp_path) -> None:
    w = shaped_workload(problems_per_device=24, seed=5)
    problems = problems_for(w, ["d1"], str(tiny_pair.target_hf), TARGET_AS)["d1"]
    _, _, every = stood_for_lengths(w, TARGET_AS, 0)
    asked = np.array([min(x.answer, w.max_new_tokens) for x in every])

    def run(hold: bool) -> np.ndarray:
        path = tmp_path / f"problems-{hold}.jsonl"
        write_problem_file(problems, path)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        for item in lines:
            item["dev"] = "d1"
            if not hold:
                item.pop("hold")
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        records = tmp_path / f"records-{hold}"
        argv = [
            "--mode",
            "sd",
            "--target",
            str(tiny_pair.target_hf),
            "--draft",
            str(tiny_pair.draft_gguf),
            "--problems",
            str(path),
            "--records",
            str(records),
        ]
        assert local.main(argv) == 0  # fmt: skip
        rows = [json.loads(x) for x in (records / "requests.jsonl").read_text().splitlines()]
        return np.array([r["tokens"] for r in rows])

    held = run(hold=True)
    assert list(held) == [p.max_new for p in problems]  # every answer ran to its length
    assert stats.ks_2samp(held, asked).pvalue > KS_ALPHA
    short = run(hold=False)  # EOS ends them: the tiny task's own ~16-token answers
    assert short.mean() < 0.3 * held.mean()
    assert stats.ks_2samp(short, asked).pvalue < KS_ALPHA


@needs_gsm8k
def test_greedy_sd_equals_the_target_over_long_held_answers(tiny_pair) -> None:
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    w = shaped_workload(problems_per_device=24, seed=8)
    drawn = problems_for(w, ["d1"], str(tiny_pair.target_hf), TARGET_AS)["d1"]
    problems = sorted(drawn, key=lambda p: -p.max_new)[:5]  # the long tail of the answers
    accepted = rejections = 0
    for name in ("draft", "draft-xs"):
        draft = LlamaCppEngine(tiny_pair.draft_files(name)[1], n_threads=1)
        for p in problems:
            ids = list(p.prompt_ids)
            ad = generate_ad(target, ids, p.max_new, stop_id=NO_STOP)
            sd = generate_sd(draft, target, ids, p.max_new, 4, stop_id=NO_STOP)
            assert len(ad.tokens) == p.max_new > 50
            assert sd.tokens == ad.tokens, p.id
            assert target.eos_id in ad.tokens  # held past the answer's own end
            accepted, rejections = accepted + sd.accepted, rejections + sd.rejections
            alone = generate_ad(draft, ids, p.max_new, stop_id=NO_STOP).tokens
            assert alone != ad.tokens  # the comparison would see a draft's own answer
    assert rejections > 0 and 0.3 < per_token_acceptance(accepted, rejections) < 1


def test_tau_and_alpha_are_one_model() -> None:
    for alpha in (0.3, 0.6, 0.81, 0.95):
        for k in (1, 4, 8):
            assert abs(alpha_from_tau(tokens_per_round(alpha, k), k) - alpha) < 1e-9
    with pytest.raises(ValueError):
        alpha_from_tau(5.0, 4)


def test_an_acceptance_off_the_stood_for_pair_is_unmatched() -> None:
    assert acceptance_match(0.70, 0.80) == {
        "acceptance_gap": pytest.approx(-0.10), "acceptance_unmatched": True}  # fmt: skip
    assert acceptance_match(0.80 + MAX_ACCEPTANCE_GAP / 2, 0.80)["acceptance_unmatched"] is False
    assert acceptance_match(None, 0.8)["acceptance_unmatched"] is None
    assert acceptance_match(0.8, None)["acceptance_unmatched"] is None


@needs_gsm8k
def test_bad_workload_shapes_are_refused_naming_the_key(tmp_path: Path) -> None:
    def playbook(**workload) -> Playbook:
        return Playbook.model_validate({
            "name": "x", "models": {"target_as": TARGET_AS}, "workload": workload})  # fmt: skip

    with pytest.raises(BadInputError, match="workload.stands_for.*unknown workload 'nope'"):
        check_workload(playbook(stands_for="nope"), "pb.yaml")
    unknown_target = Playbook.model_validate({
        "name": "x", "models": {"target_as": "llama-3.2-1b@bf16"},
        "workload": {"stands_for": SHAPE}})  # fmt: skip
    with pytest.raises(BadInputError, match="no answer length for target 'llama-3.2-1b'"):
        check_workload(unknown_target, "pb.yaml")
    with pytest.raises(BadInputError, match="longer|more than the target model's context"):
        big = tmp_path / "model"
        big.mkdir()
        (big / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
        long = Playbook.model_validate({
            "name": "x", "models": {"target_as": TARGET_AS, "target": str(big)},
            "workload": {"stands_for": SHAPE, "max_new_tokens": 1024}})  # fmt: skip
        check_workload(long, "pb.yaml")
    with pytest.raises(BadInputError, match="models.draft_grade: unknown grade 'draft-zz'"):
        graded = Playbook.model_validate({"name": "x", "models": {"draft_grade": "draft-zz"}})
        check_workload(graded, "pb.yaml")
    with pytest.raises(BadInputError, match="needs the GSM8K test split"):
        check_workload(playbook(stands_for=SHAPE, gsm8k_path=str(tmp_path / "none.jsonl")), "p")


@needs_gsm8k
def test_answer_scale_multiplies_every_held_answer_length() -> None:
    """`workload.answer_scale` stretches each stood-for answer (the prompt stays), and
    `max_new_tokens` still caps it."""
    _, base, _ = stood_for_lengths(shaped_workload(), TARGET_AS, 40)
    _, tripled, _ = stood_for_lengths(shaped_workload(answer_scale=3), TARGET_AS, 40)
    assert [x.prompt for x in tripled] == [x.prompt for x in base]
    assert all(abs(t.answer - 3 * b.answer) <= 2 for t, b in zip(tripled, base))
    assert np.mean([x.answer for x in tripled]) > 2.9 * np.mean([x.answer for x in base])
