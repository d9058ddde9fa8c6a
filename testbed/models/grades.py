"""The tiny pair's graded drafts measured on a workload, and the one nearest an acceptance.

Each draft of the pair's graded family (`TinyPair.draft_names`) runs greedy speculative
decoding against the target over the same requests (their prompt ids and held answer lengths,
at the run's draft length), on the controller with PyTorch; its per-token acceptance is
accepted / (accepted + rejections) (`agents.spec.rates.per_token_acceptance`). Speculative
decoding is lossless whichever draft runs, so the choice changes the acceptance and the
rounds, never the tokens. Measurements are cached per pair, requests and draft length under
the cache folder, so a sweep measures once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from agents.spec.rates import per_token_acceptance
from agents.workloads.arithmetic import Problem, prompt
from agents.workloads.request import NO_STOP
from testbed.core.files import atomic_write_json
from testbed.core.paths import cache_dir
from testbed.models.tiny import TinyPair

SAMPLE = 8  # requests each draft is measured on


@dataclass(frozen=True)
class GradeAcceptance:
    """One draft's acceptance on a set of requests."""

    grade: str
    alpha: float | None
    accepted: int
    rejections: int
    requests: int


def sample_key(pair: TinyPair, problems: Sequence[Problem], draft_len: int) -> str:
    """What a measurement depends on: the pair, the requests' ids and lengths, the draft
    length."""
    blob = json.dumps({
        "pair": pair.manifest["recipe_hash"], "k": draft_len,
        "requests": [[p.id, list(p.prompt_ids or []), p.max_new] for p in problems],
    })  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def measure_grades(
    pair: TinyPair, problems: Sequence[Problem], draft_len: int, default_max_new: int,
    say: Callable[[str], None] = lambda _m: None,
) -> list[GradeAcceptance]:  # fmt: skip
    """Each draft's acceptance over the first SAMPLE problems (cached)."""
    sample = list(problems)[:SAMPLE]
    key = sample_key(pair, sample, draft_len)
    path = cache_dir() / "grades" / f"{key}.json"
    if path.is_file():
        return [GradeAcceptance(**g) for g in json.loads(path.read_text())["grades"]]
    from agents.engines.torch_hf import TorchEngine
    from agents.spec.decoding import generate_sd

    say(f"measuring the acceptance of {len(pair.draft_names)} tiny drafts on {len(sample)} "
        f"requests (once, then cached)")  # fmt: skip
    target = TorchEngine(pair.target_hf, threads=1)
    out = []
    for grade in pair.draft_names:
        draft = TorchEngine(pair.draft_files(grade)[0], threads=1)
        accepted = rejections = 0
        for p in sample:
            ids = list(p.prompt_ids) if p.prompt_ids else target.tokenize(prompt(p))
            held = p.max_new is not None
            gen = generate_sd(draft, target, ids, p.max_new or default_max_new, draft_len,
                              stop_id=NO_STOP if held else None)  # fmt: skip
            accepted, rejections = accepted + gen.accepted, rejections + gen.rejections
        alpha = per_token_acceptance(accepted, rejections)
        out.append(GradeAcceptance(grade, alpha, accepted, rejections, len(sample)))
    atomic_write_json(path, {"key": key, "grades": [asdict(g) for g in out]})
    return out


def nearest(grades: Sequence[GradeAcceptance], alpha: float) -> GradeAcceptance:
    """The grade whose measured alpha is nearest alpha (the first of a tie)."""
    measured = [g for g in grades if g.alpha is not None]
    if not measured:
        raise ValueError("no draft grade has a measured acceptance")
    return min(measured, key=lambda g: abs(float(g.alpha) - alpha))
