"""What a figure shows, independent of how it is drawn: matplotlib draws a `Chart` as PNG/SVG
(`testbed.report.plots`), the dashboard draws the same `Chart` in the browser
(`testbed.report.dashboard`), so a figure is defined once."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Style = Literal["line", "step", "points"]


@dataclass
class Series:
    """One curve: y (and an optional band low..high) over x; None marks a missing value."""

    name: str
    x: list[float]
    y: list[float | None]
    low: list[float | None] | None = None
    high: list[float | None] | None = None
    style: Style = "line"


@dataclass
class RefLine:
    """A horizontal reference level (e.g. the target model alone)."""

    name: str
    y: float


@dataclass
class Chart:
    """One figure: a title, axis labels, curves and reference lines."""

    key: str  # file stem and DOM id
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    refs: list[RefLine] = field(default_factory=list)
    note: str = ""  # one line under the figure: what the band means, where data came from

    def as_json(self) -> dict[str, Any]:
        """Plain JSON (NaN -> null) for the dashboard."""
        return _clean(asdict(self))


@dataclass
class Skipped:
    """A figure the run has no data for, and why."""

    key: str
    title: str
    reason: str


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
