"""Synthetic arithmetic problems, GSM8K loading and lm-eval-style answer scoring."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agents.workloads import gsm8k
from agents.workloads.arithmetic import (
    Problem,
    heldout_problems,
    is_heldout,
    make_problems,
    prompt,
    train_problems,
)
from agents.workloads.scoring import as_number, extract_flexible, extract_strict, normalize, score

# --- arithmetic -------------------------------------------------------------------------------


def test_problems_are_deterministic_and_extend() -> None:
    a = make_problems(50, seed=5)
    assert a == make_problems(50, seed=5)
    assert make_problems(20, seed=5) == a[:20]
    assert [p.question for p in make_problems(50, seed=6)] != [p.question for p in a]


def test_answers_are_worked_steps_ending_in_the_result() -> None:
    step = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")
    for p in make_problems(300, seed=3):
        *steps, last = p.answer.split("\n")
        assert last == f"#### {p.result}"
        assert 1 <= len(steps) <= 2
        for line in steps:
            m = step.match(line)
            assert m, line
            a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
            assert {"+": a + b, "-": a - b, "*": a * b}[op] == c
        assert int(step.match(steps[-1])[4]) == p.result
        assert p.result >= 0


def test_all_templates_appear() -> None:
    kinds = {p.kind for p in make_problems(200, seed=1)}
    assert kinds == {"add", "sub", "mul", "add_sub", "mul_add"}


def test_heldout_is_disjoint_from_training_questions() -> None:
    heldout = heldout_problems(200)
    questions = [p.question for p in heldout]
    assert len(set(questions)) == len(questions) == 200
    assert all(is_heldout(q) for q in questions)
    train = {p.question for p in train_problems(30000)}
    assert train.isdisjoint(questions)
    assert not any(is_heldout(q) for q in list(train)[:2000])


def test_prompt_format() -> None:
    p = make_problems(1, seed=1)[0]
    assert prompt(p) == f"Q: {p.question}\nA: "


@pytest.mark.parametrize("kwargs", [{"n": -1, "seed": 0}, {"n": 3, "seed": 0, "split": "test"}])
def test_make_problems_rejects_bad_arguments(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="make_problems"):
        make_problems(**kwargs)


# --- scoring ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("#### -5", "-5"),
        ("#### 1,000 apples", "1,000"),
        ("#### 3\n#### 4", "3"),  # the first match
        ("####42", None),  # lm-eval requires the space
        ("the answer is 7", None),
        ("", None),
    ],
)
def test_extract_strict(text: str, expected: str | None) -> None:
    assert extract_strict(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("so 12 and then 35.", "35."),
        ("costs $1,234 in total", "$1,234"),
        ("x = -8", "-8"),
        ("no digits here", None),
        ("", None),
    ],
)
def test_extract_flexible_takes_the_last_number(text: str, expected: str | None) -> None:
    assert extract_flexible(text) == expected


@pytest.mark.parametrize(
    ("text", "reference", "expected"),
    [
        ("3 + 4 = 7\n#### 7", 7, (True, True)),
        ("the answer is 7", 7, (False, True)),
        ("#### 7\nor maybe 8", 7, (True, False)),
        ("#### 1000", "Janet sells 2 * 500 = 1000.\n#### 1,000", (True, True)),
        ("#### 18.", "18", (True, True)),
        ("#### $18", "18", (False, True)),  # strict wants a digit right after "#### "
        ("#### 7.0", 7, (False, False)),  # string match after normalisation, as lm-eval
        ("#### 6", 7, (False, False)),
        ("", 7, (False, False)),
    ],
)
def test_score(text: str, reference: str | int, expected: tuple[bool, bool]) -> None:
    assert score(text, reference) == expected


def test_normalize_and_as_number() -> None:
    assert normalize("The answer: #### $1,234.") == "1234"
    assert as_number("1,234") == 1234
    assert as_number("-2.5") == -2.5
    assert as_number("..") is None
    assert as_number(None) is None


# --- GSM8K ------------------------------------------------------------------------------------


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_load_gsm8k_from_a_file(tmp_path: Path) -> None:
    f = _write(
        tmp_path / "mini.jsonl",
        [
            {"question": "How many?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
            {"question": "How much?", "answer": "big\n#### 1,450,000"},
        ],
    )
    problems = gsm8k.load_gsm8k(f)
    assert [p.result for p in problems] == [4, 1450000]
    assert problems[0].question == "How many?"
    assert score("so #### 1,450,000", problems[1].answer) == (True, True)
    assert len(gsm8k.load_gsm8k(f, limit=1)) == 1


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "mini.jsonl:2: not valid JSON"),
        ({"question": "q"}, "mini.jsonl:2: field 'answer' missing"),
        ({"question": 3, "answer": "#### 1"}, "field 'question' missing or not a string"),
        ({"question": "q", "answer": "no marker"}, "mini.jsonl:2: field 'answer'.*'####'"),
        ({"question": "q", "answer": "#### ten"}, "expected an integer after '####'"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_load_gsm8k_names_the_bad_line(tmp_path: Path, row: object, message: str) -> None:
    f = _write(tmp_path / "mini.jsonl", [{"question": "ok", "answer": "#### 1"}, row])
    with pytest.raises(gsm8k.DatasetError, match=message):
        gsm8k.load_gsm8k(f)


def test_load_gsm8k_missing_file(tmp_path: Path) -> None:
    with pytest.raises(gsm8k.DatasetError, match="not found"):
        gsm8k.load_gsm8k(tmp_path / "absent.jsonl")


def test_default_path_can_be_overridden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(gsm8k.ENV_PATH, str(tmp_path / "x.jsonl"))
    assert gsm8k.default_path() == tmp_path / "x.jsonl"


@pytest.mark.skipif(not gsm8k.DEFAULT_PATH.is_file(), reason="shared GSM8K copy not present")
def test_the_real_gsm8k_test_split() -> None:
    problems = gsm8k.load_gsm8k(gsm8k.DEFAULT_PATH)
    assert len(problems) == 1319
    assert problems[0].result == 18
    assert all(score(p.answer, p.answer) == (True, True) for p in problems)


def test_lm_eval_prompt_format_with_fewshot_examples() -> None:
    a = Problem("a", "What is 1+1?", "1+1=2\n#### 2", 2)
    b = Problem("b", "What is 2+3?", "2+3=5\n#### 5", 5)
    q = Problem("q", "What is 4+4?", "#### 8", 8)
    text = gsm8k.format_prompt(q, "lm-eval", [a, b])
    assert text == (
        "Question: What is 1+1?\nAnswer: 1+1=2\n#### 2\n\n"
        "Question: What is 2+3?\nAnswer: 2+3=5\n#### 5\n\n"
        "Question: What is 4+4?\nAnswer:"
    )
    assert gsm8k.format_prompt(q, "lm-eval") == "Question: What is 4+4?\nAnswer:"
    assert gsm8k.format_prompt(q) == prompt(q) == "Q: What is 4+4?\nA: "
    with pytest.raises(ValueError, match="no few-shot"):
        gsm8k.format_prompt(q, "plain", [a])


def test_a_preset_prompt_text_is_the_prompt() -> None:
    q = Problem("q", "What is 4+4?", "#### 8", 8, prompt_text="Question: What is 4+4?\nAnswer:")
    assert prompt(q) == "Question: What is 4+4?\nAnswer:"


def test_scoring_cuts_the_generation_at_the_first_stop_sequence() -> None:
    # the model answers, then invents a next question whose numbers would fool flexible-extract
    text = " 4+4=8\n#### 8\n\nQuestion: what is 9+9?\nAnswer: 18"
    assert score(text, 8) == (True, True)
    assert score("#### 8 Question: 7", 7) == (False, False)


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate() -> None:
    from agents.workloads.arrival import poisson_offsets

    offsets = poisson_offsets(4000, rate_per_s=2.0, seed=5)
    assert offsets == poisson_offsets(4000, rate_per_s=2.0, seed=5)
    assert offsets != poisson_offsets(4000, rate_per_s=2.0, seed=6)
    assert all(b > a for a, b in zip(offsets, offsets[1:]))
    # 4000 arrivals at 2/s: the mean gap 0.5 s has a standard error of 0.5/sqrt(4000) = 0.008
    assert abs(offsets[-1] / 4000 - 0.5) < 5 * 0.5 / 4000**0.5
    with pytest.raises(ValueError):
        poisson_offsets(3, 0.0, 1)


@pytest.mark.skipif(not gsm8k.DEFAULT_PATH.is_file(), reason="shared GSM8K copy not present")
def test_gsm8k_workload_in_lm_eval_format_takes_the_first_train_problems() -> None:
    from testbed.config.playbook import WorkloadSection
    from testbed.runner.workload import problems_for

    workload = WorkloadSection(
        kind="gsm8k", gsm8k_path=str(gsm8k.DEFAULT_PATH), problems_per_device=2,
        prompt_format="lm-eval", fewshot=3,
    )  # fmt: skip
    problems = problems_for(workload, ["d1", "d2"])
    first = problems["d1"][0]
    train = gsm8k.load_gsm8k(gsm8k.train_path(gsm8k.DEFAULT_PATH), limit=3)
    text = prompt(first)
    assert text.startswith(f"Question: {train[0].question}\nAnswer: {train[0].answer}\n\n")
    assert text.count("Question: ") == 4 and text.endswith(f"{first.question}\nAnswer:")
    assert first.id.endswith("-lm-eval3")
    assert problems["d2"][1].question != first.question


@pytest.mark.skipif(not gsm8k.DEFAULT_PATH.is_file(), reason="shared GSM8K copy not present")
def test_problems_longer_than_max_prompt_tokens_are_passed_over(tiny_pair) -> None:
    from tokenizers import Tokenizer

    from testbed.config.playbook import WorkloadSection
    from testbed.runner.workload import problems_for

    workload = WorkloadSection(
        kind="gsm8k", gsm8k_path=str(gsm8k.DEFAULT_PATH), problems_per_device=3,
        prompt_format="lm-eval", max_prompt_tokens=150,
    )  # fmt: skip
    target = str(tiny_pair.target_hf)
    problems = [p for ps in problems_for(workload, ["d1", "d2"], target).values() for p in ps]
    tok = Tokenizer.from_file(str(tiny_pair.target_hf / "tokenizer.json"))
    lengths = [len(tok.encode(prompt(p)).ids) for p in problems]
    assert len(problems) == 6 and max(lengths) <= 150
    everything = gsm8k.load_gsm8k(gsm8k.DEFAULT_PATH, limit=6)
    assert [p.question for p in problems] != [p.question for p in everything]  # some skipped
