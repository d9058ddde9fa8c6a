"""The lab's validated points beside a simulated run's curves: every done SLED and
centralized condition of the lab runs `testbed bench twin` validates the twin on (the
`twin-validation*` runs in the same results folder), at loss up to 5 %, as points of system
verified throughput over device count."""

from __future__ import annotations

from pathlib import Path

from testbed.report.charts import Series
from testbed.report.data import RunData, load_run

VALIDATION_PREFIX = "twin-validation"
MAX_LOSS = 0.05


def validation_runs(results: Path) -> list[RunData]:
    """The lab (not simulated) validation runs under `results`, oldest first."""
    runs = []
    for folder in sorted(results.glob(f"{VALIDATION_PREFIX}*")):
        if not (folder / "manifest.json").is_file():
            continue
        run = load_run(folder)
        if not run.manifest.get("simulated"):
            runs.append(run)
    return runs


def lab_points(results: Path) -> list[Series]:
    """One points series per lab run, mode, target and loss (the labels say which)."""
    series = []
    for run in validation_runs(results):
        df = run.done
        if df.empty:
            continue
        models = (run.manifest.get("playbook") or {}).get("models") or {}
        target = str(models.get("target_as", "?")).split("@")[0]
        df = df.assign(loss=df["loss"].fillna(0))
        df = df[df["mode"].isin(["sled", "centralized"]) & (df["loss"] <= MAX_LOSS)]
        for (mode, loss), part in df.groupby(["mode", "loss"]):
            part = part.sort_values("devices")
            label = f"lab {mode}: {target}, loss {loss:g} ({run.name})"
            series.append(Series(label, [float(n) for n in part["devices"]],
                                 [float(v) for v in part["system_verified_tok_s"]],
                                 style="points"))  # fmt: skip
    return series
