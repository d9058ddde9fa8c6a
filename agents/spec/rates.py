"""The two speculative-decoding rates, defined once for agents and controller alike.

Over the *verified* rounds of a run (rounds whose drafts the target judged):

- acceptance rate = accepted draft tokens / drafted tokens (vLLM's `draft_acceptance_rate`);
- mean accepted length = (accepted draft tokens + verified rounds) / verified rounds, i.e. the
  mean over rounds of (accepted + 1): every verdict adds one token of its own, the correction
  after a rejection or the bonus token after a fully accepted draft. It counts what the
  verdicts yield, before an answer is cut short at EOS or at its token budget;
- per-token acceptance alpha = accepted / (accepted + rejections), where a rejection is a
  verified round that accepted fewer drafts than it sent: the maximum-likelihood alpha of the
  i.i.d. model in which each draft is accepted with probability alpha until the first
  rejection. Unlike the acceptance rate it does not depend on the draft length, so it is what
  a run's acceptance is compared with a published one by (`alpha_from_tau` turns a published
  mean accepted length at draft length k into it: tau = (1 - alpha^(k+1)) / (1 - alpha)).

`testbed.metrics` re-exports these; nothing else defines them.
"""

from __future__ import annotations


def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """accepted / drafted; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def mean_accepted_length(accepted: int, rounds: int) -> float | None:
    """(accepted + rounds) / rounds, the bonus or correction token included; None for 0 rounds."""
    return (accepted + rounds) / rounds if rounds else None


def per_token_acceptance(accepted: int, rejections: int) -> float | None:
    """accepted / (accepted + rejections): the i.i.d. model's maximum-likelihood alpha; None
    when no draft was judged."""
    judged = accepted + rejections
    return accepted / judged if judged else None


def tokens_per_round(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha): the mean tokens a verification of k i.i.d. drafts
    yields (bonus or correction included); k + 1 at alpha = 1."""
    if not 0 <= alpha <= 1 or k < 1:
        raise ValueError(f"expected 0 <= alpha <= 1 and k >= 1, got alpha={alpha}, k={k}")
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_from_tau(tau: float, k: int) -> float:
    """The per-token alpha whose i.i.d. mean tokens a round at draft length k is tau (bisection
    on `tokens_per_round`, increasing in alpha); tau must lie in [1, k + 1)."""
    if not 1 <= tau < k + 1:
        raise ValueError(f"tau {tau} at draft length {k}: expected 1 <= tau < {k + 1}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_round(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2
