"""GSM8K answer scoring as lm-evaluation-harness does it (task `gsm8k`).

Two filters pick an answer out of a generation:
- strict-match: the first `#### N` (regex `#### (\\-?[0-9\\.\\,]+)`);
- flexible-extract: the last number-like run (regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`).
Both the extracted answer and the reference then go through the exact-match normalisation of
the task (case folded; `,`, `$`, everything up to `#### ` and a final `.` removed) and are
compared as strings, so "1,000" matches "1000" and "18." matches "18". As in the task's
`generate_until`, a generation is first cut at the first stop sequence (`UNTIL`), so a model
that goes on to invent the next "Question:" is scored on its own answer only.
"""

from __future__ import annotations

import re

STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
UNTIL = ("Question:", "</s>", "<|im_end|>")
_IGNORE = [re.compile(p) for p in (r",", r"\$", r"(?s).*#### ", r"\.$")]


def extract_strict(text: str) -> str | None:
    """The number after the first `#### ` in text, or None."""
    match = STRICT_RE.search(text)
    return match.group(1).strip() if match else None


def extract_flexible(text: str) -> str | None:
    """The last number-like run in text (lm-eval's flexible-extract), or None."""
    matches = FLEXIBLE_RE.findall(text)
    if not matches:
        return None
    groups = [g for g in matches[-1] if g]
    return groups[0].strip() if groups else None


def normalize(answer: str) -> str:
    """lm-eval's exact-match normalisation for GSM8K."""
    for pattern in _IGNORE:
        answer = pattern.sub("", answer)
    return answer.strip().lower()


def reference_answer(reference: str | int) -> str:
    """Normalised reference: an int, a number string, or a full GSM8K answer ending `#### N`."""
    return normalize(str(reference))


def as_number(answer: str | None) -> int | float | None:
    """An extracted answer as a number (commas and `$` dropped), or None if it is not one."""
    if answer is None:
        return None
    text = normalize(answer)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def cut_at_stop(text: str) -> str:
    """text up to the first stop sequence of `UNTIL` (all of it when none occurs)."""
    cut = min((i for i in (text.find(u) for u in UNTIL) if i >= 0), default=len(text))
    return text[:cut]


def score(text: str, reference: str | int) -> tuple[bool, bool]:
    """(strict_ok, flexible_ok) for a generation against a reference answer."""
    text = cut_at_stop(text)
    ref = reference_answer(reference)
    strict = extract_strict(text)
    flexible = extract_flexible(text)
    strict_ok = strict is not None and normalize(strict) == ref
    flexible_ok = flexible is not None and normalize(flexible) == ref
    return strict_ok, flexible_ok
