"""The one way a command turns a testbed error into its message and exit code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from testbed.core.errors import ExitCode, TestbedError


@contextmanager
def exit_codes(interrupted: str = "interrupted") -> Iterator[None]:
    """Run the block; a TestbedError ends the command with its message (on stderr) and its
    exit code, Ctrl-C with `interrupted` and exit code 1."""
    try:
        yield
    except TestbedError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(int(exc.exit_code)) from None
    except KeyboardInterrupt:
        typer.secho(interrupted, fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(int(ExitCode.FAILED)) from None
