"""A run folder as the frames the report, dashboard and compare need: the one place that knows
the folder's layout (see results/README.md), so a change of the store touches only this file.

Figures come from `testbed.metrics.condition_stats.ConditionStats`, built once per condition
from the condition's own tables; nothing here defines a metric.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.core.errors import BadInputError
from testbed.metrics.condition_stats import ConditionStats
from testbed.results import store
from testbed.results.condition_table import condition_frame
from testbed.results.marks import FINISHED
from testbed.results.store import RunStore

# a table's file in a condition folder; the first name that exists wins
TABLE_FILES = {"hosts": ("hosts.parquet", "agents.parquet")}


@dataclass
class RunData:
    """One run folder, read lazily."""

    root: Path
    _tables: dict[tuple[str, str], pd.DataFrame] = field(default_factory=dict, repr=False)
    _stats: dict[str, ConditionStats] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.root.name

    @cached_property
    def manifest(self) -> dict[str, Any]:
        return RunStore(self.root).manifest()

    @cached_property
    def conditions(self) -> pd.DataFrame:
        """One row per condition (journal order), with normalised columns: `loss` (requested
        per-direction loss), `devices`, `mode`, `started` (controller clock)."""
        df = condition_frame(RunStore(self.root))
        if df.empty:
            return df
        df["loss"] = [requested_loss(row) for row in df.to_dict("records")]
        df["devices"] = [self._devices(row) for row in df.to_dict("records")]
        df["mode"] = [row.get("sweep.mode") or self._mode() for row in df.to_dict("records")]
        started = {e["condition"]: e.get("started") for e in RunStore(self.root).journal()}
        df["started"] = [started.get(c) for c in df["condition"]]
        return df

    @property
    def done(self) -> pd.DataFrame:
        """The conditions that finished."""
        df = self.conditions
        return df[df["status"] == "done"] if not df.empty else df

    @property
    def finished(self) -> pd.DataFrame:
        """The conditions whose figures are kept: done and faulted ones (a faulted one shows
        as such; figures draw from `done` only)."""
        df = self.conditions
        return df[df["status"].isin(FINISHED)] if not df.empty else df

    def _devices(self, row: dict[str, Any]) -> int | None:
        for key in ("sweep.lab.devices", "sweep.devices", "devices"):
            value = row.get(key)
            if value is not None and not pd.isna(value):
                return int(value)
        lab = self.manifest.get("lab") or {}
        return lab.get("devices") or (self.manifest.get("playbook") or {}).get("lab", {}).get(
            "devices"
        )

    def _mode(self) -> str:
        return str((self.manifest.get("playbook") or {}).get("mode") or "sled")

    def table(self, cid: str, name: str) -> pd.DataFrame:
        """Condition cid's table `name` (empty when the run lacks it)."""
        key = (cid, name)
        if key not in self._tables:
            folder = self.root / "conditions" / cid
            df = pd.DataFrame()
            for file in TABLE_FILES.get(name, (f"{name}.parquet",)):
                if (folder / file).is_file():
                    df = pd.read_parquet(folder / file)
                    break
            self._tables[key] = df
        return self._tables[key]

    def link(self, cid: str) -> dict[str, Any]:
        """Condition cid's link.json (requested profile, backend, probes), or {}."""
        path = self.root / "conditions" / cid / "link.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def stats(self, cid: str) -> ConditionStats:
        """The condition's stats object, from its rounds, requests, hosts and link_changes
        tables."""
        if cid not in self._stats:
            hosts = self.table(cid, "hosts")
            self._stats[cid] = ConditionStats.from_frames(
                self.table(cid, "rounds"),
                self.table(cid, "requests"),
                hosts if not hosts.empty else None,
                changes=self.table(cid, "link_changes"),
            )
        return self._stats[cid]

    def metric_rows(self) -> pd.DataFrame:
        """One row per finished condition: its journal columns (label, link measured, ...)
        and every figure of its stats object (`ConditionStats.as_row`), the latter winning
        except where it has none (pacing counts live in the journal only)."""
        rows = []
        for row in self.finished.to_dict("records"):
            recomputed = self.stats(row["condition"]).as_row()  # None where records lack it
            rows.append(
                {**row, **{k: v for k, v in recomputed.items() if v is not None or k not in row}}
            )
        return pd.DataFrame(rows)


def requested_loss(row: dict[str, Any]) -> float | None:
    """The per-direction loss a condition asked for (the upstream one when they differ)."""
    for key in ("link_requested.loss_up", "link_requested.loss", "sweep.link.loss"):
        value = row.get(key)
        if isinstance(value, (int, float)) and not pd.isna(value):
            return float(value)
    return None


def load_run(path: Path) -> RunData:
    """A run folder, or BadInputError naming what is missing."""
    path = Path(path)
    if not (path / "manifest.json").is_file():
        raise BadInputError(f"{path}: not a run folder (no manifest.json)")
    return RunData(path)


def run_folders(results: Path) -> list[RunData]:
    """Every run folder directly under results, oldest first (by manifest time, then name)."""
    runs = [RunData(p) for p in store.run_folders(results)]
    return sorted(runs, key=lambda r: (str(r.manifest.get("created", "")), r.name))
