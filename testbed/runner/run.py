"""A whole run: playbook -> conditions -> lab up -> each condition -> journal -> tables."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from testbed.balance.budget import check_budget
from testbed.config.faults import check_faults
from testbed.config.playbook import (
    DEFAULT_MAX_CONDITIONS,
    LAB_MAX_DEVICES,
    TWIN_MAX_DEVICES,
    Condition,
    Playbook,
    Sweep,
    expand,
    lab_playbook,
    load_playbook,
    planned_ids,
    playbook_topology,
    with_lab,
)
from testbed.core.errors import BadInputError, LabError, TestbedError
from testbed.core.paths import results_dir
from testbed.hosts.control import HostControl
from testbed.hosts.inventory import load_inventory
from testbed.hosts.liveness import not_answering
from testbed.labs.interface import Lab
from testbed.labs.kinds import lab_class
from testbed.labs.physical import inventory_topology
from testbed.labs.setup import LabSetup
from testbed.labs.system import SystemRunner
from testbed.metrics.schemas import FaultRecord
from testbed.results.condition_table import write_condition_table
from testbed.results.manifest import build_manifest, model_digests
from testbed.results.store import ConditionFolder, RunStore
from testbed.results.tables import write_typed
from testbed.runner.context import RunContext, condition_devices
from testbed.runner.emulation import check_emulation, time_dilation
from testbed.runner.models import resolve_models
from testbed.runner.modes import condition_runner
from testbed.runner.pilot import at_dilation, run_dilated
from testbed.runner.reference import ReferenceBook
from testbed.runner.watch import agents_ended, ended_fault, fault_fields, unasked
from testbed.runner.workload import check_workload
from testbed.topo.topology import Topology

LAB_NAME = "run"
LAB_NAME_ENV = "TESTBED_LAB_NAME"
LAB_SUBNET_ENV = "TESTBED_LAB_SUBNET"
LOST_AFTER_S = 5.0
"""A device that does not run `true` over its SSH connection within this long, between
conditions, is lost (at the start of a run, testbed.hosts.liveness allows longer)."""


def run_topology(pb: Playbook, source: str) -> Topology:
    """The playbook's topology; on an inventory lab with none named, the inventory's hosts."""
    if pb.lab.kind == "inventory" and pb.topology is None and pb.lab.inventory:
        return inventory_topology(load_inventory(pb.lab.inventory), pb.link)
    return playbook_topology(pb, source)


def run_lab_setup(pb: Playbook, source: str) -> LabSetup:
    """The lab a run brings up: the playbook's topology as lab `run` on the default subnet
    unless the environment names another (TESTBED_LAB_NAME, TESTBED_LAB_SUBNET), so that two
    runs can share one machine."""
    pb = lab_playbook(pb)
    fields: dict[str, object] = {
        "name": os.environ.get(LAB_NAME_ENV, LAB_NAME),
        "topology": run_topology(pb, source),
        "inventory": pb.lab.inventory,
    }
    if os.environ.get(LAB_SUBNET_ENV):
        fields["subnet"] = os.environ[LAB_SUBNET_ENV]
    return LabSetup.build(f"{source}: lab", **fields)


FULL_CHECK = 1000  # up to this many conditions, a run checks every one before the lab comes up


def check_conditions(conditions: Sweep, topology: Topology, source: str) -> None:
    """Refuse, before the lab comes up, a condition with more devices than a lab holds, whose
    dilation its lab cannot run, whose models the catalogue lacks or its hosts cannot hold, or
    whose injected faults it cannot take (every condition of a sweep up to FULL_CHECK; past
    that the base playbook, the rest as the run reaches them)."""
    todo = conditions if len(conditions) <= FULL_CHECK else [next(iter(conditions))]
    for cond in todo:
        where = f"{source} ({cond.id})" if conditions.keys else source
        count = cond.playbook.lab.devices
        if count is not None and count > LAB_MAX_DEVICES:
            raise BadInputError(
                f"{where}: lab.devices: {count} is over the {LAB_MAX_DEVICES} devices a lab "
                f"holds (the twin, testbed simulate, takes up to {TWIN_MAX_DEVICES:,})"
            )
        cls = cond.playbook.lab.device_class
        classed = topology if cls is None else topology.with_device_class(cls)
        hosts = [(h.name, h.role, h.host_class) for h in classed.hosts]
        time_dilation(cond.playbook, where)
        check_emulation(cond.playbook, hosts, where)
        check_workload(cond.playbook, where)
        devices = [h.name for h in topology.hosts if h.role == "device"][:count]
        check_faults(cond.playbook.faults, cond.playbook.mode, devices,
                     cond.playbook.condition_timeout_s, where)  # fmt: skip
        if cond.playbook.mode == "balance":
            check_budget(cond.playbook, topology.server.host_class, where)


def _import_torch_before_ansible() -> None:
    """Import torch's compiler before the lab's inventory is read through ansible-core.

    ansible-core replaces `sys.intern` by a callable object when imported; torch._dynamo,
    imported later (by a model loaded on the controller, as in the tiny pair's build),
    refuses that object and fails. Imported first, torch registers the real `sys.intern` and
    both work.
    """
    import torch._dynamo  # noqa: F401


@contextmanager
def running_lab(kind: str, setup: LabSetup, say: Callable[[str], None]) -> Iterator[Lab]:
    """The lab of `kind` up for the block, and always down after it; `say` hears how it came
    up (on lab kind `inventory`, what it took from the site playbook's facts)."""
    lab = lab_class(kind).up(setup, progress=lambda msg: say(f"  {msg}"))
    try:
        yield lab
    finally:
        lab.down()


@dataclass
class RunOutcome:
    store: RunStore | None
    done: int
    failed: int
    skipped: int
    faulted: int = 0


def new_run_dir(pb: Playbook, base: Path | None = None) -> Path:
    """results/<name>-<YYYYmmdd-HHMMSS> (suffixed if that exists)."""
    root = base or results_dir()
    stem = f"{pb.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = root / stem, 1
    while path.exists():
        n += 1
        path = root / f"{stem}-{n}"
    return path


def save_playbook(store: RunStore, pb: Playbook) -> None:
    """The resolved playbook, as a resume runs it, in its own key order (the order of the
    sweep's keys makes the condition ids)."""
    store.playbook_path.write_text(yaml.safe_dump(pb.model_dump(mode="json"), sort_keys=False))


def playbook_for_resume(store: RunStore) -> tuple[Playbook, str]:
    """The playbook saved in a run folder, revalidated."""
    path = store.playbook_path
    if not path.exists():
        raise BadInputError(f"{store.root}: not a resumable run (no playbook.yaml)")
    return load_playbook(path), str(path)


def check_same_conditions(store: RunStore, conditions: Sweep) -> None:
    """Refuse to resume when the saved playbook no longer expands to the conditions the run
    planned (its manifest lists them): a resume would run them all again under new ids."""
    planned = store.manifest().get("conditions")
    if planned is None:
        return
    now = list(conditions.ids())
    if now != planned:
        differ = next((i for i, (a, b) in enumerate(zip(planned, now)) if a != b), len(planned))
        raise BadInputError(
            f"{store.playbook_path}: expands to other conditions than the run planned "
            f"({len(now)} now, {len(planned)} in manifest.json; first difference at #{differ}: "
            f"{now[differ] if differ < len(now) else '-'} vs "
            f"{planned[differ] if differ < len(planned) else '-'})"
        )


def execute(
    playbook_path: Path | None,
    resume: Path | None = None,
    out: Path | None = None,
    retry_failed: bool = False,
    rerun_faulted: bool = False,
    dry_run: bool = False,
    lab_kind: str | None = None,
    inventory: str | None = None,
    say: Callable[[str], None] = print,
    on_condition: Callable[[dict], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
    max_conditions: int = DEFAULT_MAX_CONDITIONS,
) -> RunOutcome:
    """Run (or resume) a playbook on its lab (`lab.kind`, or `lab_kind` if given); returns how
    many conditions did what.

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
    pb = with_lab(pb, source, lab_kind, inventory)
    conditions = expand(pb, source, max_conditions)
    if store is not None:
        check_same_conditions(store, conditions)
    if dry_run:
        return _dry_run(pb, conditions, say)

    if store is None:
        store = RunStore(new_run_dir(pb, out))
        store.create(build_manifest(store.root.name, pb.model_dump(mode="json"),
                                    playbook_file=source, seeds={"run": pb.seed,
                                    "workload": pb.workload.seed},
                                    condition_count=len(conditions),
                                    conditions=planned_ids(conditions)))  # fmt: skip
        assert playbook_path is not None
        # the resolved playbook (topology applied) is what a resume runs; the file as given
        # is kept beside it for the record
        save_playbook(store, pb)
        store.playbook_source_path.write_text(Path(playbook_path).read_text())
    finished = store.finished(retry_failed, rerun_faulted)
    # lazy: conditions are resolved one at a time as the loop reaches them
    todo = (c for c in conditions if c.id not in finished)
    remaining = len(conditions) - len(finished)  # journaled ids are ids of this sweep
    say(f"run folder {store.root} ({len(conditions)} conditions, {remaining} to run)")
    if on_plan:
        on_plan(remaining)
    if not remaining:
        write_condition_table(store)
        return RunOutcome(store, 0, 0, len(conditions))

    models = resolve_models(pb.models, say)
    _import_torch_before_ansible()
    setup = run_lab_setup(pb, source)
    check_conditions(conditions, setup.topology, source)

    done = failed = faulted = 0
    counts = ", ".join(f"{n} {c}" for c, n in setup.topology.class_counts().items())
    say(f"{pb.lab.kind} lab up: {setup.topology.server.name} + {counts} devices")
    with running_lab(pb.lab.kind, setup, say) as lab, HostControl(lab.inventory()) as hosts:
        digests = model_digests(models.draft, models.target)
        store.update_manifest(
            lab=lab.describe(),
            models={"draft": models.draft, "target": models.target,
                    "tokenizer_hash": models.tokenizer_hash, "sha256": digests},
        )  # fmt: skip
        # the reference answers: computed on the server host, by the model it runs there
        references = ReferenceBook(
            store.reference_answers,
            digests,
            lambda computed: store.update_manifest(reference=computed),
        )
        ctx = RunContext(lab, hosts, models.draft, models.target, references, say)
        for cond in todo:
            if pb.lab.kind == "inventory":
                _leave_out_lost(ctx, store, cond.id)
            entry = _run_one(ctx, store, cond)
            done += entry["status"] == "done"
            failed += entry["status"] == "failed"
            faulted += entry["status"] == "faulted"
            write_condition_table(store)
            if on_condition:
                on_condition(entry)
    return RunOutcome(store, done, failed, len(conditions) - remaining, faulted)


def _leave_out_lost(ctx: RunContext, store: RunStore, cid: str) -> None:
    """Before condition `cid` of a hardware run: devices that stopped answering are left out
    of it and of every later one, said, and recorded in the manifest (`lost_devices`)."""
    still = [d for d in ctx.lab.inventory().devices if d.name not in ctx.lost]
    newly = not_answering(ctx.hosts, still, timeout_s=LOST_AFTER_S)
    if not newly:
        return
    ctx.lost.update(newly)
    ctx.say(f"{cid}: left out from now on (not answering): " + "; ".join(newly.values()))
    lost = store.manifest().get("lost_devices", {})
    lost.update({name: {"before": cid, "reason": why} for name, why in newly.items()})
    store.update_manifest(lost_devices=lost)


def _run_one(ctx: RunContext, store: RunStore, cond: Condition) -> dict:
    """Run a condition, journal it as done or failed (with its reason); never raises. The
    entry names the devices it had (`devices`) and those lost before it (`lost`)."""
    staged = store.staging(cond.id)
    t0 = time.time()
    base = {"condition": cond.id, "index": cond.index, "values": cond.values, "started": t0}
    ctx.faults.clear()
    if ctx.lost:
        names = [d.name for d in condition_devices(ctx.lab.inventory(), cond, ctx.lost)]
        base |= {"devices": names, "lost": dict(ctx.lost)}
    try:
        if ctx.lost and not base["devices"]:
            raise LabError(f"no device left to run on (lost: {', '.join(ctx.lost)})")
        run = condition_runner(cond)
        if cond.playbook.lab.time_dilation == "auto":
            result, base["pilots"] = run_dilated(run, ctx, cond, staged, ctx.say)
        else:
            result = run(ctx, cond, staged)
    except Exception as exc:  # a failed condition is journaled; the sweep goes on
        reason = str(exc) if isinstance(exc, TestbedError) else f"{type(exc).__name__}: {exc}"
        staged.error.write_text(traceback.format_exc())
        asked = cond.playbook.lab.time_dilation
        dilation = 1.0 if asked == "auto" else float(asked)  # auto: the pilots' first, 1
        for ended in agents_ended(exc):
            ctx.faults.append(fault := ended_fault(cond.id, ended, t0, dilation))
            ctx.say(f"{cond.id}: FAULT: {fault.reason}")
        # an agent that ended by itself (a probe, the reference answers) is a fault the
        # condition names; anything else, a failure of the testbed
        status = "faulted" if unasked(ctx.faults) else "failed"
        entry = {**base, "status": status, "reason": reason, "seconds": time.time() - t0,
                 **fault_fields(ctx.faults)}  # fmt: skip
        link = staged.link
        if link.exists():
            entry["link"] = json.loads(link.read_text())
        write_faults(staged, ctx.faults)
        store.record_failure(cond.id, staged, entry)
        return entry
    # an agent that stopped before the runner stopped it makes the condition `faulted`: its
    # figures are kept, and shown as a faulted condition's
    status = "faulted" if unasked(ctx.faults) else "done"
    entry = {**base, "status": status, "seconds": time.time() - t0, **result,
             **fault_fields(ctx.faults)}  # fmt: skip
    write_faults(staged, ctx.faults)
    store.commit(cond.id, staged, entry)
    return entry


def write_faults(staged: ConditionFolder, faults: list[FaultRecord]) -> None:
    """The condition's `faults` table (DuckDB's `faults` view spans the run's)."""
    if staged.root.exists():
        write_typed("faults", pd.DataFrame([dataclasses.asdict(f) for f in faults]), staged)


def _dry_run(pb: Playbook, conditions: Sweep, say: Callable[[str], None]) -> RunOutcome:
    """Print the lab, impairment and Fabric actions of every condition without doing them:
    the same `run_condition` as a real run, on a dry-run lab and host control."""
    runner = SystemRunner(dry_run=True, echo=lambda line: say(f"  {line}"))
    setup = run_lab_setup(pb, "lab")
    check_conditions(conditions, setup.topology, "lab")
    say(f"dry run of {pb.name}: {len(conditions)} conditions; nothing is changed")
    lab = lab_class(pb.lab.kind).up(setup, runner=runner, progress=lambda msg: say(f"  {msg}"))
    hosts = HostControl(lab.inventory(), dry_run=True, echo=lambda line: say(f"  {line}"))
    with hosts, tempfile.TemporaryDirectory() as tmp:
        ctx = RunContext(lab, hosts, "<draft>", "<target>", ReferenceBook(None), say, dry_run=True)
        for cond in conditions:
            say(f"condition {cond.id}")
            staged = ConditionFolder(Path(tmp) / cond.id)
            staged.root.mkdir()
            if cond.playbook.lab.time_dilation == "auto":
                say("  time dilation auto: pilots at dilation 1, 2, 4, ... (shown at 1)")
                cond = at_dilation(cond, 1.0)
            condition_runner(cond)(ctx, cond, staged)
    lab.down()
    return RunOutcome(None, 0, 0, 0)
