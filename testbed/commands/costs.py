"""`testbed costs [--file FILE]`: the per-host-class cost table the metrics use."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.commands.exits import exit_codes


def costs(
    file: Path | None = typer.Option(
        None, "--file", help="cost table (YAML: kwh_price, classes.<class>.price_per_hour/power_w)"
    ),
) -> None:
    """Print each host class's amortized price, nominal power and cost per hour, and where
    each figure comes from (the built-in defaults or FILE)."""
    from testbed.config.costs import CostTable, read_cost_file, with_defaults

    with exit_codes():
        given = read_cost_file(file) if file else None
    table = with_defaults(given) if given else CostTable()
    from_file = set(given.classes) if given else set()
    price_from = file if given and "kwh_price" in given.model_fields_set else "defaults"
    typer.echo(f"electricity: {table.kwh_price:.4f} USD/kWh ({price_from})")
    typer.echo(f"{'class':<18} {'price USD/h':>12} {'power W':>8} {'USD/h':>10}  source")
    for name, cost in table.classes.items():
        source = file if name in from_file else "defaults"
        figures = f"{cost.price_per_hour:>12.5f} {cost.power_w:>8.1f} {table.hourly(name):>10.5f}"
        typer.echo(f"{name:<18} {figures}  {source}")
    typer.echo(
        "power: nominal; a host whose agent measured its power (nvidia-smi, tegrastats, RAPL) "
        "is costed at its measured mean instead"
    )
