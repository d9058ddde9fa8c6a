"""A condition's marks (unfaithful, acceptance unmatched) read the same in the terminal table,
the report's headline table and the notes under them; the terminal table fits 120 columns."""

from __future__ import annotations

import pandas as pd

from testbed.report.summary import headline_cells
from testbed.results.condition_table import SUMMARY_COLUMNS, TERMINAL_WIDTH, print_summary
from testbed.results.marks import condition_marks, mark_lines, shown_status


def row(**extra) -> dict:
    base = {"condition": "c00", "status": "done", "label": "base", "sweep.link.loss": 0.05}
    base.update({key: 1.0 for key, _, _ in SUMMARY_COLUMNS if key not in ("label", "status")})
    base["backend"] = "holder"
    return base | extra


BEHIND = {"compute_faithful": False, "behind_share": 0.028, "behind_forwards": 28,
          "paced_forwards": 1000}  # fmt: skip
UNMATCHED = {"acceptance_unmatched": True, "acceptance_alpha": 0.70, "acceptance_as": 0.81,
             "acceptance_as_source": "someone 2025"}  # fmt: skip


def test_marks_name_the_figure_and_only_when_it_is_off() -> None:
    assert condition_marks(row()) == []
    assert condition_marks(row(compute_faithful=True, acceptance_unmatched=False)) == []
    assert shown_status(row(**BEHIND)) == "done, unfaithful 2.8% behind"
    assert shown_status(row(**BEHIND, **UNMATCHED)) == (
        "done, unfaithful 2.8% behind, acceptance unmatched 0.70 vs 0.81"
    )
    assert condition_marks(row(acceptance_unmatched=float("nan"))) == []


def test_the_terminal_table_fits_and_says_what_the_report_says(capsys) -> None:
    sled = {"served_in_time": None, "servable_alone": None}  # BALANCE's columns, empty here
    df = pd.DataFrame(
        [
            row(**BEHIND, **sled),
            row(condition="c01", **UNMATCHED, **sled),
            row(condition="c02", **sled),
        ]
    )
    print_summary(df, title="run x")
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= TERMINAL_WIDTH
    assert "unfaithful 2.8%" in out and "unmatched 0.70 vs 0.81" in out  # the cell may wrap
    headers, cells = headline_cells(df)
    status = [c[headers.index("status")] for c in cells]
    assert status == ["done, unfaithful 2.8% behind", "done, acceptance unmatched 0.70 vs 0.81",
                      "done"]  # fmt: skip
    lines = mark_lines(df)
    assert (
        len(lines) == 2 and "(2.8% behind)" in lines[0] and "0.70 measured against 0.81" in lines[1]
    )
    for line in lines:  # the notes are printed under the terminal table too
        assert line.split(":")[0] in out
