"""`testbed bench dilation`: one SLED condition at several time dilations, side by side.

Runs `experiments/time-dilation.yaml` (scaled by the options) through `testbed run` on the
namespace lab, so each dilation is a condition of one run on one lab, and prints per
dilation the verified tokens/s and latency in emulated time, their ratio to the first
dilation's, the forwards behind their modelled time, and whether every answer's tokens equal
the first dilation's. Goal: within 5 % of each other, identical tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import typer
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


def cli(
    devices: int = typer.Option(8, help="devices (Pi 5 class) in the condition"),
    problems: int = typer.Option(4, help="problems per device"),
    dilations: str = typer.Option("1,2,4", help="time dilations to compare, comma-separated"),
) -> None:
    """The same condition at dilations 1, 2, 4: emulated-time figures and answers compared."""
    from testbed.results.store import RunStore
    from testbed.runner.run import execute

    try:
        factors = [float(x) for x in dilations.split(",")]
    except ValueError:
        raise typer.BadParameter("expected numbers like 1,2,4", param_hint="--dilations") from None
    with tempfile.TemporaryDirectory() as tmp:
        book = scaled_playbook(devices, problems, factors, Path(tmp))
        outcome = execute(book, out=Path(tmp) / "runs", say=typer.echo)
        assert outcome.store is not None
        journal = RunStore(outcome.store.root).journal()
        first = None
        typer.echo(
            f"\nSLED, {devices} Pi 5 devices (Llama-3.2-1B q4_0) + A100 (Llama-3.1-8B), 85 ms, "
            f"{problems} problems each; figures in emulated time"
        )
        typer.echo(
            f"{'dilation':>9}{'verified tok/s':>16}{'ratio':>8}{'e2e p50 ms':>12}"
            f"{'behind':>10}{'same tokens':>13}"
        )
        for entry in journal:
            m = entry.get("metrics") or {}
            n = entry["values"]["lab.time_dilation"]
            if entry["status"] != "done":
                typer.echo(f"{n:>9g}  failed: {entry.get('reason')}")
                continue
            got = answers(outcome.store.root, entry["condition"])
            if first is None:
                first = (m["system_verified_tok_s"], got)
            same = sum(got.get(k) == v for k, v in first[1].items())
            typer.echo(
                f"{n:>9g}{m['system_verified_tok_s']:>16.2f}"
                f"{m['system_verified_tok_s'] / first[0]:>8.3f}{m['e2e_p50_ms']:>12.1f}"
                f"{m['behind_forwards']:>5}/{m['paced_forwards']:<4}"
                f"{same:>6}/{len(first[1]):<6}"
            )
