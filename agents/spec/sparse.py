"""Sparse draft distributions: what a sampling device sends so the server can verify exactly.

The device samples each draft token from q = top-k truncation of softmax(logits / T),
renormalised, and sends q as (ids, probs). The acceptance rule of speculative sampling is
exact for any proposal distribution q, as long as the verifier uses the very q the token was
drawn from, so truncating the draft's distribution changes acceptance, never the output's
distribution (which stays the target's at temperature T).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.spec.acceptance import probabilities


def top_k_distribution(
    logits: np.ndarray, temperature: float, k: int
) -> tuple[list[int], list[float]]:
    """The k most likely token ids and their renormalised probabilities at temperature."""
    p = probabilities(logits, temperature)
    k = min(k, p.shape[-1])
    ids = np.argpartition(-p, k - 1)[:k]
    ids = ids[np.argsort(-p[ids], kind="stable")]
    probs = p[ids] / p[ids].sum()
    return [int(i) for i in ids], [float(x) for x in probs]


def sparse_rows(q: np.ndarray) -> tuple[list[list[int]], list[list[float]]]:
    """The (ids, probs) of each row's non-zero entries, as sent on the wire."""
    ids = [np.flatnonzero(row) for row in q]
    return [[int(i) for i in r] for r in ids], [
        [float(x) for x in row[r]] for row, r in zip(q, ids)
    ]


def dense_rows(
    ids: Sequence[Sequence[int]], probs: Sequence[Sequence[float]], vocab: int
) -> np.ndarray:
    """(len(ids), vocab) float64 rows with the sparse distributions filled in."""
    out = np.zeros((len(ids), vocab), dtype=np.float64)
    for row, (i, p) in enumerate(zip(ids, probs, strict=True)):
        out[row, np.asarray(i, dtype=np.int64)] = np.asarray(p, dtype=np.float64)
    return out
