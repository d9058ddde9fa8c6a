"""AD vs SD on the same model pair and machine, against the analytic speedup bound.

For draft length g, per-token acceptance probability a and cost ratio c (one draft step over
one target step), speculative decoding's expected speedup over autoregressive decoding is
(1 - a^(g+1)) / ((1 - a)(g c + 1)) (Leviathan et al. 2023). The formula assumes that the
target verifies g+1 tokens in the time of one step, which holds where a forward is
memory-bound (GPUs) but not for a tiny model on a CPU; so the benchmark also measures the
verification cost ratio v = (time of one verification) / (time of one AD step) and reports the
cost-aware bound (1 - a^(g+1)) / ((1 - a)(g c + v)), which isolates the implementation's own
overhead.

All costs are measured inside the same run: c from the time SD spent drafting per drafted
token, v from the time it spent verifying per round, both over the AD time per token. `a` is
the maximum-likelihood per-position acceptance probability: accepted drafts over positions
examined (accepted plus the rounds that ended in a rejection).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from agents.engines.base import Engine
from agents.spec.decoding import generate_ad, generate_sd
from agents.spec.rates import acceptance_rate, mean_accepted_length


@dataclass
class SdBenchResult:
    prompts: int
    draft_len: int
    ad_tokens: int = 0
    ad_seconds: float = 0.0
    sd_tokens: int = 0
    sd_seconds: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    identical_outputs: int = 0  # prompts whose SD output equals the AD output
    round_token_counts: list[int] = field(default_factory=list)  # rounds that yielded 1..g+1

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted (agents.spec.rates)."""
        return acceptance_rate(self.accepted, self.drafted) or 0.0

    @property
    def alpha(self) -> float:
        """Per-position acceptance probability (MLE)."""
        seen = self.accepted + self.rejections
        return self.accepted / seen if seen else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """(accepted + rounds) / rounds, the bonus/correction token included (agents.spec.rates)."""
        return mean_accepted_length(self.accepted, self.rounds) or 0.0

    @property
    def ad_step_s(self) -> float:
        return self.ad_seconds / self.ad_tokens

    @property
    def cost_ratio(self) -> float:
        """c: one draft step over one target (AD) step."""
        return (self.draft_seconds / self.drafted) / self.ad_step_s

    @property
    def verify_ratio(self) -> float:
        """v: one verification of g+1 tokens over one target (AD) step."""
        return (self.verify_seconds / self.rounds) / self.ad_step_s

    @property
    def speedup(self) -> float:
        return (self.sd_tokens / self.sd_seconds) / (self.ad_tokens / self.ad_seconds)

    @property
    def bound(self) -> float:
        return analytic_speedup(self.alpha, self.draft_len, self.cost_ratio)

    @property
    def cost_aware_bound(self) -> float:
        return analytic_speedup(self.alpha, self.draft_len, self.cost_ratio, self.verify_ratio)

    def as_dict(self) -> dict[str, float]:
        derived = [
            "acceptance_rate",
            "alpha",
            "mean_accepted_length",
            "cost_ratio",
            "verify_ratio",
            "speedup",
            "bound",
            "cost_aware_bound",
        ]
        out = {**asdict(self), **{name: getattr(self, name) for name in derived}}
        out["speedup_over_bound"] = self.speedup / self.bound
        out["speedup_over_cost_aware_bound"] = self.speedup / self.cost_aware_bound
        return out


def analytic_speedup(a: float, g: int, c: float, v: float = 1.0) -> float:
    """(1 - a^(g+1)) / ((1 - a)(g c + v)); the a -> 1 limit has g+1 tokens per round."""
    tokens = g + 1 if a >= 1 else (1 - a ** (g + 1)) / (1 - a)
    return tokens / (g * c + v)


def run_sd_bench(
    draft: Engine, target: Engine, prompts: list[list[int]], draft_len: int, max_new: int
) -> SdBenchResult:
    """Warm up, then run AD and SD over the same prompts, interleaved prompt by prompt."""
    generate_ad(target, prompts[0], 4)
    generate_sd(draft, target, prompts[0], 4, draft_len)
    r = SdBenchResult(len(prompts), draft_len, round_token_counts=[0] * (draft_len + 1))
    for p in prompts:
        ad = generate_ad(target, p, max_new)
        sd = generate_sd(draft, target, p, max_new, draft_len)
        r.ad_seconds += ad.seconds
        r.ad_tokens += len(ad.tokens)
        r.sd_seconds += sd.seconds
        r.sd_tokens += len(sd.tokens)
        r.rounds += sd.rounds
        r.drafted += sd.drafted
        r.accepted += sd.accepted
        r.rejections += sd.rejections
        r.draft_seconds += sd.draft_seconds
        r.verify_seconds += sd.verify_seconds
        r.identical_outputs += ad.tokens == sd.tokens
        for n in sd.accepted_lengths:  # 1..g+1, the bonus or correction token included
            r.round_token_counts[n - 1] += 1
    return r
