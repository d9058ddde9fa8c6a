"""Comma-separated number options (`--users 100,1000`), read with an error naming the option."""

from __future__ import annotations

import math

import typer


def numbers(text: str, option: str, kind: type[int] | type[float], minimum: float) -> list:
    """The values of `text` as `kind`, each at least `minimum` (and finite); a clear usage
    error naming `option` otherwise."""
    name = "integer" if kind is int else "number"
    try:
        values = [kind(part) for part in text.split(",")]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated {name}s, got {text!r}", param_hint=option
        ) from None
    bad = [v for v in values if not math.isfinite(v) or v < minimum]
    if bad:
        raise typer.BadParameter(
            f"expected {name}s of at least {minimum:g}, got {bad[0]!r} in {text!r}",
            param_hint=option,
        )
    return values
