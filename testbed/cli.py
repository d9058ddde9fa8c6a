"""`testbed` command line: one typer app with a sub-app per area.

Sub-apps live in `testbed.commands.<area>` and import their heavy dependencies (torch,
fabric, pandas) inside the commands, so `--help` stays fast.
"""

from __future__ import annotations

import typer

from testbed.commands import (
    balance,
    bench,
    capacity,
    compare,
    costs,
    dashboard,
    lab,
    models,
    report,
    results,
    run,
    validate,
)

app = typer.Typer(
    help="Edge speculative-inference testbed: build models, bring up labs, run experiments.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(models.app, name="models")
app.add_typer(lab.app, name="lab")
app.add_typer(bench.app, name="bench")
app.command("run")(run.run)
app.command("report")(report.report)
app.add_typer(results.app, name="results")
app.command("validate")(validate.validate)
app.command("capacity")(capacity.capacity)
app.command("dashboard")(dashboard.dashboard)
app.command("compare")(compare.compare)
app.command("costs")(costs.costs)
app.command("profile")(balance.profile)
bench.app.command("balance")(balance.bench_balance)
bench.app.command("balance-sim")(balance.bench_balance_sim)
bench.app.command("balance-check")(balance.bench_balance_check)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
