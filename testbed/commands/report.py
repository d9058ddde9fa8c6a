"""`testbed report RUN`: the per-condition table, figures (PNG, SVG) and a Markdown summary."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.core.errors import ExitCode


def resolve_run(run: str) -> Path:
    """A run folder given as a path or as a run id under results/."""
    from testbed.core.paths import results_dir

    path = Path(run)
    if not path.exists():
        path = results_dir() / run
    if not (path / "manifest.json").exists():
        typer.echo(f"{run}: not a run folder (no manifest.json)", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT)
    return path


def report(
    run: str = typer.Argument(..., help="run folder, or a run id under results/"),
    csv: Path | None = typer.Option(None, help="also write the condition table as CSV here"),
    figures: bool = typer.Option(
        True, "--figures/--no-figures", help="write figures and report.md into RUN/report/"
    ),
) -> None:
    """Print one row per condition; write the figures (PNG, SVG) and report.md into RUN/report/."""
    from testbed.report.data import RunData
    from testbed.report.write import write_report
    from testbed.results.condition_table import (
        condition_frame,
        print_summary,
        write_condition_table,
    )
    from testbed.results.store import RunStore

    store = RunStore(resolve_run(run))
    write_condition_table(store)
    df = condition_frame(store)
    if df.empty:
        typer.echo(f"{store.root}: no finished conditions yet")
        raise typer.Exit(ExitCode.OK)
    print_summary(df, title=f"run {store.root.name}")
    if csv:
        df.to_csv(csv, index=False)
        typer.echo(f"wrote {csv}")
    if figures:
        files = write_report(RunData(store.root))
        typer.echo(f"figures: {len(files.figures) // 2} (PNG and SVG) in {files.summary.parent}")
        for skipped in files.skipped:
            typer.echo(f"  left out {skipped.title}: {skipped.reason}")
        typer.echo(f"summary: {files.summary}")
