"""A whole run: playbook -> conditions -> lab up -> each condition -> journal -> tables."""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from agents.workloads.arithmetic import Problem
from testbed.config.playbook import Condition, Playbook, expand, load_playbook
from testbed.errors import BadInputError, TestbedError
from testbed.hosts.control import HostControl
from testbed.lab.emulated import EmulatedLab
from testbed.lab.spec import LabSpec
from testbed.lab.system import SystemRunner
from testbed.paths import results_dir
from testbed.results.manifest import build_manifest
from testbed.results.report import write_condition_table
from testbed.results.store import RunStore
from testbed.runner.models import resolve_models
from testbed.runner.reference import target_answers
from testbed.runner.sled import RunContext, run_condition

LAB_NAME = "run"


@dataclass
class RunOutcome:
    store: RunStore | None
    done: int
    failed: int
    skipped: int


def new_run_dir(pb: Playbook, base: Path | None = None) -> Path:
    """results/<name>-<YYYYmmdd-HHMMSS> (suffixed if that exists)."""
    root = base or results_dir()
    stem = f"{pb.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = root / stem, 1
    while path.exists():
        n += 1
        path = root / f"{stem}-{n}"
    return path


def playbook_for_resume(store: RunStore) -> tuple[Playbook, str]:
    """The playbook saved in a run folder, revalidated."""
    path = store.root / "playbook.yaml"
    if not path.exists():
        raise BadInputError(f"{store.root}: not a resumable run (no playbook.yaml)")
    return load_playbook(path), str(path)


def execute(
    playbook_path: Path | None,
    resume: Path | None = None,
    out: Path | None = None,
    retry_failed: bool = False,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
    on_condition: Callable[[dict], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Run (or resume) a playbook on the emulated lab; returns how many conditions did what.

    `on_plan(n)` is told how many conditions will run, `on_condition(entry)` each journal
    entry as it is written.
    """
    if resume is not None:
        store = RunStore(resume)
        if not store.manifest_path.exists():
            raise BadInputError(f"{resume}: not a run folder (no manifest.json)")
        pb, source = playbook_for_resume(store)
    else:
        if playbook_path is None:
            raise BadInputError("give a playbook, or --resume RUN")
        pb, source = load_playbook(playbook_path), str(playbook_path)
        store = None
    if pb.lab.kind != "emulated":
        raise BadInputError(
            f"{source}: lab.kind: only 'emulated' runs are supported so far (got {pb.lab.kind!r})"
        )
    conditions = expand(pb, source)
    if dry_run:
        return _dry_run(pb, conditions, say)

    if store is None:
        store = RunStore(new_run_dir(pb, out))
        store.create(build_manifest(store.root.name, pb.model_dump(mode="json"),
                                    playbook_file=source, seeds={"run": pb.seed,
                                    "workload": pb.workload.seed},
                                    conditions=[c.id for c in conditions]))  # fmt: skip
        assert playbook_path is not None
        # the resolved playbook (topology applied) is what a resume runs; the file as given
        # is kept beside it for the record
        (store.root / "playbook.yaml").write_text(yaml.safe_dump(pb.model_dump(mode="json")))
        (store.root / "playbook.source.yaml").write_text(Path(playbook_path).read_text())
    finished = store.finished(retry_failed)
    todo = [c for c in conditions if c.id not in finished]
    say(f"run folder {store.root} ({len(conditions)} conditions, {len(todo)} to run)")
    if on_plan:
        on_plan(len(todo))
    if not todo:
        write_condition_table(store)
        return RunOutcome(store, 0, 0, len(conditions))

    models = resolve_models(pb.models, say)
    spec = LabSpec.build(f"{source}: lab", name=LAB_NAME, devices=pb.lab.devices)

    def reference(problems: list[Problem], max_new: int) -> dict[str, str]:
        return target_answers(
            models.target, problems, max_new, cache=store.root / "reference_answers.json"
        )

    done = failed = 0
    say(f"emulated lab up: 1 server + {pb.lab.devices} devices")
    with EmulatedLab.running(spec) as lab, HostControl(lab.inventory()) as hosts:
        store.update_manifest(
            lab={"kind": "emulated", "name": lab.name, "devices": len(lab.devices),
                 "subnet": str(spec.subnet)},
            models={"draft": models.draft, "target": models.target,
                    "tokenizer_hash": models.tokenizer_hash},
        )  # fmt: skip
        ctx = RunContext(lab, hosts, models.draft, models.target, reference, say)
        for cond in todo:
            entry = _run_one(ctx, store, cond)
            done += entry["status"] == "done"
            failed += entry["status"] == "failed"
            write_condition_table(store)
            if on_condition:
                on_condition(entry)
    return RunOutcome(store, done, failed, len(conditions) - len(todo))


def _run_one(ctx: RunContext, store: RunStore, cond: Condition) -> dict:
    """Run a condition, journal it as done or failed (with its reason); never raises."""
    staged = store.staging(cond.id)
    t0 = time.time()
    base = {"condition": cond.id, "index": cond.index, "values": cond.values, "started": t0}
    try:
        result = run_condition(ctx, cond, staged)
    except Exception as exc:  # a failed condition is journaled; the sweep goes on
        reason = str(exc) if isinstance(exc, TestbedError) else f"{type(exc).__name__}: {exc}"
        (staged / "error.txt").write_text(traceback.format_exc())
        entry = {**base, "status": "failed", "reason": reason, "seconds": time.time() - t0}
        link = staged / "link.json"
        if link.exists():
            entry["link"] = json.loads(link.read_text())
        store.record_failure(cond.id, staged, entry)
        return entry
    entry = {**base, "status": "done", "seconds": time.time() - t0, **result}
    store.commit(cond.id, staged, entry)
    return entry


def _dry_run(pb: Playbook, conditions: list[Condition], say: Callable[[str], None]) -> RunOutcome:
    """Print the lab, impairment and Fabric actions of every condition without doing them:
    the same `run_condition` as a real run, on a dry-run lab and host control."""
    runner = SystemRunner(dry_run=True, echo=lambda line: say(f"  {line}"))
    spec = LabSpec.build("lab", name=LAB_NAME, devices=pb.lab.devices)
    say(f"dry run of {pb.name}: {len(conditions)} conditions; nothing is changed")
    lab = EmulatedLab.up(spec, runner=runner)
    hosts = HostControl(lab.inventory(), dry_run=True, echo=lambda line: say(f"  {line}"))
    with hosts, tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(lab, hosts, "<draft>", "<target>", lambda _p, _n: {}, say, dry_run=True)
        for cond in conditions:
            say(f"condition {cond.id}")
            staged = Path(tmp) / cond.id
            staged.mkdir()
            run_condition(ctx, cond, staged)
    lab.down()
    return RunOutcome(None, 0, 0, 0)
