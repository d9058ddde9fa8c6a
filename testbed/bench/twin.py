"""The twin against the lab, and at fleet scale.

`validate_runs`: for every done condition of lab run folders, the twin runs the same
condition (the run's saved playbook) with the acceptance the lab measured at each position of
a round and its spread over devices (`testbed.twin.measured`: the tiny pair accepts a round's
first draft more often than its fourth, and at a steadier rate than independent tokens), on
the hardware and model shapes its hosts were paced with (`lab_compute`: the condition's
`inputs/<host>.emulation.json`, so a later catalogue does not move an old run's point),
`DRAWS` times, and each figure's mean (± its standard deviation) is set beside the lab's with
its error: system verified tok/s, TPOT p50 and p90, TTFT p50, fallback share (goal:
throughput and TPOT p50 within 5 %, p90 within 10 %).

`fleet_scale`: one condition of a playbook with N devices through the twin: wall seconds,
simulated seconds, devices per wall second of simulation and the process's peak memory.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from agents.emulation.settings import EmulationError, parse_emulation
from agents.emulation.stepcost import Hardware, ModelShape
from testbed.config.playbook import expand, load_playbook
from testbed.results.store import RunStore
from testbed.twin.inputs import TwinCondition, twin_condition
from testbed.twin.measured import MeasuredAcceptance, condition_acceptance
from testbed.twin.run import simulated_figures, twin_seed
from testbed.twin.sled import Twin

FIGURES = (  # metric, goal (relative error), how it reads
    ("system_verified_tok_s", 0.05, "verified tok/s"),
    ("tpot_p50_ms", 0.05, "TPOT p50 ms"),
    ("tpot_p90_ms", 0.10, "TPOT p90 ms"),
    ("ttft_p50_ms", None, "TTFT p50 ms"),
    ("fallback_share", None, "fallback"),
)


DRAWS = 10
"""Twin draws per lab point: one lab run of one request a device is itself one draw of a
spread of about 13 % (README, the twin against the seed run), so the twin gives its mean and
standard deviation over this many seeds and a lab figure is judged against both."""


def link_lead_s(folder: Path) -> float:
    """How long before its devices' first request the lab applied the condition's links (the
    holders' first change, `link.json`), in emulated seconds; 0 where either is missing."""
    try:
        changes = json.loads((folder / "link.json").read_text()).get("changes") or []
        starts = pd.read_parquet(folder / "requests.parquet", columns=["t_start"])["t_start"]
    except (OSError, ValueError, KeyError):
        return 0.0
    applied = [c["at"] for c in changes if c.get("phase", 0) == 0 and "at" in c]
    return max(0.0, float(starts.min()) - min(applied)) if applied and len(starts) else 0.0


def device_starts(folder: Path) -> dict[str, float]:
    """Each device's first request, in seconds after the first device's (the runner starts
    the agents one after another); empty where the lab run does not say."""
    try:
        requests = pd.read_parquet(folder / "requests.parquet", columns=["dev", "t_start"])
    except (OSError, ValueError, KeyError):
        return {}
    first = requests.groupby("dev")["t_start"].min()
    return {str(d): float(t) for d, t in (first - first.min()).items()}


@dataclass(frozen=True)
class LabCompute:
    """The compute a lab condition's hosts were paced as (their emulation files)."""

    hardware: dict[str, Hardware]  # host name -> hardware
    models: dict[str, ModelShape]  # role (draft, target) -> shape


def lab_compute(folder: Path) -> LabCompute:
    """The hardware and model shapes of `folder/inputs/<host>.emulation.json`; empty where
    a file is missing or unreadable (the catalogue's then stand)."""
    hardware: dict[str, Hardware] = {}
    models: dict[str, ModelShape] = {}
    for path in sorted((folder / "inputs").glob("*.emulation.json")):
        try:
            emulation = parse_emulation(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, EmulationError):
            continue
        if emulation.hardware is not None:
            hardware[path.name.removesuffix(".emulation.json")] = emulation.hardware
        models.update(emulation.models)
    return LabCompute(hardware, models)


def with_lab_compute(tc: TwinCondition, compute: LabCompute) -> TwinCondition:
    """tc with the lab's hardware per host and its model shapes, where the lab recorded them."""
    devices = tuple(
        replace(d, hardware=compute.hardware.get(d.name, d.hardware)) for d in tc.devices
    )
    return replace(
        tc,
        devices=devices,
        server=compute.hardware.get("server", tc.server),
        draft=compute.models.get("draft", tc.draft),
        target=compute.models.get("target", tc.target),
    )


def twin_figures(
    cond, source: str, acceptance: float | MeasuredAcceptance | None, draws: int = DRAWS,
    lead: float = 0.0,
    starts: dict[str, float] | None = None, compute: LabCompute | None = None,
) -> tuple[dict[str, float | None], dict[str, float | None]]:  # fmt: skip
    """The twin's figures of one condition through the lab's own ConditionStats: the mean
    over `draws` seeds, and the standard deviation (`lead`: the lab's link steps began that
    long before its devices; `starts`: each device's start after the first's; `compute`: the
    lab's hosts' hardware and models in place of the catalogue's)."""
    tc = twin_condition(cond, source, acceptance, link_lead_s=lead)
    if compute is not None:
        tc = with_lab_compute(tc, compute)
    if starts:
        devices = tuple(replace(d, start_s=starts.get(d.name, 0.0)) for d in tc.devices)
        tc = replace(tc, devices=devices)
    rows = [simulated_figures(cond, tc, draw=i) for i in range(draws)]
    frame = pd.DataFrame([{m: r.get(m) for m, _, _ in FIGURES} for r in rows], dtype=float)
    mean, sd = frame.mean(), frame.std(ddof=1) if draws > 1 else frame.mean() * 0
    return ({m: None if pd.isna(mean[m]) else float(mean[m]) for m, _, _ in FIGURES},
            {m: None if pd.isna(sd[m]) else float(sd[m]) for m, _, _ in FIGURES})  # fmt: skip


@dataclass(frozen=True)
class Point:
    run: str
    condition: str
    mode: str
    devices: int
    lab: dict[str, float | None]
    twin: dict[str, float | None]  # the mean over the twin's draws
    spread: dict[str, float | None]  # their standard deviation

    def error(self, metric: str) -> float | None:
        a, b = self.lab.get(metric), self.twin.get(metric)
        if a is None or b is None or pd.isna(a) or pd.isna(b) or a == 0:
            return None
        return (b - a) / a

    def within_spread(self, metric: str) -> bool | None:
        """Whether the lab's figure lies within one standard deviation of the twin's mean."""
        a, b, sd = self.lab.get(metric), self.twin.get(metric), self.spread.get(metric)
        if a is None or b is None or sd is None or pd.isna(a) or pd.isna(b):
            return None
        return abs(a - b) <= sd


def validate_runs(runs: list[Path]) -> list[Point]:
    """Every done SLED or centralized condition of the runs, twin beside lab."""
    points = []
    for root in runs:
        store = RunStore(root)
        pb = load_playbook(store.playbook_path)
        by_id = {e["condition"]: e for e in store.journal() if e["status"] == "done"}
        for cond in expand(pb, str(store.playbook_path)):
            entry = by_id.get(cond.id)
            if entry is None or cond.playbook.mode not in ("sled", "centralized"):
                continue
            lab = entry.get("metrics") or {}
            folder = store.condition_dir(cond.id)
            lead = link_lead_s(folder) if cond.playbook.link.varies else 0
            measured = condition_acceptance(folder) if cond.playbook.mode == "sled" else None
            twin, spread = twin_figures(cond, str(store.playbook_path), measured or 0.8,
                                        lead=lead, starts=device_starts(folder),
                                        compute=lab_compute(folder))  # fmt: skip
            points.append(Point(root.name, cond.id, cond.playbook.mode,
                                int(lab.get("devices") or 0), lab, twin, spread))  # fmt: skip
    return points


def validation_rows(points: list[Point]) -> tuple[list[str], list[list[str]]]:
    headers = ["condition", "mode", "devices"]
    for _, _, name in FIGURES:
        headers += [f"{name} lab", "twin", "err"]
    rows = []
    for p in points:
        cells = [p.condition[:32], p.mode, str(p.devices)]
        for metric, _, _ in FIGURES:
            a, b, e = p.lab.get(metric), p.twin.get(metric), p.error(metric)
            sd = p.spread.get(metric)
            twin = "-" if b is None else f"{b:.3g}" + ("" if not sd else f"±{sd:.2g}")
            cells += ["-" if a is None else f"{a:.3g}", twin,
                      "-" if e is None else f"{e:+.0%}"]  # fmt: skip
        rows.append(cells)
    return headers, rows


def within_goal(points: list[Point]) -> dict[str, tuple[int, int, int]]:
    """Per figure with a goal: points within it, points within the twin's spread (one
    standard deviation of its draws), points judged."""
    out = {}
    for metric, goal, name in FIGURES:
        if goal is None:
            continue
        judged = [p for p in points if p.error(metric) is not None]
        out[name] = (sum(abs(p.error(metric) or 0) <= goal for p in judged),
                     sum(bool(p.within_spread(metric)) for p in judged), len(judged))  # fmt: skip
    return out


@dataclass(frozen=True)
class Scale:
    devices: int
    mode: str
    wall_s: float
    simulated_s: float
    rounds: int
    fallback_share: float  # tokens kept unverified, of all
    peak_mb: float

    @property
    def devices_per_s(self) -> float:
        return self.devices / self.wall_s


def fleet_scale(playbook: Path, devices: int, acceptance: float) -> list[Scale]:
    """The playbook's first SLED and first centralized condition with `devices` devices."""
    pb = load_playbook(playbook)
    out, seen = [], set()
    for cond in expand(pb, str(playbook)):
        if cond.playbook.mode in seen or cond.playbook.mode not in ("sled", "centralized"):
            continue
        seen.add(cond.playbook.mode)
        tc = twin_condition(cond, str(playbook), acceptance, devices)
        t0 = time.perf_counter()
        records = Twin(tc, seed=twin_seed(cond)).run()
        wall = time.perf_counter() - t0
        span = max(r["t_end"] for r in records.requests) - min(
            r["t_start"] for r in records.requests
        )
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        kept = sum(r["fallback_tokens"] for r in records.requests)
        share = kept / max(1, sum(r["tokens"] for r in records.requests))
        out.append(Scale(devices, cond.playbook.mode, wall, span, len(records.rounds), share,
                         peak))  # fmt: skip
    return out
