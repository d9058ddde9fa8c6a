"""AD vs SD on the same model pair and machine, against the analytic speedup bound.

For draft length g, per-token acceptance probability a and cost ratio c (one draft step over
one target step), speculative decoding's expected speedup over autoregressive decoding is at
most (1 - a^(g+1)) / ((1 - a)(g c + 1)) (Leviathan et al. 2023). `a` is estimated as the
maximum-likelihood per-position acceptance probability: accepted drafts over positions
examined (accepted plus the rounds that ended in a rejection).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from agents.engines.base import Engine
from agents.spec.decoding import generate_ad, generate_sd
from agents.spec.session import TrackedSession


@dataclass
class SdBenchResult:
    prompts: int
    draft_len: int
    ad_tokens: int
    ad_seconds: float
    sd_tokens: int
    sd_seconds: float
    rounds: int
    acceptance_rate: float  # accepted / drafted
    alpha: float  # per-position acceptance probability (MLE)
    mean_accepted_len: float  # tokens per round, bonus/correction included
    draft_step_ms: float
    target_step_ms: float
    identical_outputs: int  # prompts whose SD output equals the AD output

    @property
    def cost_ratio(self) -> float:
        return self.draft_step_ms / self.target_step_ms

    @property
    def speedup(self) -> float:
        return (self.sd_tokens / self.sd_seconds) / (self.ad_tokens / self.ad_seconds)

    @property
    def bound(self) -> float:
        return analytic_speedup(self.alpha, self.draft_len, self.cost_ratio)

    def as_dict(self) -> dict[str, float]:
        return {
            **asdict(self),
            "cost_ratio": self.cost_ratio,
            "speedup": self.speedup,
            "bound": self.bound,
            "speedup_over_bound": self.speedup / self.bound,
        }


def analytic_speedup(a: float, g: int, c: float) -> float:
    """(1 - a^(g+1)) / ((1 - a)(g c + 1)); the a -> 1 limit is (g+1)/(g c + 1)."""
    tokens = g + 1 if a >= 1 else (1 - a ** (g + 1)) / (1 - a)
    return tokens / (g * c + 1)


def step_ms(engine: Engine, prompt: list[int], repeats: int = 50) -> float:
    """Median time of one single-token decode step after prompt (the cache holds the prompt)."""
    session = TrackedSession(engine)
    try:
        session.score(prompt)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            session.score([prompt[-1]])
            times.append(time.perf_counter() - t0)
            session.truncate(len(prompt))
        return statistics.median(times) * 1000
    finally:
        session.close()


def run_sd_bench(
    draft: Engine, target: Engine, prompts: list[list[int]], draft_len: int, max_new: int
) -> SdBenchResult:
    """Warm up, then run AD and SD over the same prompts, interleaved prompt by prompt."""
    generate_ad(target, prompts[0], 4)
    generate_sd(draft, target, prompts[0], 4, draft_len)
    ad_t = sd_t = 0.0
    ad_n = sd_n = rounds = accepted = drafted = rejections = same = 0
    lengths: list[int] = []
    for p in prompts:
        ad = generate_ad(target, p, max_new)
        sd = generate_sd(draft, target, p, max_new, draft_len)
        ad_t += ad.seconds
        sd_t += sd.seconds
        ad_n += len(ad.tokens)
        sd_n += len(sd.tokens)
        rounds += sd.rounds
        accepted += sd.accepted
        drafted += sd.drafted
        rejections += sum(1 for n in sd.accepted_lengths if n <= draft_len)
        lengths.extend(sd.accepted_lengths)
        same += ad.tokens == sd.tokens
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    return SdBenchResult(
        prompts=len(prompts),
        draft_len=draft_len,
        ad_tokens=ad_n,
        ad_seconds=ad_t,
        sd_tokens=sd_n,
        sd_seconds=sd_t,
        rounds=rounds,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        alpha=alpha,
        mean_accepted_len=float(np.mean(lengths)) if lengths else 0.0,
        draft_step_ms=step_ms(draft, prompts[0]),
        target_step_ms=step_ms(target, prompts[0]),
        identical_outputs=same,
    )
