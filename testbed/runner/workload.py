"""Problems for each device, from the playbook's workload section."""

from __future__ import annotations

import json
from pathlib import Path

from agents.workloads.arithmetic import Problem, heldout_problems, prompt
from agents.workloads.gsm8k import load_gsm8k
from testbed.config.playbook import WorkloadSection


def problems_for(workload: WorkloadSection, devices: list[str]) -> dict[str, list[Problem]]:
    """Distinct problems per device: device i gets the i-th slice of the problem list."""
    n = workload.problems_per_device
    total = n * len(devices)
    if workload.kind == "arithmetic":
        pool = heldout_problems(total, seed=workload.seed)
    else:
        pool = load_gsm8k(workload.gsm8k_path, limit=total)
        if len(pool) < total:
            raise ValueError(
                f"workload.gsm8k_path {workload.gsm8k_path}: has {len(pool)} problems, "
                f"the playbook needs {total} ({n} per device x {len(devices)} devices)"
            )
    return {dev: pool[i * n : (i + 1) * n] for i, dev in enumerate(devices)}


def write_problem_file(problems: list[Problem], path: Path) -> None:
    """The device agent's input: one JSON line per problem (id, prompt, reference)."""
    lines = [json.dumps({"id": p.id, "prompt": prompt(p), "reference": p.result}) for p in problems]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
