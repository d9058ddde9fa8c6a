"""`testbed compare RUN_A RUN_B`: per condition and metric, what moved and whether too far."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.core.errors import ExitCode


def compare(
    run_a: str = typer.Argument(..., help="the baseline run (folder or id under results/)"),
    run_b: str = typer.Argument(..., help="the candidate run"),
    tolerances: Path | None = typer.Option(
        None,
        help="YAML of per-metric tolerances replacing the built-in defaults",
    ),
) -> None:
    """Print each metric of each condition in both runs; exit 8 when one regressed."""
    from rich.console import Console
    from rich.table import Table

    from testbed.commands.report import resolve_run
    from testbed.report.compare import compare_runs, load_tolerances
    from testbed.report.data import load_run

    with exit_codes():
        a, b = load_run(resolve_run(run_a)), load_run(resolve_run(run_b))
        verdicts = compare_runs(a, b, load_tolerances(tolerances))
    console = Console(width=max(Console().width, 140))
    table = Table(title=f"{a.name} (A) -> {b.name} (B)")
    for col in ("condition", "metric", "A", "B", "change", "verdict", "tolerance"):
        table.add_column(col, justify="right" if col in ("A", "B", "change") else "left")
    for v in verdicts:
        table.add_row(
            v.condition,
            v.metric,
            "-" if v.a is None else f"{v.a:.4g}",
            "-" if v.b is None else f"{v.b:.4g}",
            "-" if v.change is None else f"{v.change:+.1%}",
            "[red]REGRESSION[/red]" if v.regressed else "ok",
            v.why,
        )
    console.print(table)
    bad = [v for v in verdicts if v.regressed]
    if bad:
        console.print(f"[red]{len(bad)} regression(s) past tolerance[/red]")
        raise typer.Exit(ExitCode.REGRESSION)
    console.print("within tolerance")
