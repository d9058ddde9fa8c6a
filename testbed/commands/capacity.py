"""`testbed capacity PLAYBOOK --rate R`: the largest device count at which every device keeps
R verified tokens/s, by bisection over real runs (or, with `--twin`, over the twin's simulated
conditions, the count found then confirmed by lab runs at it and one device above)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from testbed.commands.exits import exit_codes


def capacity(
    playbook: Path = typer.Argument(..., help="a one-condition playbook (no sweep)"),
    rate: float = typer.Option(..., help="verified tokens/s every device must keep"),
    low: int = typer.Option(1, help="smallest device count to probe"),
    high: int = typer.Option(64, help="largest device count to probe"),
    out: Path | None = typer.Option(None, help="folder for the probes' runs (default results/)"),
    mode: str | None = typer.Option(None, help="override the playbook's mode: sled, centralized"),
    twin: bool = typer.Option(
        False, "--twin", help="search on the twin, then confirm on the lab at N and N+1"
    ),
    acceptance: float | None = typer.Option(
        None, help="--twin: per-token acceptance (default: the stood-for pair's)"
    ),
    acceptance_from: Path | None = typer.Option(
        None, help="--twin: a lab run folder; draw the acceptance its SLED rounds measured"
    ),
) -> None:
    """Bisect the device count; print each probe's figure and the capacity."""
    import time

    from testbed.core.paths import results_dir
    from testbed.report.capacity_searches import found
    from testbed.runner.capacity import run_capacity

    folder = out or results_dir() / f"capacity-{playbook.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    with exit_codes():
        if twin:
            from testbed.twin.capacity import twin_capacity
            from testbed.twin.measured import measured_or_given

            drawn = measured_or_given(acceptance, acceptance_from)
            result = twin_capacity(playbook, rate, folder, low, high, say=typer.echo, mode=mode,
                                   acceptance=drawn).twin  # fmt: skip
        else:
            result = run_capacity(playbook, rate, folder, low, high, say=typer.echo, mode=mode)
    saved = json.loads((folder / "capacity.json").read_text())
    typer.echo(f"{'devices':>8} {'min verified tok/s per device':>30} {'dilation':>9}")
    for probe in sorted(saved["probes"], key=lambda p: p["devices"]):
        n, figure = probe["devices"], probe["figure"]
        shown = "-" if figure is None else f"{figure:.2f}"
        dilation = "-" if probe["time_dilation"] is None else f"x{probe['time_dilation']:g}"
        flags = ("  keeps" if figure is not None and figure >= rate else "") + (
            "" if probe["faithful"] else "  unfaithful"
        )
        typer.echo(f"{n:>8} {shown:>30} {dilation:>9}{flags}")
    shown_capacity = found(result.capacity, saved["probes"])
    lab_says = ""
    if twin:
        typer.echo(f"{'devices':>8} {'twin: min verified tok/s per device':>36}")
        for probe in sorted(saved["twin_probes"], key=lambda p: p["devices"]):
            figure = "-" if probe["figure"] is None else f"{probe['figure']:.2f}"
            typer.echo(f"{probe['devices']:>8} {figure:>36}")
        typer.echo(f"twin: {saved['verdict']} (the lab's probes above)")
        lab_says = f" on the twin, {'' if saved['confirmed'] else 'not '}confirmed on the lab"
    typer.echo(f"capacity at {rate} tok/s: {shown_capacity} devices{lab_says} "
               f"({folder}/capacity.json)")  # fmt: skip
    if shown_capacity.startswith("<"):
        typer.echo("the smallest count probed did not keep it: probe lower with --low")
    behind = [p["devices"] for p in saved["probes"] if not p["faithful"]]
    if not saved["faithful"]:
        typer.echo(
            "unfaithful: the probes that decide it ran behind the hardware they stand for; "
            "rerun with a larger lab.time_dilation (or auto)"
        )
    elif behind:
        typer.echo(f"probes at {behind} devices ran behind; the faithful ones decide the capacity")
    paper = saved.get("paper")
    if paper:
        typer.echo(f"paper: {paper['label']}: {paper['value']:g} devices ({paper['source']})")
        if paper.get("why"):
            typer.echo(f"why they differ: {paper['why']}")
