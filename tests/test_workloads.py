"""Synthetic arithmetic problems, GSM8K loading and lm-eval-style answer scoring."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agents.workloads import gsm8k
from agents.workloads.arithmetic import (
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
