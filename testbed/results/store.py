"""A run folder on disk and the rules that make an interrupted run resumable.

Layout (see results/README.md):
    <run>/manifest.json          written first: playbook, commit, versions, host facts, seeds
    <run>/journal.jsonl          one line per finished condition (done or failed), appended
    <run>/conditions/<cid>/      the condition's tables (Parquet), link.json, agent logs
    <run>/conditions.parquet     one row per condition, rebuilt from the journal

A condition's folder is filled under `conditions/.<cid>.partial/` and renamed into place before
its journal line is appended, so after a crash a condition is either complete and journaled,
or absent and run again on resume: never lost, never duplicated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from testbed.results.atomic import append_json_line, atomic_write_json

JOURNAL = "journal.jsonl"
MANIFEST = "manifest.json"


class RunStore:
    """One run folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def manifest_path(self) -> Path:
        return self.root / MANIFEST

    @property
    def journal_path(self) -> Path:
        return self.root / JOURNAL

    def create(self, manifest: dict[str, Any]) -> None:
        """Start a new run folder with its manifest; refuse to overwrite an existing run."""
        if self.manifest_path.exists():
            raise FileExistsError(f"{self.root}: a run already exists here (use --resume)")
        (self.root / "conditions").mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.manifest_path, manifest)

    def manifest(self) -> dict[str, Any]:
        return json.loads(self.manifest_path.read_text())

    def update_manifest(self, **fields: Any) -> None:
        data = self.manifest()
        data.update(fields)
        atomic_write_json(self.manifest_path, data)

    def journal(self) -> list[dict[str, Any]]:
        """Journal entries, the last one per condition winning (a failed one may be retried)."""
        if not self.journal_path.exists():
            return []
        latest: dict[str, dict[str, Any]] = {}
        with self.journal_path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.endswith("\n"):
                    entry = json.loads(line)
                    latest[entry["condition"]] = entry
        return sorted(latest.values(), key=lambda e: e.get("index", 0))

    def finished(self, retry_failed: bool = False) -> set[str]:
        """Condition ids that need no run: done ones (and failed ones unless retried)."""
        return {
            e["condition"]
            for e in self.journal()
            if e["status"] == "done" or (e["status"] == "failed" and not retry_failed)
        }

    def staging(self, cid: str) -> Path:
        """A fresh partial folder for condition cid (a stale one from a crash is discarded)."""
        path = self.root / "conditions" / f".{cid}.partial"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def condition_dir(self, cid: str) -> Path:
        return self.root / "conditions" / cid

    def commit(self, cid: str, staged: Path, entry: dict[str, Any]) -> None:
        """Move the staged folder into place, then journal the condition."""
        final = self.condition_dir(cid)
        if final.exists():
            shutil.rmtree(final)
        staged.rename(final)
        append_json_line(self.journal_path, entry)

    def record_failure(self, cid: str, staged: Path | None, entry: dict[str, Any]) -> None:
        """Keep whatever was gathered (for diagnosis) and journal the failure."""
        if staged is not None and staged.exists():
            final = self.condition_dir(cid)
            if final.exists():
                shutil.rmtree(final)
            staged.rename(final)
        append_json_line(self.journal_path, entry)
