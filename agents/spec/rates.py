"""The two speculative-decoding rates, defined once for agents and controller alike.

Over the *verified* rounds of a run (rounds whose drafts the target judged):

- acceptance rate = accepted draft tokens / drafted tokens (vLLM's `draft_acceptance_rate`);
- mean accepted length = (accepted draft tokens + verified rounds) / verified rounds, i.e. the
  mean over rounds of (accepted + 1): every verdict adds one token of its own, the correction
  after a rejection or the bonus token after a fully accepted draft. It counts what the
  verdicts yield, before an answer is cut short at EOS or at its token budget.

`testbed.metrics` re-exports these; nothing else defines them.
"""

from __future__ import annotations


def acceptance_rate(accepted: int, drafted: int) -> float | None:
    """accepted / drafted; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def mean_accepted_length(accepted: int, rounds: int) -> float | None:
    """(accepted + rounds) / rounds, the bonus or correction token included; None for 0 rounds."""
    return (accepted + rounds) / rounds if rounds else None
