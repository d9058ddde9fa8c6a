"""Whether a condition's measured acceptance is that of the pair it stands for.

A condition whose per-token acceptance (`ConditionStats.acceptance_alpha`) differs from the
stood-for pair's published one (`acceptance_as`, topologies/workloads.yaml) by more than
MAX_ACCEPTANCE_GAP is *acceptance unmatched*: its rounds, and so its throughput, are not those
the physical pair would give, the way a condition with forwards behind is unfaithful.
"""

from __future__ import annotations

from typing import Any

MAX_ACCEPTANCE_GAP = 0.05


def acceptance_match(measured: float | None, stood_for: float | None) -> dict[str, Any]:
    """The row's `acceptance_gap` (measured - stood-for) and `acceptance_unmatched` (None
    where either is missing: nothing to compare)."""
    if measured is None or stood_for is None:
        return {"acceptance_gap": None, "acceptance_unmatched": None}
    gap = measured - stood_for
    return {"acceptance_gap": gap, "acceptance_unmatched": abs(gap) > MAX_ACCEPTANCE_GAP}
