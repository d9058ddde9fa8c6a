"""Agent record files -> typed Arrow tables (schemas of `testbed.metrics.schemas`) -> Parquet."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from agents.records import read_records
from agents.workloads.scoring import score as score_answer
from testbed.config.costs import CostTable
from testbed.config.slo import Slo
from testbed.core.files import atomic_replace
from testbed.metrics.clocks import offsets_by_host
from testbed.metrics.condition_stats import ConditionStats
from testbed.metrics.link_reaction import reactions_s
from testbed.metrics.schemas import DEFAULTS, SCHEMAS
from testbed.results.store import ConditionFolder
from testbed.topo.profile import GilbertElliott


def frame_from_jsonl(paths: Iterable[Path], **constants: Any) -> pd.DataFrame:
    """Concatenate record files into one frame, adding constant columns (e.g. condition)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(read_records(path))
    df = pd.DataFrame(rows)
    for key, value in constants.items():
        df[key] = value
    return df


def typed_table(table: str, df: pd.DataFrame) -> pa.Table:
    """The frame as an Arrow table of `table`'s schema: declared columns first, cast to their
    types (an absent column or a missing value filled with its field's default, or nulls),
    then any extra columns as pyarrow infers them. A row without a required column is an
    error."""
    schema = SCHEMAS[table]
    defaults = DEFAULTS[table]
    columns: dict[str, pa.Array] = {}
    for fld in schema:
        if fld.name in df.columns:
            values = df[fld.name].astype(object).where(df[fld.name].notna(), None).tolist()
            if fld.name in defaults and defaults[fld.name] is not None:  # gaps get the default
                values = [defaults[fld.name] if v is None else v for v in values]
            columns[fld.name] = typed_array(table, fld, values)
        elif fld.name in defaults or len(df) == 0:
            columns[fld.name] = pa.array([defaults.get(fld.name)] * len(df), type=fld.type)
        else:
            raise ValueError(f"{table}: records lack the required column {fld.name!r}")
    typed = pa.table(columns, schema=schema)
    for name in (c for c in df.columns if c not in schema.names):
        typed = typed.append_column(str(name), infer_column(df[name]))
    return typed


COERCE = {pa.string(): str, pa.float64(): float}


def typed_array(table: str, fld: pa.Field, values: list[Any]) -> pa.Array:
    """values as the field's type; numbers become text in a string column (a reference answer
    written as 26) and integers floats in a float column, anything else is an error naming
    the table and column."""
    convert = COERCE.get(fld.type)
    if convert is not None:
        values = [None if v is None else convert(v) for v in values]
    try:
        return pa.array(values, type=fld.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{table}.{fld.name}: expected {fld.type}: {exc}") from None


def infer_column(values: pd.Series) -> pa.Array:
    """An extra column as pyarrow infers it; values of mixed kinds (a sweep over 1 and "a")
    become strings rather than failing the table."""
    try:
        return pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def write_parquet(df: pd.DataFrame | pa.Table, path: Path) -> None:
    """Write a frame or Arrow table to Parquet through the atomic-replace helper."""
    table = df if isinstance(df, pa.Table) else pa.Table.from_pandas(df, preserve_index=False)
    with atomic_replace(path) as tmp:
        pq.write_table(table, tmp)


def write_typed(table: str, df: pd.DataFrame, folder: ConditionFolder) -> pd.DataFrame:
    """Write the condition's table `table` with its schema; return the typed frame."""
    typed = typed_table(table, df)
    write_parquet(typed, folder.table(table))
    return typed.to_pandas()


def link_rows(link: dict[str, Any], condition: str) -> pd.DataFrame:
    """One `links` row per probed device path, from a condition's link.json."""
    requested = link.get("requested") or {}
    loss = requested.get("loss")
    rows = []
    for dev, probe in (link.get("probes") or {}).items():
        rtt = probe.get("rtt_ms") or {}
        rows.append(
            {
                "condition": condition,
                "dev": dev,
                "backend": link.get("backend"),
                "rtt_requested_ms": requested.get("rtt_ms"),
                "loss_requested": loss if isinstance(loss, (int, float)) else None,
                "rtt_measured_ms": rtt.get("p50"),
                "rtt_error_p99_ms": (probe.get("rtt_error_ms") or {}).get("p99"),
                "loss_up_measured": (probe.get("loss_up") or {}).get("rate"),
                "loss_down_measured": (probe.get("loss_down") or {}).get("rate"),
                "loss_within_95": probe.get("ok"),
            }
        )
    return pd.DataFrame(rows, columns=list(SCHEMAS["links"].names))


def _chain_loss(change: dict[str, Any]) -> float | None:
    """Mean loss of a holder change's Gilbert-Elliott chain (random loss: the one-state chain)."""
    try:
        chain = {k: change[k] for k in ("p", "r", "1-h", "1-k")}
        return GilbertElliott.model_validate(chain).mean_loss
    except (KeyError, ValidationError):
        return None


def link_change_rows(link: dict[str, Any], condition: str) -> pd.DataFrame:
    """The `link_changes` table from a condition's link.json: one row per profile phase the
    holder applied to one direction of a link (RTT = twice that direction's delay) and one
    per failover of the backup path's monitor; times on the controller's clock (link.json's,
    moved there by `testbed.runner.link_step`), with the offset that moved each."""
    rows = []
    for c in link.get("changes") or []:
        delay = c.get("delay_us")
        rows.append({
            "condition": condition, "dev": str(c.get("link")), "t": c.get("at"),
            "kind": "change", "phase": c.get("phase"),
            "rtt_ms": 2 * float(delay) / 1000 if isinstance(delay, int | float) else None,
            "loss": _chain_loss(c), "note": f"{c.get('direction')} phase {c.get('phase')}",
            **_offset_columns(c),
        })  # fmt: skip
    for f in link.get("failovers") or []:
        rows.append({"condition": condition, "dev": str(f.get("device")), "t": f.get("t"),
                     "kind": "failover", "note": f"failover to {f.get('to')}",
                     **_offset_columns(f)})  # fmt: skip
    return pd.DataFrame(rows, columns=list(SCHEMAS["link_changes"].names))


def _offset_columns(event: dict[str, Any]) -> dict[str, Any]:
    return {k: event.get(k) for k in ("clock_offset_s", "clock_offset_err_s")}


def host_rows(
    status: list[dict[str, Any]], info: list[dict[str, Any]], condition: str
) -> pd.DataFrame:
    """The `hosts` table: each agent's status (its own clock) completed with the controller's
    `info` on that host (by `dev`: role, host_class, clock offset); an `info` entry with no
    status but its own t_start / t_end (the server, timed by the controller) is a row too."""
    by_name = {i["dev"]: i for i in info}
    rows = [{**by_name.get(st.get("dev"), {}), **st} for st in status]
    seen = {st.get("dev") for st in status}
    rows += [
        {**i, "clock": "controller"}
        for i in info
        if i["dev"] not in seen and i.get("t_start") is not None and i.get("t_end") is not None
    ]
    return pd.DataFrame(rows).assign(condition=condition) if rows else pd.DataFrame()


def pacing_frame(folder: ConditionFolder, condition: str) -> pd.DataFrame:
    """The `pacing` table: each host's paced engines (a row without `dev`, the server's, is its
    host folder's)."""
    rows = [
        {"dev": path.parent.name, **row, "condition": condition}
        for path in sorted(folder.hosts.glob("*/pacing.jsonl"))
        for row in read_records(path)
    ]
    return pd.DataFrame(rows)


def score_target(requests: pd.DataFrame) -> pd.DataFrame:
    """Score the target's own answers (`target_text`) as the devices' answers are scored, so
    a condition's accuracy can be set beside the target's on the same problems."""
    if "target_text" not in requests or "reference" not in requests:
        return requests
    scored = [
        score_answer(t, r) if isinstance(t, str) and r is not None else (None, None)
        for t, r in zip(requests["target_text"], requests["reference"])
    ]
    return requests.assign(
        target_strict_correct=[s for s, _ in scored],
        target_flexible_correct=[f for _, f in scored],
    )


def tables_from_records(
    folder: ConditionFolder,
    condition: str,
    score: Callable[[pd.DataFrame], pd.DataFrame],
    slo: Slo | None = None,
    costs: CostTable | None = None,
    hosts_info: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write a condition's typed Parquet tables from the agents' fetched records (under
    `hosts/<host>/` of the condition's folder) and its link.json; return the condition's figures
    (`ConditionStats.as_row`). `score` adds the answer-checking columns to the requests;
    `hosts_info` gives what the controller knows of each host (see `host_rows`), its clock
    offset among it: the link changes' reactions set the devices' rounds, moved by it, against
    the changes (`testbed.metrics.link_reaction`)."""
    hosts_dir = folder.hosts

    def records(name: str) -> pd.DataFrame:
        return frame_from_jsonl(sorted(hosts_dir.glob(f"*/{name}.jsonl")), condition=condition)

    rounds = write_typed("rounds", records("rounds"), folder)
    raw_requests = records("requests")
    requests = write_typed(
        "requests",
        score_target(score(raw_requests)) if not raw_requests.empty else raw_requests,
        folder,
    )
    for name in ("verifications", "batches"):
        write_typed(name, records(name), folder)
    pacing = write_typed("pacing", pacing_frame(folder, condition), folder)
    status = [  # a status without `dev` (the server's) is its host folder's
        {"dev": p.parent.name, **json.loads(p.read_text())}
        for p in sorted(hosts_dir.glob("*/status.json"))
    ]
    hosts = write_typed("hosts", host_rows(status, hosts_info or [], condition), folder)
    link_file = folder.link
    link = json.loads(link_file.read_text()) if link_file.exists() else {}
    write_typed("links", link_rows(link, condition), folder)
    changes = link_change_rows(link, condition)
    changes["reaction_s"] = reactions_s(changes, rounds, offsets_by_host(hosts))
    changes = write_typed("link_changes", changes, folder)
    return ConditionStats.from_frames(
        rounds, requests, hosts, slo=slo, costs=costs, pacing=pacing, changes=changes
    ).as_row()
