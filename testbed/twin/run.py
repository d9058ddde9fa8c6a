"""`testbed simulate`: a playbook's sweep through the twin, written as a run folder.

The folder is a lab run's (manifest, journal, conditions.parquet, each condition's rounds,
requests and hosts tables), so `testbed report`, the dashboard, `testbed compare` and DuckDB
read it unchanged; its manifest says `simulated: true` and every condition's backend is
`twin`, which the report and the dashboard show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.config.playbook import (
    DEFAULT_MAX_CONDITIONS,
    Condition,
    expand,
    load_playbook,
    planned_ids,
)
from testbed.metrics.condition_stats import ConditionStats
from testbed.results.condition_table import write_condition_table
from testbed.results.manifest import build_manifest
from testbed.results.store import ConditionFolder, RunStore
from testbed.results.tables import typed_table, write_typed
from testbed.runner.run import new_run_dir
from testbed.twin.inputs import TwinCondition, twin_condition
from testbed.twin.measured import MeasuredAcceptance
from testbed.twin.sled import Twin

BACKEND = "twin"


def twin_seed(cond: Condition) -> int:
    """The twin's random seed: the run's and the workload's (which repetitions shift)."""
    pb = cond.playbook
    return pb.seed * 1_000_003 + pb.workload.seed


def simulated_figures(
    cond: Condition, tc: TwinCondition, folder: ConditionFolder | None = None, draw: int = 0
) -> dict[str, Any]:
    """The twin's run of one condition, its figures through the lab's own ConditionStats
    (its rounds, requests and hosts tables written into `folder`, where given); `draw`
    shifts its seed (another draw of the same condition)."""
    records = Twin(tc, seed=twin_seed(cond) + draw).run()
    typed = {}
    for name, rows in vars(records).items():
        frame = pd.DataFrame(rows).assign(condition=cond.id)
        typed[name] = (write_typed(name, frame, folder) if folder is not None
                       else typed_table(name, frame).to_pandas())  # fmt: skip
    return ConditionStats.from_frames(typed["rounds"], typed["requests"], typed["hosts"],
                                      slo=cond.playbook.workload.slo).as_row()  # fmt: skip


def simulate(
    playbook: Path,
    out: Path | None = None,
    acceptance: float | MeasuredAcceptance | None = None,
    devices: int | None = None,
    repetitions: int | None = None,
    say: Callable[[str], None] = print,
    max_conditions: int = DEFAULT_MAX_CONDITIONS,
) -> RunStore:
    """Simulate every condition of the playbook; returns the run folder written."""
    pb, source = load_playbook(playbook), str(playbook)
    if repetitions:  # each repetition draws other requests and another link and acceptance
        pb = pb.model_copy(
            update={"workload": pb.workload.model_copy(update={"repetitions": repetitions})}
        )
    conditions = expand(pb, source, max_conditions)
    twins = [
        twin_condition(c, source, acceptance, devices) for c in conditions
    ]  # all checked first
    store = RunStore(new_run_dir(pb, out))
    store.create(build_manifest(store.root.name, pb.model_dump(mode="json"),
                                playbook_file=source, simulated=True,
                                condition_count=len(conditions),
                                conditions=planned_ids(conditions)))  # fmt: skip
    store.playbook_path.write_text(playbook.read_text())
    for cond, tc in zip(conditions, twins):
        t0 = time.time()
        staged = store.staging(cond.id)
        metrics = simulated_figures(cond, tc, staged) | {"acceptance_as": tc.acceptance,
                                    "acceptance_as_source": tc.acceptance_source}  # fmt: skip
        link = {"backend": BACKEND, "requested": cond.playbook.link.model_dump(mode="json")}
        entry = {"condition": cond.id, "index": cond.index, "values": cond.values,
                 "started": t0, "status": "done", "seconds": time.time() - t0, "link": link,
                 "metrics": metrics, "simulated": True}  # fmt: skip
        store.commit(cond.id, staged, entry)
        say(f"{cond.id}: simulated {len(tc.devices)} devices, "
            f"{metrics.get('system_verified_tok_s') or 0:.1f} verified tok/s "
            f"({entry['seconds']:.1f} s)")  # fmt: skip
    write_condition_table(store)
    return store
