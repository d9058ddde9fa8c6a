"""The acceptance rule: greedy special case and the sampling rule's output distribution."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from agents.spec.acceptance import Verdict, probabilities, sample, verify

ALPHA = 0.001  # significance level of the distribution tests (fixed seeds: deterministic)


def test_greedy_accepts_until_first_mismatch_then_emits_target_argmax():
    logits = np.full((4, 6), -5.0)
    for row, best in enumerate([2, 3, 5, 1]):
        logits[row, best] = 5.0
    assert verify(logits, [2, 3, 4]) == Verdict(2, 5)
    assert verify(logits, [2, 3, 5]) == Verdict(3, 1)  # all accepted: bonus from the last row
    assert verify(logits, [0, 3, 5]) == Verdict(0, 2)
    assert Verdict(2, 5).emitted([2, 3, 4]) == [2, 3, 5]


def test_verify_checks_shapes_and_needs_rng_for_sampling():
    with pytest.raises(ValueError, match="k\\+1"):
        verify(np.zeros((2, 4)), [1, 2])
    with pytest.raises(ValueError, match="draft's k probability rows"):
        verify(np.zeros((2, 4)), [1], temperature=1.0, rng=np.random.default_rng(0))


def _chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson chi-square p-value, pooling cells expected to hold fewer than 5 counts."""
    n = counts.sum()
    exp = expected_probs * n
    big = exp >= 5
    obs = np.append(counts[big], counts[~big].sum())
    ex = np.append(exp[big], exp[~big].sum())
    if ex[-1] == 0:
        obs, ex = obs[:-1], ex[:-1]
    return float(stats.chisquare(obs, ex).pvalue)


def test_sampling_rule_output_is_distributed_as_target():
    """Drafts from q, verified against p: emitted tokens are i.i.d. p (2-gram test)."""
    rng = np.random.default_rng(1234)
    vocab, k, n = 6, 3, 12000
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))  # a poor draft: many rejections and residual samples
    p_logits = np.log(p)
    counts = np.zeros((vocab, vocab))
    for _ in range(n):
        out: list[int] = []
        while len(out) < 2:
            drafts = [sample(q, rng) for _ in range(k)]
            verdict = verify(np.tile(p_logits, (k + 1, 1)), drafts, 1.0, np.tile(q, (k, 1)), rng)
            out.extend(verdict.emitted(drafts))
        counts[out[0], out[1]] += 1
    pvalue = _chi_square_p(counts.ravel(), np.outer(p, p).ravel())
    assert pvalue > ALPHA, f"emitted 2-grams differ from p x p (p-value {pvalue:.2g})"


def test_sampling_rule_detects_a_wrong_rule():
    """The test above has power: accepting every draft gives q, which it rejects."""
    rng = np.random.default_rng(99)
    vocab, n = 6, 6000
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))
    counts = np.bincount([sample(q, rng) for _ in range(n)], minlength=vocab)
    assert _chi_square_p(counts, p) < ALPHA


def test_probabilities_is_a_softmax_with_temperature():
    probs = probabilities(np.array([[0.0, np.log(3.0)]]), 1.0)
    assert probs[0] == pytest.approx([0.25, 0.75])
    sharp = probabilities(np.array([0.0, 1.0]), 0.1)
    assert sharp[1] > 0.99
    with pytest.raises(ValueError):
        probabilities(np.zeros(3), 0.0)
