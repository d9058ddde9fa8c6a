"""SQL over run folders with DuckDB: one view per table, spanning every run given.

Views: `runs` (one row per run, from the manifests), `conditions` (each run's
conditions.parquet) and one per record table of `testbed.metrics.schemas` (rounds, requests,
hosts, links, link_changes, verifications, batches) gathered from every condition folder.
Every view has a `run` column naming the run folder, so one query can span runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from testbed.metrics.schemas import SCHEMAS
from testbed.results import store
from testbed.results.store import MANIFEST


def run_folders(base: Path) -> list[Path]:
    """base itself if it is a run folder, else the run folders under it, oldest first by name."""
    return [base] if store.is_run(base) else store.run_folders(base)


def _sql_list(paths: list[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def connect(runs: list[Path]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the views of the module docstring over `runs`."""
    con = duckdb.connect()
    rows = []
    for run in runs:
        manifest = json.loads((run / MANIFEST).read_text(encoding="utf-8"))
        playbook = manifest.get("playbook") or {}
        rows.append(
            (run.name, str(run), manifest.get("created"), playbook.get("name"),
             playbook.get("topology"), (manifest.get("git") or {}).get("commit"))
        )  # fmt: skip
    con.execute(
        "CREATE TABLE runs (run VARCHAR, path VARCHAR, created VARCHAR, playbook VARCHAR, "
        "topology VARCHAR, git_commit VARCHAR)"
    )
    if rows:
        con.executemany("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)", rows)
    sources = {"conditions": [r / "conditions.parquet" for r in runs]}
    for table in (t for t in SCHEMAS if t != "conditions"):
        sources[table] = [p for r in runs for p in sorted(r.glob(f"conditions/*/{table}.parquet"))]
    for table, paths in sources.items():
        paths = [p for p in paths if p.is_file()]
        if not paths:
            continue
        pattern = (
            r"([^/]+)/conditions\.parquet$" if table == "conditions" else r"([^/]+)/conditions/"
        )
        con.execute(
            f"CREATE VIEW {table} AS SELECT * EXCLUDE (filename), "
            f"regexp_extract(filename, '{pattern}', 1) AS run "
            f"FROM read_parquet({_sql_list(paths)}, union_by_name = true, filename = true)"
        )
    return con


def query(runs: list[Path], sql: str) -> tuple[list[str], list[tuple]]:
    """Column names and rows of `sql` over the views of `runs`."""
    con = connect(runs)
    try:
        cur = con.execute(sql)
        return [d[0] for d in cur.description or []], cur.fetchall()
    finally:
        con.close()
