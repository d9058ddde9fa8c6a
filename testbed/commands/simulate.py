"""`testbed simulate PLAYBOOK`: the playbook's sweep through the twin of SLED and the
centralized server (testbed.twin), written as a run folder marked simulated."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.config.playbook import DEFAULT_MAX_CONDITIONS


def simulate(
    playbook: Path = typer.Argument(..., help="experiment playbook (YAML), as for testbed run"),
    out: Path | None = typer.Option(None, help="parent folder of the run (default results/)"),
    acceptance: float | None = typer.Option(
        None,
        min=0.0,
        max=1.0,
        help="per-token acceptance to draw from (default: the stood-for pair's published one)",
    ),  # fmt: skip
    acceptance_from: Path | None = typer.Option(
        None, help="a lab run folder: draw the acceptance its SLED rounds measured, by position"
    ),
    devices: int | None = typer.Option(
        None, min=1, help="simulate this many devices (a one-class fleet; past the lab's limit)"
    ),
    repetitions: int | None = typer.Option(
        None, min=1, help="run the sweep this many times (workload.repetitions), seeds shifted"
    ),
    max_conditions: int = typer.Option(
        DEFAULT_MAX_CONDITIONS, help="refuse a sweep with more conditions than this"
    ),
) -> None:
    """Simulate the playbook's conditions on the twin; the run folder reads like a lab run's."""
    from rich.console import Console

    from testbed.results.condition_table import condition_frame, print_summary
    from testbed.twin.measured import measured_or_given
    from testbed.twin.run import simulate as run_twin

    console = Console()
    with exit_codes():
        drawn = measured_or_given(acceptance, acceptance_from)
        store = run_twin(playbook, out, drawn, devices, repetitions, say=console.print,
                         max_conditions=max_conditions)  # fmt: skip
    print_summary(condition_frame(store), title=f"run {store.root.name} (simulated by the twin)")
    console.print(f"results: {store.root}")
