"""BALANCE runs: the hybrid against the better single mode at each sweep point.

Within one repetition the three policies serve the same users, so they are compared in pairs:
per repetition, the hybrid's users in time minus the better of AD-only's and SD-only's in that
repetition; over repetitions, the mean of that margin with its 95 % t-interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from testbed.config.playbook import REPETITION as REPETITION_KEY
from testbed.core.stats import MeanCI, mean_ci

POLICY = "sweep.balance.policy"
REPETITION = f"sweep.{REPETITION_KEY}"
SINGLE = ("ad-only", "sd-only")
COMPARISON_NOTE = (
    "hybrid - better: per repetition (the same users for every policy), the hybrid's users in "
    "time minus the better single mode's; mean and 95 % t-interval over repetitions"
)


@dataclass(frozen=True)
class PointComparison:
    """One sweep point: mean users in time per policy, and the hybrid's paired margin."""

    point: dict[str, Any]  # the swept values other than policy and repetition
    in_time: dict[str, float]  # policy -> mean users in time over the repetitions compared
    margin: MeanCI  # hybrid minus the better single mode, per repetition

    @property
    def verdict(self) -> str:
        """Where the hybrid stands on average (`standing` of the mean margin)."""
        return standing(self.margin.mean or 0.0)


def standing(margin: float) -> str:
    """above / equal / below: the sign of the hybrid's margin over the better single mode."""
    return "above" if margin > 0 else ("below" if margin < 0 else "equal")


def compare_policies(df: pd.DataFrame) -> list[PointComparison]:
    """Per sweep point, the three policies over the repetitions in which all three finished;
    empty unless the run sweeps `balance.policy` over all three."""
    if POLICY not in df.columns or not {*SINGLE, "hybrid"} <= set(df[POLICY].dropna()):
        return []
    done = df[(df["status"] == "done") & df["served_in_time"].notna()]
    done = done.assign(_rep=done[REPETITION] if REPETITION in done.columns else 0)
    keys = [c for c in df.columns if c.startswith("sweep.") and c not in (POLICY, REPETITION)]
    groups = done.groupby(keys, sort=True) if keys else [((), done)]
    points = []
    for values, part in groups:
        wide = part.pivot_table(index="_rep", columns=POLICY, values="served_in_time")
        wide = wide.dropna(subset=[p for p in (*SINGLE, "hybrid") if p in wide.columns])
        if wide.empty or not {*SINGLE, "hybrid"} <= set(wide.columns):
            continue
        values = values if isinstance(values, tuple) else (values,)
        margins = wide["hybrid"] - wide[list(SINGLE)].max(axis=1)
        points.append(
            PointComparison(
                point={k.removeprefix("sweep."): v for k, v in zip(keys, values, strict=True)},
                in_time={p: float(wide[p].mean()) for p in (*SINGLE, "hybrid")},
                margin=mean_ci([float(m) for m in margins]),
            )
        )
    return points


def comparison_rows(points: list[PointComparison]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the printed comparison."""
    headers = ["point", "AD-only", "SD-only", "hybrid", "reps", "hybrid - better (95 % CI)"]
    headers.append("hybrid is")
    rows = []
    for p in points:
        ci = p.margin
        interval = f"{ci.mean:+.1f}" + (f" [{ci.low:+.1f}, {ci.high:+.1f}]" if ci.n > 1 else "")
        rows.append(
            [", ".join(f"{k}={v}" for k, v in p.point.items()) or "all"]
            + [f"{p.in_time[k]:.1f}" for k in (*SINGLE, "hybrid")]
            + [str(ci.n), interval, p.verdict]
        )
    return headers, rows
