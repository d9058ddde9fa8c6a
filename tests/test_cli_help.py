"""The command line's help texts, as `--help` prints them."""

from __future__ import annotations

import typer

from testbed.cli import app


def _commands(cmd, path: tuple[str, ...] = ()):
    """(path, command) of every leaf command below `cmd`."""
    if hasattr(cmd, "commands"):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, cmd


def test_no_help_text_holds_brackets_that_rich_would_take_for_markup() -> None:
    """Typer prints help through rich, which drops "[default: x]" from a help text as an
    unknown markup tag; defaults a help text states go in parentheses."""
    found = list(_commands(typer.main.get_command(app)))
    assert len(found) > 20, found  # every subcommand was walked, not just the groups
    bracketed = [
        (" ".join(path), param.name)
        for path, cmd in found
        for param in cmd.params
        if "[" in (getattr(param, "help", None) or "")
    ] + [(" ".join(path), "--help") for path, cmd in found if "[" in (cmd.help or "")]
    assert bracketed == []
