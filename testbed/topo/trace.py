"""Read a link trace: a CSV of delay and loss over time, turned into schedule steps.

Format (lines starting with `#` are comments; the header row names the columns):
    t_s,rtt_ms,loss[,jitter_ms][,loss_up][,loss_down]
`t_s` counts seconds from when the profile is applied and must increase; `rtt_ms` is 0-60,000,
`jitter_ms` at least 0, losses are fractions 0..1 (random loss); an empty cell keeps the
previous value. Every problem is a BadInputError naming the file, its row (the line of the
file, counting from 1) and the column (number and name).

A relative path in a playbook is taken from the playbook's folder (`testbed.config.playbook`
makes it absolute when it loads the playbook); elsewhere (a topology, `lab impair --profile`)
from the current folder, else from the repository root (so `topologies/traces/wifi.csv`
works anywhere).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from pydantic import ValidationError

from testbed.core import paths
from testbed.core.errors import BadInputError
from testbed.core.loading import read_text
from testbed.topo.profile import ScheduleStep

COLUMNS = ("t_s", "rtt_ms", "loss", "jitter_ms", "loss_up", "loss_down")
FIELD = {"t_s": "at_s"}  # a column's name in ScheduleStep, where it differs


def resolve(path: Path) -> Path:
    """`path` as given when it exists, else under the repository root."""
    if path.is_absolute() or path.exists():
        return path
    return paths.REPO_ROOT / path


def _header(path: Path, lines: list[tuple[int, str]]) -> tuple[int, list[str]]:
    """(line number, column names) of the header row; BadInputError naming what is wrong."""
    if not lines:
        raise BadInputError(f"{path}: trace is empty (expected a header row {','.join(COLUMNS)})")
    number, text = lines[0]
    names = [c.strip() for c in next(csv.reader([text]))]
    unknown = [c for c in names if c not in COLUMNS]
    if unknown or "t_s" not in names or len(set(names)) != len(names):
        raise BadInputError(
            f"{path} row {number}: trace columns {unknown or names}: expected t_s and any of "
            f"{', '.join(COLUMNS[1:])}, each once"
        )
    return number, names


def load_trace(path: Path) -> tuple[ScheduleStep, ...]:
    """The steps of a trace file; BadInputError naming the file, row and column."""
    text = read_text(resolve(path))
    lines = [(n, ln) for n, ln in enumerate(text.splitlines(), start=1)
             if ln.strip() and not ln.lstrip().startswith("#")]  # fmt: skip
    header_row, names = _header(path, lines)
    if len(lines) == 1:
        raise BadInputError(f"{path} row {header_row}: trace has a header and no rows")
    steps: list[ScheduleStep] = []
    for number, line in lines[1:]:
        cells = [c.strip() for c in next(csv.reader([line]))]
        if len(cells) != len(names):
            raise BadInputError(
                f"{path} row {number}: {len(cells)} cells, expected {len(names)} "
                f"({','.join(names)})"
            )
        steps.append(_step(path, number, names, cells, steps[-1] if steps else None))
    return tuple(steps)


def _step(
    path: Path, row: int, names: list[str], cells: list[str], before: ScheduleStep | None
) -> ScheduleStep:
    """One row as a step; BadInputError naming the file, row and column of the first bad cell."""

    def where(name: str) -> str:
        return f"{path} row {row}, column {names.index(name) + 1} ({name})"

    fields: dict[str, float] = {}
    for name, cell in zip(names, cells, strict=True):
        if cell == "":
            if name == "t_s":
                raise BadInputError(f"{where(name)}: empty; every row needs its time")
            continue
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise BadInputError(f"{where(name)}: {cell!r} is not a number")
        fields[FIELD.get(name, name)] = value
    try:
        step = ScheduleStep.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0])
        name = next((k for k, v in FIELD.items() if v == field), field)
        raise BadInputError(f"{where(name)}: {err['msg']} (got {err.get('input')!r})") from None
    if before is not None and step.at_s <= before.at_s:
        raise BadInputError(
            f"{where('t_s')}: t_s must increase ({step.at_s:g} after {before.at_s:g})"
        )
    return step
