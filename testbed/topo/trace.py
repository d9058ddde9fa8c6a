"""Read a link trace: a CSV of delay and loss over time, turned into schedule steps.

Format (lines starting with `#` are comments; the header row names the columns):
    t_s,rtt_ms,loss[,jitter_ms][,loss_up][,loss_down]
`t_s` counts seconds from when the profile is applied and must increase; losses are fractions
0..1 (random loss); an empty cell keeps the previous value. A relative path is taken from the
current folder, else from the repository root (so `topologies/traces/wifi.csv` works anywhere).
"""

from __future__ import annotations

import csv
from pathlib import Path

from pydantic import ValidationError

from testbed.core import paths
from testbed.core.errors import BadInputError
from testbed.core.loading import describe_errors
from testbed.topo.profile import ScheduleStep

COLUMNS = ("t_s", "rtt_ms", "loss", "jitter_ms", "loss_up", "loss_down")


def resolve(path: Path) -> Path:
    """`path` as given when it exists, else under the repository root."""
    if path.is_absolute() or path.exists():
        return path
    return paths.REPO_ROOT / path


def load_trace(path: Path) -> tuple[ScheduleStep, ...]:
    """The steps of a trace file; BadInputError naming the file, row and column."""
    real = resolve(path)
    try:
        lines = [ln for ln in real.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read trace: {exc.strerror}") from None
    rows = list(csv.DictReader(ln for ln in lines if not ln.lstrip().startswith("#")))
    if not rows:
        raise BadInputError(f"{path}: trace has no rows (expected columns {', '.join(COLUMNS)})")
    unknown = sorted(set(rows[0]) - set(COLUMNS))
    if unknown or "t_s" not in rows[0]:
        raise BadInputError(
            f"{path}: trace columns {unknown or 'without t_s'}: expected t_s and any of "
            f"{', '.join(COLUMNS[1:])}"
        )
    steps: list[ScheduleStep] = []
    for number, row in enumerate(rows, start=2):
        fields = {k.replace("t_s", "at_s"): v for k, v in row.items() if v not in (None, "")}
        try:
            step = ScheduleStep.model_validate(fields)
        except ValidationError as exc:
            raise BadInputError(describe_errors(f"{path} row {number}", exc)) from None
        if steps and step.at_s <= steps[-1].at_s:
            raise BadInputError(f"{path} row {number}: t_s must increase ({step.at_s})")
        steps.append(step)
    return tuple(steps)
