"""`testbed results ls | show RUN | query RUN "SQL"`: the run folders and SQL over them."""

from __future__ import annotations

from pathlib import Path

import typer

from testbed.core.errors import ExitCode


def _base() -> Path:
    from testbed.core.paths import results_dir

    return results_dir()


def _runs(run: str) -> list[Path]:
    """`all` (every run under results/), a run folder path, or a run id under results/."""
    from testbed.commands.report import resolve_run
    from testbed.results.query import run_folders

    return run_folders(_base()) if run == "all" else [resolve_run(run)]


def _print(headers: list[str], rows: list[tuple], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for h in headers:
        table.add_column(h)
    for row in rows:
        table.add_row(*("-" if v is None else str(v) for v in row))
    Console(width=200).print(table)


def ls() -> None:
    """One line per run folder: id, created, playbook, conditions done / failed / planned."""
    from testbed.results.query import run_folders
    from testbed.results.store import RunStore

    rows = []
    for path in run_folders(_base()):
        store = RunStore(path)
        manifest = store.manifest()
        journal = store.journal()
        done = sum(e["status"] == "done" for e in journal)
        faulted = sum(e["status"] == "faulted" for e in journal)
        failed = sum(e["status"] == "failed" for e in journal)
        planned = manifest.get("condition_count") or len(manifest.get("conditions") or [])
        rows.append((path.name, manifest.get("created"), (manifest.get("playbook") or {}).get(
            "name"), done, faulted, failed, planned))  # fmt: skip
    _print(["run", "created", "playbook", "done", "faulted", "failed", "planned"], rows)


def show(run: str = typer.Argument(..., help="run folder, or a run id under results/")) -> None:
    """The run's manifest essentials, its tables and its per-condition summary."""
    from testbed.commands.report import resolve_run
    from testbed.results.condition_table import condition_frame, print_summary
    from testbed.results.store import RunStore

    store = RunStore(resolve_run(run))
    m = store.manifest()
    typer.echo(f"run {store.root.name}  created {m.get('created')}")
    typer.echo(f"git {(m.get('git') or {}).get('commit')}")
    models = m.get("models") or {}
    for role in ("draft", "target"):
        files = (models.get("sha256") or {}).get(models.get(role), {})
        digests = ", ".join(f"{name} {sha[:12]}" for name, sha in files.items())
        typer.echo(f"{role}: {models.get(role)}" + (f"  (sha256 {digests})" if digests else ""))
    for where in m.get("reference") or []:  # where the answers `=target` compares with came from
        known = "sha256 from " + where["sha256_from"] if where.get("sha256") else "sha256 unknown"
        typer.echo(f"reference answers: on {where.get('host')} by {where.get('model')} "
                   f"({where.get('device')}; {known})")  # fmt: skip
    tables = sorted({p.name for p in store.root.glob("conditions/*/*.parquet")})
    typer.echo("tables: " + ", ".join(["conditions.parquet", *tables]))
    df = condition_frame(store)
    if df.empty:
        typer.echo("no finished conditions yet")
        return
    print_summary(df, title=f"run {store.root.name}")


def query_cmd(
    run: str = typer.Argument(..., help="run folder, run id, or `all` for every run"),
    sql: str = typer.Argument(..., help="SQL over the views runs, conditions, rounds, ..."),
    csv: Path | None = typer.Option(None, help="also write the result as CSV here"),
) -> None:
    """Run SQL with DuckDB over one run's tables, or every run's (`all`)."""
    import duckdb

    from testbed.results.query import query

    try:
        headers, rows = query(_runs(run), sql)
    except duckdb.Error as exc:
        typer.echo(f"query failed: {exc}", err=True)
        raise typer.Exit(ExitCode.BAD_INPUT) from None
    _print(headers, rows)
    if csv:
        import pandas as pd

        pd.DataFrame(rows, columns=headers).to_csv(csv, index=False)
        typer.echo(f"wrote {csv}")
