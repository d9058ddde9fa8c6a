"""The acceptance rule of speculative sampling, written once for every mode.

Given the target's next-token distributions p_0..p_k over the positions after the last
committed token and after each of k drafted tokens, and the draft's distributions q_0..q_{k-1}
from which those tokens were sampled:

- draft token x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i));
- at the first rejection the next token is sampled from norm(max(0, p_i - q_i));
- when all k are accepted a bonus token is sampled from p_k.

The output is distributed exactly as sampling from the target alone (Leviathan et al. 2023,
Chen et al. 2023). With temperature 0 both distributions are one-hot at their argmax, so the
rule reduces to "accept while the draft equals the target's argmax, then emit the target's
argmax": `verify` takes that path without forming probabilities, which keeps greedy decoding
bit-exact with the target's own greedy output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Verdict:
    """Outcome of verifying one round of drafts."""

    accepted: int  # how many drafted tokens were accepted (0..k)
    token: int  # the correction (on rejection) or bonus (all accepted) token

    def emitted(self, drafts: Sequence[int]) -> list[int]:
        """Tokens this round adds to the sequence: accepted drafts then the verdict token."""
        return [*drafts[: self.accepted], self.token]


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of logits / temperature along the last axis, in float64."""
    if temperature <= 0:
        raise ValueError("probabilities() needs temperature > 0; greedy uses argmax")
    z = np.asarray(logits, dtype=np.float64) / temperature
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def pick(logits: np.ndarray, temperature: float, rng: np.random.Generator | None) -> int:
    """Next token from one row of logits: argmax at temperature 0, else a sample."""
    if temperature <= 0:
        return int(np.argmax(logits))
    if rng is None:
        raise ValueError("sampling (temperature > 0) needs a random generator")
    return sample(probabilities(logits, temperature), rng)


def verify(
    target_logits: np.ndarray,
    drafts: Sequence[int],
    temperature: float = 0.0,
    draft_probs: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> Verdict:
    """Apply the acceptance rule to one round.

    target_logits: (k+1, vocab) logits p_0..p_k; drafts: the k drafted tokens;
    draft_probs: (k, vocab) draft distributions q_i the drafts were sampled from (needed when
    temperature > 0).
    """
    k = len(drafts)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"need k+1={k + 1} rows of target logits, got {target_logits.shape[0]}")
    if temperature <= 0:
        best = np.argmax(target_logits, axis=-1)
        for i, x in enumerate(drafts):
            if int(best[i]) != int(x):
                return Verdict(i, int(best[i]))
        return Verdict(k, int(best[k]))
    if draft_probs is None or draft_probs.shape[0] != k:
        raise ValueError("sampling verification needs the draft's k probability rows")
    if rng is None:
        raise ValueError("sampling verification needs a random generator")
    p = probabilities(target_logits, temperature)
    for i, x in enumerate(drafts):
        q_x = float(draft_probs[i, x])
        if q_x <= 0 or rng.random() >= min(1.0, float(p[i, x]) / q_x):
            residual = np.maximum(p[i] - draft_probs[i], 0.0)
            total = residual.sum()
            return Verdict(i, sample(residual / total if total > 0 else p[i], rng))
    return Verdict(k, sample(p[k], rng))
