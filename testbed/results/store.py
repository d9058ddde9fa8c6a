"""A run folder on disk, the one place that knows its layout, and the rules that make an
interrupted run resumable.

Layout (see results/README.md):
    <run>/manifest.json          written first: playbook, commit, versions, host facts, seeds
    <run>/playbook.yaml          the resolved playbook a resume runs (as given: .source.yaml)
    <run>/journal.jsonl          one line per finished condition (done or failed), appended
    <run>/conditions/<cid>/      the condition's folder (`ConditionFolder`)
    <run>/conditions.parquet     one row per condition, rebuilt from the journal
    <run>/reference_answers.json the target's own greedy answers, computed on the server host
                                 once per problem and answer length (testbed.runner.reference)

A condition's folder is filled under `conditions/.<cid>.partial/` and renamed into place before
its journal line is appended, so after a crash a condition is either complete and journaled,
or absent and run again on resume: never lost, never duplicated.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.core.files import append_json_line, atomic_write_json

JOURNAL = "journal.jsonl"
MANIFEST = "manifest.json"
CONDITIONS = "conditions"
CONDITION_TABLE = "conditions.parquet"
PLAYBOOK = "playbook.yaml"
PLAYBOOK_SOURCE = "playbook.source.yaml"
REFERENCE_ANSWERS = "reference_answers.json"


@dataclass(frozen=True)
class ConditionFolder:
    """One condition's folder (staged, or committed into the run):

    <table>.parquet     its typed tables (testbed.metrics.schemas)
    link.json           the links as asked, applied, measured, and what happened to them
    inputs/             what the agents were given (problems, emulation documents, users)
    hosts/<host>/       each agent's records, status and log as fetched
    pilots/x<N>/        the pilots of `lab.time_dilation: auto`, each a condition folder
    tries/x<N>/         auto: a whole try of the condition that ran behind at dilation N
    error.txt           the traceback of a failed condition
    """

    root: Path

    def table(self, name: str) -> Path:
        return self.root / f"{name}.parquet"

    @property
    def link(self) -> Path:
        return self.root / "link.json"

    @property
    def error(self) -> Path:
        return self.root / "error.txt"

    @property
    def hosts(self) -> Path:
        return self.root / "hosts"

    def host(self, name: str) -> Path:
        return self.hosts / name

    def inputs(self) -> Path:
        """The inputs folder (made if missing)."""
        path = self.root / "inputs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def file(self, name: str) -> Path:
        """Another file of the condition (e.g. BALANCE's cost-model.json)."""
        return self.root / name

    def set_aside(self, dilation: float) -> Path:
        """Move the condition's files (all but its pilots and earlier tries) to `tries/x<N>/`,
        leaving the folder ready for another try; the folder they went to."""
        dest = self.root / "tries" / f"x{dilation:g}"
        dest.mkdir(parents=True, exist_ok=False)
        for path in list(self.root.iterdir()):
            if path.name not in ("pilots", "tries"):
                path.rename(dest / path.name)
        return dest

    def pilot(self, dilation: float) -> ConditionFolder:
        """The folder of the pilot at `dilation` (made if missing)."""
        path = self.root / "pilots" / f"x{dilation:g}"
        path.mkdir(parents=True, exist_ok=True)
        return ConditionFolder(path)


def is_run(path: Path) -> bool:
    """Whether `path` is a run folder (it has a manifest)."""
    return (Path(path) / MANIFEST).is_file()


def run_folders(results: Path) -> list[Path]:
    """The run folders directly under `results`, by name. A link (the nightly's `last-good`)
    names a run that is already there, so it is not another run."""
    if not Path(results).is_dir():
        return []
    return [p for p in sorted(Path(results).iterdir()) if is_run(p) and not p.is_symlink()]


class RunStore:
    """One run folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def condition_table(self) -> Path:
        return self.root / CONDITION_TABLE

    @property
    def playbook_path(self) -> Path:
        return self.root / PLAYBOOK

    @property
    def playbook_source_path(self) -> Path:
        return self.root / PLAYBOOK_SOURCE

    @property
    def reference_answers(self) -> Path:
        return self.root / REFERENCE_ANSWERS

    def tables(self, name: str) -> list[Path]:
        """Table `name` of every committed condition."""
        return sorted(self.root.glob(f"{CONDITIONS}/*/{name}.parquet"))

    def table_names(self) -> list[str]:
        """The tables the committed conditions hold."""
        return sorted({p.stem for p in self.root.glob(f"{CONDITIONS}/*/*.parquet")})

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
        (self.root / CONDITIONS).mkdir(parents=True, exist_ok=True)
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

    def finished(self, retry_failed: bool = False, rerun_faulted: bool = False) -> set[str]:
        """Condition ids that need no run: done ones, faulted ones unless rerun, failed ones
        unless retried."""
        again = {"failed"} if retry_failed else set()
        again |= {"faulted"} if rerun_faulted else set()
        return {e["condition"] for e in self.journal() if e["status"] not in again}

    def staging(self, cid: str) -> ConditionFolder:
        """A fresh partial folder for condition cid (a stale one from a crash is discarded)."""
        path = self.root / CONDITIONS / f".{cid}.partial"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return ConditionFolder(path)

    def condition_dir(self, cid: str) -> Path:
        return self.root / CONDITIONS / cid

    def condition(self, cid: str) -> ConditionFolder:
        """Committed condition cid's folder."""
        return ConditionFolder(self.condition_dir(cid))

    def commit(self, cid: str, staged: ConditionFolder, entry: dict[str, Any]) -> None:
        """Move the staged folder into place, then journal the condition."""
        final = self.condition_dir(cid)
        if final.exists():
            shutil.rmtree(final)
        staged.root.rename(final)
        append_json_line(self.journal_path, entry)

    def record_failure(
        self, cid: str, staged: ConditionFolder | None, entry: dict[str, Any]
    ) -> None:
        """Keep whatever was gathered (for diagnosis) and journal the failure."""
        if staged is not None and staged.root.exists():
            final = self.condition_dir(cid)
            if final.exists():
                shutil.rmtree(final)
            staged.root.rename(final)
        append_json_line(self.journal_path, entry)
