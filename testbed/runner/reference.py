"""The target model's own greedy answers: what every verified SLED answer must equal."""

from __future__ import annotations

import json
from pathlib import Path

from agents.engines.factory import load_engine
from agents.spec.decoding import generate_ad
from agents.workloads.arithmetic import Problem, prompt


def target_answers(
    target: str, problems: list[Problem], max_new: int, cache: Path | None = None
) -> dict[str, str]:
    """problem id -> the target's greedy answer text (AD on the controller).

    Answers are cached in a file under `<problem id>@<max_new>`, so a condition that sweeps
    the answer length gets its own reference.
    """
    known: dict[str, str] = json.loads(cache.read_text()) if cache and cache.exists() else {}
    missing = [p for p in problems if f"{p.id}@{max_new}" not in known]
    if missing:
        engine = load_engine(target, threads=1)
        for p in missing:
            gen = generate_ad(engine, engine.tokenize(prompt(p)), max_new)
            known[f"{p.id}@{max_new}"] = engine.detokenize(gen.tokens)
        if cache:
            cache.write_text(json.dumps(known, indent=1))
    return {p.id: known[f"{p.id}@{max_new}"] for p in problems}
