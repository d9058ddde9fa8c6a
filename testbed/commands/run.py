"""`testbed run PLAYBOOK`: run an experiment playbook on a lab."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.core.errors import ExitCode


def run(
    playbook: Path | None = typer.Argument(None, help="experiment playbook (YAML)"),
    lab: str | None = typer.Option(
        None, help="lab kind: namespaces | mininet | inventory (default: the playbook's lab.kind)"
    ),
    inventory: Path | None = typer.Option(
        None, help="Ansible inventory of the hosts (implies --lab inventory)"
    ),
    resume: Path | None = typer.Option(None, help="resume an interrupted run folder"),
    retry_failed: bool = typer.Option(False, help="with --resume: run failed conditions again"),
    rerun_faulted: bool = typer.Option(
        False, help="with --resume: run faulted conditions (an agent stopped early) again"
    ),
    out: Path | None = typer.Option(None, help="parent folder of the run (default results/)"),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="print the lab, tc/iptables and Fabric actions; do nothing"
    ),
    max_conditions: int = typer.Option(
        1000, help="refuse a sweep with more conditions than this (raise it to run one)"
    ),
) -> None:
    """Validate the playbook, bring up the lab, run every condition, write results."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from testbed.results.condition_table import condition_frame, describe_condition, print_summary
    from testbed.runner.run import execute

    console = Console()
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        "ETA",
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=dry_run,
    )
    task = progress.add_task("conditions", total=None)

    def condition_done(entry: dict) -> None:
        progress.console.print(describe_condition(entry))
        progress.advance(task)

    def say(msg: str) -> None:
        progress.console.print(msg, markup=False, highlight=False, style=None if dry_run else "dim")

    with exit_codes("interrupted: the lab is down; finish with --resume RUN"), progress:
        outcome = execute(
            playbook,
            resume=resume,
            out=out,
            retry_failed=retry_failed,
            rerun_faulted=rerun_faulted,
            dry_run=dry_run,
            lab_kind=lab,
            inventory=str(inventory) if inventory else None,
            say=say,
            on_condition=condition_done,
            on_plan=lambda n: progress.update(task, total=n),
            max_conditions=max_conditions,
        )
    if outcome.store is None:
        return
    df = condition_frame(outcome.store)
    if not df.empty:
        print_summary(df, title=f"run {outcome.store.root.name}")
    console.print(f"results: {outcome.store.root}")
    if outcome.failed or outcome.faulted:
        raise typer.Exit(ExitCode.CONDITIONS_FAILED)
