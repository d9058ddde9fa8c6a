"""Load GSM8K from its jsonl files (one `{"question", "answer"}` object a line).

The data set is read in place from a path the caller gives; it is never copied into the
repository. The reference answer is the number after the last `#### ` of the answer text.
Problems come back as `arithmetic.Problem`, so one prompt format and one scorer serve both
workloads.

Prompt formats: `plain` is the tiny models' own `Q: ...\nA: ` (what they were trained on);
`lm-eval` follows lm-evaluation-harness's `gsm8k` task: each solved example as
`Question: <q>\nAnswer: <worked answer>`, examples joined by a blank line, then
`Question: <q>\nAnswer:`. The examples are the first `fewshot` problems of the train split
(lm-eval's `first_n` sampler; the task's default is 5).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agents.workloads.arithmetic import Problem, prompt

DEFAULT_PATH = Path("/work/shared/datasets/gsm8k/test.jsonl")
ENV_PATH = "TESTBED_GSM8K"  # overrides DEFAULT_PATH when no path is given


class DatasetError(ValueError):
    """A data set file is missing or malformed; the message names the file and line."""


def default_path() -> Path:
    """`$TESTBED_GSM8K` if set, else the shared copy of the GSM8K test split."""
    env = os.environ.get(ENV_PATH)
    return Path(env) if env else DEFAULT_PATH


def reference_number(answer: str, where: str = "answer") -> int:
    """The integer after the last `#### ` of a GSM8K answer (commas dropped)."""
    if "####" not in answer:
        raise DatasetError(f"{where}: expected an answer ending with '#### N', found no '####'")
    tail = answer.rsplit("####", 1)[1].strip().replace(",", "")
    try:
        return int(tail)
    except ValueError:
        raise DatasetError(f"{where}: expected an integer after '####', got {tail!r}") from None


def load_gsm8k(path: str | Path | None = None, limit: int | None = None) -> list[Problem]:
    """Problems of a GSM8K jsonl file (default: `default_path()`), at most limit of them."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise DatasetError(f"{path}: GSM8K file not found (expected a jsonl file)")
    problems: list[Problem] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(problems) >= limit:
                break
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: expected a JSON object with question and answer")
            for field in ("question", "answer"):
                if not isinstance(obj.get(field), str):
                    raise DatasetError(f"{where}: field {field!r} missing or not a string")
            result = reference_number(obj["answer"], f"{where}: field 'answer'")
            pid = f"gsm8k-{path.stem}-{len(problems)}"
            problems.append(Problem(pid, obj["question"], obj["answer"], result))
    return problems


FEWSHOT_DELIMITER = "\n\n"
PROMPT_FORMATS = ("plain", "lm-eval")


def lm_eval_question(question: str) -> str:
    """lm-eval's gsm8k `doc_to_text`."""
    return f"Question: {question}\nAnswer:"


def format_prompt(
    problem: Problem, fmt: str = "plain", examples: list[Problem] | None = None
) -> str:
    """The prompt of `problem` in format `fmt`, after the solved `examples` (lm-eval only)."""
    if fmt == "plain":
        if examples:
            raise ValueError("the plain prompt format takes no few-shot examples")
        return prompt(problem)
    if fmt != "lm-eval":
        raise ValueError(f"prompt format: expected one of {PROMPT_FORMATS}, got {fmt!r}")
    shots = [f"{lm_eval_question(e.question)} {e.answer}" for e in examples or []]
    return FEWSHOT_DELIMITER.join([*shots, lm_eval_question(problem.question)])


def train_path(test_path: Path) -> Path:
    """The train split beside a test split (`test.jsonl` -> `train.jsonl`)."""
    return test_path.with_name("train.jsonl")
