"""`testbed` command line: one typer app, every command registered the one way, from the table
below (a name, and the function in `testbed.commands` that parses, calls and prints).

Command modules import their heavy dependencies (torch, fabric, pandas) inside the commands,
so `--help` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable

import typer

from testbed.commands import (
    balance,
    bench,
    calibrate,
    capacity,
    compare,
    costs,
    dashboard,
    lab,
    models,
    report,
    results,
    run,
    simulate,
    validate,
)

GROUPS = {
    "lab": "The emulated lab: network namespaces on a bridge, an sshd per host.",
    "bench": "Benchmarks: figures measured side by side in one run.",
    "models": "Models: build the tiny draft/target pair, check a pair across both engines.",
    "results": "List runs, show one, query one or all of them with SQL (DuckDB).",
}
"""Command groups (`testbed lab ...`) and their help."""

COMMANDS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("run", run.run),
    ("validate", validate.validate),
    ("simulate", simulate.simulate),
    ("report", report.report),
    ("dashboard", dashboard.dashboard),
    ("compare", compare.compare),
    ("capacity", capacity.capacity),
    ("costs", costs.costs),
    ("profile", balance.profile),
    ("lab up", lab.up),
    ("lab status", lab.status),
    ("lab down", lab.down),
    ("lab clean", lab.clean),
    ("lab mirror", lab.mirror),
    ("lab impair", lab.impair),
    ("lab clear", lab.clear_cmd),
    ("lab probe", lab.probe_cmd),
    ("lab calibrate", calibrate.calibrate),
    ("lab capture", lab.capture),
    ("models build-tiny", models.build_tiny),
    ("models check", models.check),
    ("results ls", results.ls),
    ("results show", results.show),
    ("results query", results.query_cmd),
    ("bench sd", bench.sd),
    ("bench verify", bench.verify),
    ("bench gpu", bench.gpu),
    ("bench hardware", bench.hardware),
    ("bench link", calibrate.link),
    ("bench sled-loss", bench.sled_loss),
    ("bench drafting", bench.drafting),
    ("bench lab-paths", bench.lab_paths),
    ("bench dilation", bench.dilation),
    ("bench twin", bench.twin),
    ("bench twin-scale", bench.twin_scale),
    ("bench balance", balance.bench_balance),
    ("bench balance-sim", balance.bench_balance_sim),
    ("bench balance-check", balance.bench_balance_check),
)
"""Every command: `group name` or `name`, and its function."""


def build_app() -> typer.Typer:
    """The `testbed` app with every command of COMMANDS."""
    app = typer.Typer(
        help="Edge speculative-inference testbed: build models, bring up labs, run experiments.",
        no_args_is_help=True,
        add_completion=False,
    )
    groups = {name: typer.Typer(help=text, no_args_is_help=True) for name, text in GROUPS.items()}
    for name, group in groups.items():
        app.add_typer(group, name=name)
    for path, function in COMMANDS:
        *group, name = path.split()
        (groups[group[0]] if group else app).command(name)(function)
    return app


app = build_app()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
