"""Greedy generation over an `Engine`, held-out accuracy and draft/target token agreement."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.engines.base import Engine
from agents.workloads.arithmetic import Problem, prompt
from agents.workloads.scoring import score


def greedy_generate(
    engine: Engine, prompts: Sequence[Sequence[int]], max_new: int, batch_size: int = 50
) -> list[list[int]]:
    """Greedy continuations of prompts (ids, BOS included), each ending at EOS or max_new.

    Prompts run batch_size at a time through `score_batch`; a returned continuation keeps its
    EOS if it produced one.
    """
    outputs: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        sids = [engine.open() for _ in chunk]
        try:
            gen: dict[int, list[int]] = {sid: [] for sid in sids}
            logits = engine.score_batch({sid: list(p) for sid, p in zip(sids, chunk)})
            live = list(sids)
            while live:
                feed: dict[int, list[int]] = {}
                for sid in live:
                    t = int(np.argmax(logits[sid][-1]))
                    gen[sid].append(t)
                    if t != engine.eos_id and len(gen[sid]) < max_new:
                        feed[sid] = [t]
                live = list(feed)
                if live:
                    logits = engine.score_batch(feed)
            outputs.extend(gen[sid] for sid in sids)
        finally:
            for sid in sids:
                engine.close(sid)
    return outputs


@dataclass
class Accuracy:
    """Held-out accuracy of greedy answers, scored like lm-eval's GSM8K."""

    n: int
    exact_match: float  # strict `#### N`
    flexible: float  # last number
    by_kind: dict[str, float] = field(default_factory=dict)
    answers: list[list[int]] = field(default_factory=list, repr=False)


def heldout_accuracy(engine: Engine, problems: Sequence[Problem], max_new: int) -> Accuracy:
    """Generate each problem's answer greedily and score it (strict and flexible)."""
    prompts = [engine.tokenize(prompt(p)) for p in problems]
    answers = greedy_generate(engine, prompts, max_new)
    strict = flexible = 0
    kinds: dict[str, list[bool]] = {}
    for problem, ids in zip(problems, answers):
        s_ok, f_ok = score(engine.detokenize(ids), problem.result)
        strict += s_ok
        flexible += f_ok
        kinds.setdefault(problem.kind, []).append(s_ok)
    n = max(1, len(problems))
    by_kind = {k: round(sum(v) / len(v), 4) for k, v in sorted(kinds.items())}
    return Accuracy(len(problems), round(strict / n, 4), round(flexible / n, 4), by_kind, answers)


def token_agreement(
    draft: Engine,
    prompts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    batch_size: int = 50,
) -> tuple[int, int]:
    """(agreeing, total): how often the draft's greedy token equals each continuation token.

    Teacher-forced: the draft reads prompt + continuation and its argmax at every position of
    the continuation is compared with the token there (the target's greedy choice when the
    continuations are the target's greedy answers).
    """
    agree = total = 0
    pairs = [(list(p), list(c)) for p, c in zip(prompts, continuations) if c]
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        sids = [draft.open() for _ in chunk]
        try:
            logits = draft.score_batch({sid: p + c for sid, (p, c) in zip(sids, chunk)})
            for sid, (p, c) in zip(sids, chunk):
                pred = logits[sid][len(p) - 1 : len(p) - 1 + len(c)].argmax(-1)
                agree += int((pred == np.asarray(c)).sum())
                total += len(c)
        finally:
            for sid in sids:
                draft.close(sid)
    return agree, total
