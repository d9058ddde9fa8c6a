"""`testbed bench dilation`: one SLED condition at several time dilations, side by side.

Runs `experiments/time-dilation.yaml` (scaled by the options) through `testbed run` on the
namespace lab, so each dilation is a condition of one run on one lab, and prints per
dilation the verified tokens/s and latency in emulated time, their ratio to the first
dilation's, the forwards behind their modelled time, and whether every answer's tokens equal
the first dilation's. Goal: within 5 % of each other, identical tokens.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from testbed.core.paths import REPO_ROOT

PLAYBOOK = REPO_ROOT / "experiments" / "time-dilation.yaml"


def scaled_playbook(devices: int, problems: int, dilations: list[float], folder: Path) -> Path:
    """The shipped playbook with the benchmark's fleet, workload and dilations."""
    data = yaml.safe_load(PLAYBOOK.read_text())
    data["topology"] = str(REPO_ROOT / data["topology"])
    data["lab"]["devices"] = devices
    data["workload"]["problems_per_device"] = problems
    data["sweep"] = {"lab.time_dilation": dilations}
    path = folder / "time-dilation.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def answers(run: Path, condition: str) -> dict[tuple[str, str], list[int]]:
    """(device, problem) -> the answer's token ids in one condition of a run."""
    df = pd.read_parquet(run / "conditions" / condition / "requests.parquet")
    return {(str(d), str(p)): list(i) for d, p, i in zip(df["dev"], df["problem"], df["ids"])}
