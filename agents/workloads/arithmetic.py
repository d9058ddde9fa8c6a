"""Synthetic GSM8K-style arithmetic word problems, deterministic given a seed.

Each problem has a one- or two-step question, worked steps (one equation a line) and a final
line `#### N`, the GSM8K answer format. Problems fall in two disjoint splits decided by a hash
of the question text, so a held-out problem never appears among the training questions however
many training problems are drawn. `prompt` is the one prompt format used everywhere (training,
evaluation, agents): the model continues it with the answer and then EOS.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "heldout"]

NAMES = (
    "Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Kim",
    "Raj", "Eva", "Leo", "Nora", "Sam", "Ivy", "Max", "Zoe",
)  # fmt: skip
ITEMS = (
    "apples", "pens", "books", "coins", "cards", "eggs",
    "shells", "stamps", "marbles", "cookies", "toys", "rocks",
)  # fmt: skip

HELDOUT_BUCKETS = 10  # one question in HELDOUT_BUCKETS (by hash) belongs to the held-out split


@dataclass(frozen=True)
class Problem:
    """A word problem: its question, the reference answer text (ending `#### N`) and N.

    A problem asked as a request of a workload that stands for another (`workload.stands_for`)
    also carries its prompt as token ids of the stood-for length (`prompt_ids`), the answer
    length it is held to (`max_new`: exactly that many tokens, EOS not ending it) and the
    stood-for request it takes those lengths from (`stands_for`, e.g. a GSM8K question's id).
    """

    id: str
    question: str
    answer: str
    result: int
    kind: str = ""
    prompt_text: str | None = None  # the whole prompt, when not the plain one (few-shot etc.)
    prompt_ids: tuple[int, ...] | None = None
    max_new: int | None = None
    stands_for: str | None = None
    prompt_tokens: int | None = None  # the stood-for prompt's length (its ids, once built)


def prompt(problem: Problem) -> str:
    """The prompt every model sees: `prompt_text` when set, else `Q: <question>\\nA: `."""
    if problem.prompt_text is not None:
        return problem.prompt_text
    return f"Q: {problem.question}\nA: "


def full_text(problem: Problem) -> str:
    """Prompt followed by the reference answer (what the tiny models are trained on)."""
    return prompt(problem) + problem.answer


def is_heldout(question: str) -> bool:
    """Whether a question belongs to the held-out split (a fixed hash partition)."""
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_BUCKETS == 0


def _add(rng: random.Random, n: str, m: str, it: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    q = f"{n} has {a} {it}. {m} gives {n} {b} more. How many {it} does {n} have now?"
    return q, [f"{a} + {b} = {a + b}"], a + b


def _sub(rng: random.Random, n: str, m: str, it: str) -> tuple[str, list[str], int]:
    a = rng.randint(10, 40)
    b = rng.randint(1, a - 1)
    q = f"{n} had {a} {it} and gave {b} to {m}. How many {it} does {n} have left?"
    return q, [f"{a} - {b} = {a - b}"], a - b


def _mul(rng: random.Random, n: str, m: str, it: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    q = f"{n} buys {a} bags with {b} {it} in each bag. How many {it} does {n} buy?"
    return q, [f"{a} * {b} = {a * b}"], a * b


def _add_sub(rng: random.Random, n: str, m: str, it: str) -> tuple[str, list[str], int]:
    a, b = rng.randint(2, 25), rng.randint(2, 25)
    c = rng.randint(1, a + b - 1)
    q = (
        f"{n} has {a} {it} and finds {b} more. Then {n} gives {c} to {m}. "
        f"How many {it} does {n} have?"
    )
    return q, [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"], a + b - c


def _mul_add(rng: random.Random, n: str, m: str, it: str) -> tuple[str, list[str], int]:
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    q = f"{n} has {a} boxes of {b} {it} and {c} loose {it}. How many {it} does {n} have in total?"
    return q, [f"{a} * {b} = {a * b}", f"{a * b} + {c} = {a * b + c}"], a * b + c


_Template = Callable[[random.Random, str, str, str], tuple[str, list[str], int]]
TEMPLATES: dict[str, _Template] = {
    "add": _add,
    "sub": _sub,
    "mul": _mul,
    "add_sub": _add_sub,
    "mul_add": _mul_add,
}


def _draw(rng: random.Random) -> tuple[str, str, int, str]:
    name = rng.choice(NAMES)
    other = rng.choice([x for x in NAMES if x != name])
    item = rng.choice(ITEMS)
    kind = rng.choice(sorted(TEMPLATES))
    question, steps, result = TEMPLATES[kind](rng, name, other, item)
    return question, "\n".join(steps) + f"\n#### {result}", result, kind


def make_problems(n: int, seed: int, split: Split = "train", unique: bool = False) -> list[Problem]:
    """The first n problems of a split drawn from a generator seeded with seed.

    The same (n, seed, split) always gives the same list, and a longer list extends a shorter
    one. With unique=True a question is never repeated (the held-out set uses it).
    """
    if n < 0:
        raise ValueError(f"make_problems: n must be >= 0, got {n}")
    if split not in ("train", "heldout"):
        raise ValueError(f"make_problems: split must be 'train' or 'heldout', got {split!r}")
    want_heldout = split == "heldout"
    rng = random.Random(seed)
    out: list[Problem] = []
    seen: set[str] = set()
    draws = 0
    while len(out) < n:
        draws += 1
        if draws > 1000 * (n + 10):
            raise RuntimeError(f"make_problems: could not draw {n} {split} problems")
        question, answer, result, kind = _draw(rng)
        if is_heldout(question) != want_heldout or (unique and question in seen):
            continue
        seen.add(question)
        out.append(Problem(f"arith-{split}-{seed}-{len(out)}", question, answer, result, kind))
    return out


def train_problems(n: int, seed: int = 1) -> list[Problem]:
    """Training problems (never in the held-out split)."""
    return make_problems(n, seed, "train")


def heldout_problems(n: int, seed: int = 2) -> list[Problem]:
    """Distinct held-out problems, disjoint from every training question."""
    return make_problems(n, seed, "heldout", unique=True)
