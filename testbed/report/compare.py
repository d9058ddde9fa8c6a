"""Compare two runs condition by condition and judge each metric against its tolerance.

Conditions are matched by their label (the swept values), so two runs of one playbook line
up. A metric regresses when it moved past its tolerance in its bad direction (see
`tolerances.yaml`): for noisy metrics the judgement is on the confidence interval of the
difference, not on a fixed percentage. A condition done in the baseline but failed (or
missing) in the candidate is a regression too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from testbed.core.loading import load_model
from testbed.report.data import RunData
from testbed.report.figures import device_rates

DEFAULT_TOLERANCES = Path(__file__).with_name("tolerances.yaml")


class Tolerance(BaseModel):
    """How far one metric may move the bad way."""

    model_config = ConfigDict(extra="forbid")
    better: Literal["higher", "lower"]
    noisy: bool = False
    rel: float = Field(0.0, ge=0)
    abs: float = Field(0.0, ge=0)


class Tolerances(BaseModel):
    """A tolerance file: a confidence level and one entry per compared metric."""

    model_config = ConfigDict(extra="forbid")
    level: float = Field(0.95, gt=0, lt=1)
    metrics: dict[str, Tolerance]


def load_tolerances(path: Path | None = None) -> Tolerances:
    """The defaults, with the entries of path (if given) replacing them metric by metric."""
    base = load_model(Tolerances, DEFAULT_TOLERANCES)
    if path is None:
        return base
    extra = load_model(Tolerances, path)
    return Tolerances(level=extra.level, metrics={**base.metrics, **extra.metrics})


def _requests_column(column: str) -> Callable[[RunData, str], list[float]]:
    def samples(run: RunData, cid: str) -> list[float]:
        df = run.table(cid, "requests")
        return [] if column not in df else df[column].dropna().astype(float).tolist()

    return samples


def fallback_shares(requests: pd.DataFrame) -> list[float]:
    """Per answer: its unverified (fallback) tokens / its tokens."""
    if requests.empty or "fallback_tokens" not in requests:
        return []
    ok = requests[requests["tokens"] > 0]
    return (ok["fallback_tokens"] / ok["tokens"]).astype(float).tolist()


# metric -> its samples in one condition (noisy metrics are judged on these)
SAMPLES: dict[str, Callable[[RunData, str], list[float]]] = {
    "device_verified_tok_s_mean": lambda run, cid: device_rates(run, cid)["verified"],
    "device_tok_s_mean": lambda run, cid: device_rates(run, cid)["total"],
    "fallback_share": lambda run, cid: fallback_shares(run.table(cid, "requests")),
    "flexible_accuracy": _requests_column("flexible_correct"),
    "strict_accuracy": _requests_column("strict_correct"),
}


def difference_interval(a: list[float], b: list[float], level: float) -> tuple[float, float]:
    """Welch t-interval of mean(b) - mean(a); with fewer than 2 samples on a side its spread
    counts as zero."""
    from scipy.stats import t

    va = np.var(a, ddof=1) / len(a) if len(a) > 1 else 0.0
    vb = np.var(b, ddof=1) / len(b) if len(b) > 1 else 0.0
    diff = float(np.mean(b) - np.mean(a))
    se = float(np.sqrt(va + vb))
    if se == 0:
        return diff, diff
    dof = se**4 / (
        (va**2 / (len(a) - 1) if len(a) > 1 else 0) + (vb**2 / (len(b) - 1) if len(b) > 1 else 0)
    )
    half = float(t.ppf(0.5 + level / 2, dof)) * se
    return diff - half, diff + half


@dataclass
class Verdict:
    """One metric of one condition in both runs."""

    condition: str
    metric: str
    a: float | None
    b: float | None
    regressed: bool
    why: str

    @property
    def change(self) -> float | None:
        """(b - a) / |a|"""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return (self.b - self.a) / abs(self.a)


def judge(
    metric: str, tol: Tolerance, a: float | None, b: float | None,
    samples: tuple[list[float], list[float]] | None, level: float,
) -> tuple[bool, str]:  # fmt: skip
    """(regressed, explanation) of one metric."""
    if a is None or b is None:
        return False, "not in both runs"
    sign = 1.0 if tol.better == "higher" else -1.0
    margin = max(tol.abs, tol.rel * abs(a))
    if tol.noisy and samples and samples[0] and samples[1]:
        lo, hi = difference_interval(*samples, level)
        # the whole interval of b - a lies more than margin past zero the bad way
        regressed = hi < -margin if sign > 0 else lo > margin
        return regressed, f"{level:.0%} CI of difference [{lo:.3g}, {hi:.3g}], margin {margin:.3g}"
    moved_bad = (a - b) * sign
    return moved_bad > margin, f"allowed {margin:.3g} the bad way"


def compare_runs(a: RunData, b: RunData, tolerances: Tolerances) -> list[Verdict]:
    """Every metric of every condition of a (the baseline) against b (the candidate)."""
    rows_a = {r["label"]: r for r in a.metric_rows().to_dict("records")}
    rows_b = {r["label"]: r for r in b.metric_rows().to_dict("records")}
    out: list[Verdict] = []
    for label, ra in rows_a.items():
        rb = rows_b.get(label)
        if rb is None:
            out.append(Verdict(label, "status", None, None, True, "done in A, not done in B"))
            continue
        if rb.get("status") == "faulted" and ra.get("status") != "faulted":
            why = f"faulted in B: {str(rb.get('reason') or '').splitlines()[0]}"
            out.append(Verdict(label, "status", None, None, True, why))
        for metric, tol in tolerances.metrics.items():
            va, vb = _number(ra.get(metric)), _number(rb.get(metric))
            get = SAMPLES.get(metric)
            samples = (get(a, ra["condition"]), get(b, rb["condition"])) if get else None
            regressed, why = judge(metric, tol, va, vb, samples, tolerances.level)
            out.append(Verdict(label, metric, va, vb, regressed, why))
    for label in rows_b.keys() - rows_a.keys():
        out.append(Verdict(label, "status", None, None, False, "only in B"))
    return out


def _number(value: object) -> float | None:
    if value is None or not isinstance(value, (int, float)) or not np.isfinite(value):
        return None
    return float(value)
