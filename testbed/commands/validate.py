"""`testbed validate FILE`: check a playbook (and every condition of its sweep) without running."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes
from testbed.config.playbook import DEFAULT_MAX_CONDITIONS

FULL_CHECK = 10_000  # up to this many conditions, validate resolves every one


def validate(
    playbook: Path = typer.Argument(..., help="experiment playbook (YAML)"),
    max_conditions: int = typer.Option(
        DEFAULT_MAX_CONDITIONS, help="refuse a sweep with more conditions than this"
    ),
) -> None:
    """Validate the playbook and resolve every condition of its sweep; print what would run."""
    from testbed.config.playbook import expand, lab_playbook, load_playbook
    from testbed.runner.run import check_conditions, run_topology

    with exit_codes():
        pb = load_playbook(playbook)
        sweep = expand(pb, str(playbook), max_conditions)
        whole = len(sweep) <= FULL_CHECK
        if whole:
            for _ in sweep:  # each condition validated as a whole playbook
                pass
        else:
            sweep.check_values()
        # the models each host stands for: in the catalogue and within its memory
        check_conditions(sweep, run_topology(lab_playbook(pb), str(playbook)), str(playbook))
    keys = ", ".join(f"{k} ({len(v)})" for k, v in pb.sweep.items()) or "no sweep"
    if sweep.repetitions > 1:
        keys += f"; {sweep.repetitions} repetitions each"
    how = "every condition checked" if whole else "each swept value checked on its own"
    typer.echo(f"{playbook}: valid; {len(sweep):,} conditions ({keys}); {how}")
