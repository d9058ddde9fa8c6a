"""BALANCE runs: the hybrid against the better single mode at each sweep point.

Within one repetition the three policies serve the same users, so they are compared in pairs:
per repetition, the hybrid's users in time minus the better of AD-only's and SD-only's in that
repetition; over repetitions, the mean of that margin with its 95 % t-interval. Beside it,
per policy, the latency its users saw (TTFT and TPOT at the 90th percentile) and its peak
memory against the budget. Memory binds at a point where SD-only reserved all but
BINDS_SHARE of the budget; the goal there is a hybrid strictly above the better single mode
(its interval above 0), elsewhere at least equal to it (its mean not below 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from testbed.config.playbook import REPETITION as REPETITION_KEY
from testbed.core.stats import MeanCI, mean_ci

POLICY = "sweep.balance.policy"
BINDS_SHARE = 0.02  # memory binds where SD-only's peak reservation came this close to the budget
REPETITION = f"sweep.{REPETITION_KEY}"
SINGLE = ("ad-only", "sd-only")
COMPARISON_NOTE = (
    "hybrid - better: per repetition (the same users for every policy), the hybrid's users in "
    "time minus the better single mode's; mean and 95 % t-interval over repetitions. TTFT / "
    "TPOT p90: per policy, the mean over repetitions of each condition's 90th percentile (ms, "
    "on the devices); peak GB: the most memory held, mean over repetitions, against the budget. "
    "memory binds: SD-only reserved all but 2 % of the budget; goal: the hybrid strictly above "
    "(interval above 0) where memory binds, at least equal (mean >= 0) elsewhere"
)
POLICIES = ("ad-only", "sd-only", "hybrid")
SHORT = {"ad-only": "AD", "sd-only": "SD", "hybrid": "hyb"}


@dataclass(frozen=True)
class PointComparison:
    """One sweep point: mean users in time per policy, and the hybrid's paired margin."""

    point: dict[str, Any]  # the swept values other than policy and repetition
    in_time: dict[str, float]  # policy -> mean users in time over the repetitions compared
    margin: MeanCI  # hybrid minus the better single mode, per repetition
    ttft_p90_ms: dict[str, float | None] = field(default_factory=dict)  # policy -> mean
    tpot_p90_ms: dict[str, float | None] = field(default_factory=dict)  # policy -> mean
    peak_gb: dict[str, float | None] = field(default_factory=dict)  # policy -> mean held
    budget_gb: float | None = None
    binds: bool | None = None  # memory binds at this point (None: not known)

    @property
    def verdict(self) -> str:
        """Where the hybrid stands on average (`standing` of the mean margin)."""
        return standing(self.margin.mean or 0.0)

    @property
    def goal_met(self) -> bool | None:
        """Strictly above where memory binds, at least equal elsewhere (None: unknown)."""
        if self.binds is None or self.margin.mean is None:
            return None
        if self.binds:
            low = self.margin.low if self.margin.n > 1 else self.margin.mean
            return bool(low is not None and low > 0)
        return self.margin.mean >= 0


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
        compared = part[part["_rep"].isin(wide.index)]
        points.append(
            PointComparison(
                point={k.removeprefix("sweep."): v for k, v in zip(keys, values, strict=True)},
                in_time={p: float(wide[p].mean()) for p in (*SINGLE, "hybrid")},
                margin=mean_ci([float(m) for m in margins]),
                ttft_p90_ms=_per_policy(compared, "ttft_p90_ms"),
                tpot_p90_ms=_per_policy(compared, "tpot_p90_ms"),
                peak_gb=_per_policy(compared, "peak_held_gb"),
                budget_gb=_first(compared, "memory_budget_gb"),
                binds=_binds(compared),
            )
        )
    return points


def _per_policy(part: pd.DataFrame, column: str) -> dict[str, float | None]:
    """policy -> mean of `column` over its conditions (None where the run has no such column)."""
    if column not in part.columns:
        return {}
    means = part.groupby(POLICY)[column].mean()
    return {p: (None if pd.isna(means.get(p)) else float(means[p])) for p in POLICIES}


def _first(part: pd.DataFrame, column: str) -> float | None:
    values = part[column].dropna() if column in part.columns else pd.Series(dtype=float)
    return float(values.iloc[0]) if len(values) else None


def _binds(part: pd.DataFrame) -> bool | None:
    """Whether SD-only's reservation reached all but BINDS_SHARE of the budget."""
    if not {"peak_reserved_gb", "memory_budget_gb"} <= set(part.columns):
        return None
    sd = part[part[POLICY] == "sd-only"]
    if sd.empty:
        return None
    return bool((sd["peak_reserved_gb"] >= (1 - BINDS_SHARE) * sd["memory_budget_gb"]).any())


def _cells(values: dict[str, float | None], fmt: str) -> str:
    """AD / SD / hybrid values in one cell."""
    if not values:
        return "-"
    return " / ".join("-" if values.get(p) is None else format(values[p], fmt) for p in POLICIES)


def comparison_rows(points: list[PointComparison]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the printed comparison."""
    headers = ["point", "AD-only", "SD-only", "hybrid", "reps", "hybrid - better (95 % CI)",
               "hybrid is", "TTFT p90 ms AD / SD / hyb", "TPOT p90 ms AD / SD / hyb",
               "peak GB AD / SD / hyb", "budget GB", "memory binds", "goal"]  # fmt: skip
    rows = []
    for p in points:
        ci = p.margin
        interval = f"{ci.mean:+.1f}" + (f" [{ci.low:+.1f}, {ci.high:+.1f}]" if ci.n > 1 else "")
        goal = {True: "met", False: "missed", None: "-"}[p.goal_met]
        rows.append(
            [", ".join(f"{k}={v}" for k, v in p.point.items()) or "all"]
            + [f"{p.in_time[k]:.1f}" for k in (*SINGLE, "hybrid")]
            + [str(ci.n), interval, p.verdict, _cells(p.ttft_p90_ms, ".0f"),
               _cells(p.tpot_p90_ms, ".0f"), _cells(p.peak_gb, ".3f"),
               "-" if p.budget_gb is None else f"{p.budget_gb:g}",
               {True: "yes", False: "no", None: "-"}[p.binds], goal]
        )  # fmt: skip
    return headers, rows
