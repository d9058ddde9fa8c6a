"""Load GSM8K from its jsonl files (one `{"question", "answer"}` object a line).

The data set is read in place from a path the caller gives; it is never copied into the
repository. The reference answer is the number after the last `#### ` of the answer text.
Problems come back as `arithmetic.Problem`, so one prompt format and one scorer serve both
workloads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agents.workloads.arithmetic import Problem

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
