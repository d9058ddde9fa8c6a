"""`testbed bench hardware`: the cost model against every calibration point of the catalogue.

For each hardware entry of `topologies/hardware.yaml` and each of its calibration points the
bench prints the published (or measured) step time, the cost model's prediction from the
entry's stored fit, the error (goal: within 15 %), and a plain roofline (efficiencies 1, no
overheads, a hard max of memory and compute time) to show why the fit is needed. This VM's
CPU (`this-cpu`: the tiny target under PyTorch; `this-cpu-llamacpp`: the tiny pair under
llama.cpp) is measured live beside its stored points.

The fit (`--fit`): per entry, the fit values named in `fitted` minimise the squared relative
errors of its calibration points (`scipy.optimize.least_squares`, bounded, from several
starts); the others stay at their priors. `--write` puts the new values into the catalogue's
one-line `fit:` entries (and this CPU's measured figures and points), so the runtime never
fits.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from agents.emulation.stepcost import step_time
from testbed.topo.catalogue import (
    FIT_FIELDS,
    CalibrationPoint,
    Catalogue,
    CatalogueFile,
    HardwareEntry,
    PublishedFile,
    effective_bits,
    load_catalogue,
)

GOAL = 0.15  # every calibration point within 15 %
BITS_GOAL = 0.05  # a format's bits within 5 % of its published files' (a third of GOAL: a
# bandwidth-bound step's time is proportional to the bytes it streams)
# The shapes the seed regime of the experiments runs (issue 35): decoding and verification
# forwards (up to VERIFY_TOKENS tokens per sequence) of up to SEED_BATCH sequences, and
# prefills of up to SEED_PREFILL tokens in one forward.
SEED_BATCH, VERIFY_TOKENS, SEED_PREFILL = 64, 16, 1024
LIVE = ("this-cpu", "this-cpu-llamacpp")
BOUNDS = {
    "bw_efficiency": (0.05, 1.0),
    "flops_efficiency": (0.01, 1.0),
    "attention_efficiency": (0.01, 1.0),
    "step_overhead_ms": (0.0, 500.0),
    "layer_overhead_us": (0.0, 10_000.0),
    "seq_overhead_us": (0.0, 50_000.0),
    "token_overhead_us": (0.0, 10_000.0),
    "batched_overhead_ms": (0.0, 500.0),
    "sharpness": (1.0, 20.0),
}
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Row:
    """One calibration point against the model."""

    hardware: str
    point: CalibrationPoint
    predicted_ms: float
    roofline_ms: float

    @property
    def measured_ms(self) -> float:
        return self.point.measured_ms

    @property
    def error(self) -> float:
        """Predicted over measured, minus one."""
        return self.predicted_ms / self.measured_ms - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= GOAL

    def as_dict(self) -> dict[str, Any]:
        p = self.point
        return {
            "hardware": self.hardware,
            "model": p.model,
            "batch": p.batch,
            "new": p.new,
            "context": p.context,
            "measured_ms": self.measured_ms,
            "predicted_ms": self.predicted_ms,
            "error": self.error,
            "within_goal": self.within,
            "roofline_ms": self.roofline_ms,
            "source": p.source,
            "excluded": p.excluded,
            "held_out": p.held_out,
            "seed_regime": in_seed_regime(p),
            "miss": p.miss,
        }


def in_seed_regime(point: CalibrationPoint) -> bool:
    """Whether the point has a shape the seed regime uses (SEED_BATCH and friends)."""
    if point.new <= VERIFY_TOKENS:
        return point.batch <= SEED_BATCH
    return point.batch * point.new <= SEED_PREFILL


def row(cat: Catalogue, name: str, point: CalibrationPoint) -> Row:
    """The model's prediction for one point from the entry's stored fit, and the plain
    roofline's: the larger of memory and compute time at efficiency 1, nothing else."""
    hw = cat.hardware(name, cat.source)
    model = cat.model(point.model, cat.source)
    plain = replace(hw, bw_efficiency=1.0, flops_efficiency=1.0, attention_efficiency=0.0)
    parts = step_time(plain, model, point.shape)
    return Row(
        name,
        point,
        step_time(hw, model, point.shape).seconds * 1e3,
        max(parts.memory_s, parts.compute_s) * 1e3,
    )


def rows(cat: Catalogue) -> list[Row]:
    """Every calibration point of every entry."""
    return [
        row(cat, name, p) for name, entry in cat.spec.hardware.items() for p in entry.calibration
    ]


@dataclass
class Fit:
    """The refitted values of one entry and its points' errors with them."""

    hardware: str
    values: dict[str, float]
    errors: list[float] = field(default_factory=list)

    @property
    def worst(self) -> float:
        return worst_error(self.errors) or 0.0


def worst_error(errors: Iterable[float]) -> float | None:
    """The largest |error|, None for no errors."""
    return max((abs(e) for e in errors), default=None)


def free_values(entry: HardwareEntry) -> list[str]:
    """The entry's fit values the fit may move (its `fitted` names with bounds)."""
    return [f for f in entry.fitted if f in BOUNDS]


def fits(point: CalibrationPoint) -> bool:
    """Whether the fit uses the point: not excluded, not held out (held-out points are judged
    only)."""
    return point.excluded is None and not point.held_out


def fit_entry(cat: Catalogue, name: str, points: list[CalibrationPoint]) -> Fit:
    """Least squares on relative error over the entry's `fitted` values (others fixed)."""
    entry = cat.entry(name, cat.source)
    base = cat.hardware(name, cat.source)
    used = [p for p in points if fits(p)]
    free = free_values(entry)
    if not free or not used:
        return Fit(name, cat.fit_values(name, cat.source))
    from scipy.optimize import least_squares

    lo = np.array([BOUNDS[f][0] for f in free])
    hi = np.array([BOUNDS[f][1] for f in free])
    models = [cat.model(p.model, cat.source) for p in used]
    measured = np.array([p.measured_ms for p in used]) / 1e3

    def residuals(x: np.ndarray) -> np.ndarray:
        hw = replace(base, **dict(zip(free, x.tolist())))
        pred = [step_time(hw, m, p.shape).seconds for m, p in zip(models, used)]
        return np.array(pred) / measured - 1

    current = np.array([getattr(base, f) for f in free], dtype=float)
    starts = [np.clip(current, lo, hi), lo + 0.1 * (hi - lo), lo + 0.01 * (hi - lo)]
    best = min(
        (least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac") for x0 in starts),
        key=lambda r: r.cost,
    )
    values = {**cat.fit_values(name, cat.source), **dict(zip(free, best.x.tolist()))}
    return Fit(name, values, residuals(best.x).tolist())


def predict(cat: Catalogue, name: str, values: dict[str, float], point: CalibrationPoint) -> float:
    """The model's step time (ms) for one point with the entry's fit values replaced."""
    hw = replace(cat.hardware(name, cat.source), **values)
    return step_time(hw, cat.model(point.model, cat.source), point.shape).seconds * 1e3


def leave_one_out(cat: Catalogue, name: str) -> list[float]:
    """Each fitted point's error when the entry is refitted without it: the out-of-sample error
    of the fit (in the order of the entry's fitted points); none where the fit moves no value."""
    entry = cat.entry(name, cat.source)
    if not free_values(entry):
        return []
    points = entry.calibration
    errors = []
    for i, point in enumerate(points):
        if not fits(point):
            continue
        rest = [p for j, p in enumerate(points) if j != i]
        values = fit_entry(cat, name, rest).values
        errors.append(predict(cat, name, values, point) / point.measured_ms - 1)
    return errors


@dataclass(frozen=True)
class Judged:
    """One entry's in-sample, leave-one-out and held-out errors."""

    hardware: str
    points: int  # fitted points
    fitted: int  # values the fit sets
    in_sample: list[float]
    loo: list[float]
    held_out: list[float]
    held_out_seed: list[float] = field(default_factory=list)  # those in the seed regime

    def as_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "points": self.points,
            "fitted_values": self.fitted,
            "in_sample_max_error": worst_error(self.in_sample),
            "loo_max_error": worst_error(self.loo),
            "held_out_points": len(self.held_out),
            "held_out_max_error": worst_error(self.held_out),
            "held_out_seed_points": len(self.held_out_seed),
            "held_out_seed_max_error": worst_error(self.held_out_seed),
        }


def judge(cat: Catalogue, all_rows: list[Row], progress: Progress) -> list[Judged]:
    """Per entry with calibration points: in-sample errors (stored fit), leave-one-out errors
    (refit without each point) where it fits values, held-out points' errors."""
    out = []
    for name, entry in cat.spec.hardware.items():
        mine = [r for r in all_rows if r.hardware == name]
        if not mine:
            continue
        used = [r.error for r in mine if fits(r.point)]
        progress(f"leave-one-out: {name}")
        held = [r.error for r in mine if r.point.held_out]
        seed = [r.error for r in mine if r.point.held_out and in_seed_regime(r.point)]
        loo = leave_one_out(cat, name)
        out.append(Judged(name, len(used), len(free_values(entry)), used, loo, held, seed))
    return out


def _pct(errors: list[float]) -> str:
    worst = worst_error(errors)
    return "-" if worst is None else f"{worst:.1%}"


def judged_table(judged: list[Judged]) -> str:
    head = (
        f"{'hardware':<22} {'points':>6} {'fitted':>6} {'in-sample':>9} {'LOO':>7} "
        f"{'held out':>8} {'(n)':>4} {'in seed':>8} {'(n)':>4}"
    )
    lines = [head]
    for j in judged:
        lines.append(
            f"{j.hardware:<22} {j.points:>6} {j.fitted:>6} {_pct(j.in_sample):>9} "
            f"{_pct(j.loo):>7} {_pct(j.held_out):>8} {len(j.held_out):>4} "
            f"{_pct(j.held_out_seed):>8} {len(j.held_out_seed):>4}"
        )
    return "\n".join(lines)


def held_out_summary(all_rows: list[Row]) -> str:
    """One line: the held-out points in the seed regime within the goal, and the rest."""
    held = [r for r in all_rows if r.point.held_out and r.point.excluded is None]
    seed = [r for r in held if in_seed_regime(r.point)]
    inside = sum(r.within for r in seed)
    explained = sum(not r.within and r.point.miss is not None for r in seed)
    return (
        f"held out: {len(held)} points, {len(seed)} in the seed regime (decode and verification "
        f"of up to {SEED_BATCH} sequences x {VERIFY_TOKENS} tokens, prefill up to "
        f"{SEED_PREFILL:,} tokens): {inside} within {GOAL:.0%}, {len(seed) - inside} outside "
        f"({explained} with a recorded reason)"
    )


def misses(all_rows: list[Row]) -> list[Row]:
    """Points (fitted or held out) the model misses by more than the goal."""
    return [r for r in all_rows if r.point.excluded is None and not r.within]


@dataclass(frozen=True)
class FileCheck:
    """A format's bits against one published file's effective bits."""

    format: str
    file: PublishedFile
    bits: float  # what the cost model gives this model in the format (`model_bits`)
    effective: float  # bytes x 8 / the model's parameters

    @property
    def error(self) -> float:
        """The catalogue's bits over the file's, minus one."""
        return self.bits / self.effective - 1

    @property
    def within(self) -> bool:
        return abs(self.error) <= BITS_GOAL

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "model": self.file.model,
            "bytes": self.file.bytes,
            "bits": self.bits,
            "effective_bits": self.effective,
            "error": self.error,
            "within_goal": self.within,
            "source": self.file.source,
            "miss": self.file.miss,
        }


def model_bits(cat: Catalogue, ref: str) -> float:
    """Bits per parameter the cost model gives `<model>@<format>` in memory (its head at the
    format's head_bits), from the same ModelShape the pacing uses."""
    shape = cat.model(ref, "bench hardware")
    return 8 * shape.weight_bytes / shape.params


def file_checks(cat: Catalogue) -> list[FileCheck]:
    """Every published file of every format against the format's bits."""
    return [
        FileCheck(name, f, model_bits(cat, f"{f.model}@{name}"), effective_bits(cat.spec, f))
        for name, fmt in cat.spec.formats.items()
        for f in fmt.files
    ]


def files_table(checks: list[FileCheck]) -> str:
    head = (
        f"{'format':<8} {'model':<16} {'file bytes':>14} {'model bits':>10} {'file bits':>9} "
        f"{'error':>7} {'<=5%':>4}  source"
    )
    lines = [head]
    for c in checks:
        lines.append(
            f"{c.format:<8} {c.file.model:<16} {c.file.bytes:>14,} {c.bits:>10.3f} "
            f"{c.effective:>9.3f} {c.error:>+7.1%} {'yes' if c.within else 'NO':>4}  "
            f"{c.file.source}"
        )
        if c.file.miss:
            lines.append(f"      reason: {c.file.miss}")
    return "\n".join(lines)


def number(value: float, digits: int = 4) -> str:
    """value to `digits` significant digits, never in exponent form (YAML 1.1 would read
    `1e-05` as text)."""
    if abs(value) < 1e-9:
        return "0"
    text = f"{value:.{digits}g}"
    if "e" in text:
        text = f"{float(text):.12f}".rstrip("0").rstrip(".")
    return text


def fit_line(values: dict[str, float]) -> str:
    """The entry's `fit:` line (one line, the catalogue's layout)."""
    parts = ", ".join(f"{f}: {number(values[f])}" for f in FIT_FIELDS if f in values)
    return f"fit: {{{parts}}}"


# ---- this VM, measured live ----


@dataclass
class Live:
    """This CPU's measured figures and the tiny pair's forwards on it."""

    bandwidth_gbs: float  # over the tiny models' working set
    memory_gbs: float  # over an array far larger than the caches
    peak_tflops: float
    points: dict[str, list[CalibrationPoint]]
    day: str = field(default_factory=lambda: date.today().isoformat())

    @property
    def source(self) -> str:
        return (
            f"measured {self.day} by testbed bench hardware, one thread, best of 15 runs: "
            f"numpy sum of an 8 MiB float32 array {self.bandwidth_gbs:.1f} GB/s (the tiny "
            f"models' working set stays in cache; 256 MiB: {self.memory_gbs:.1f} GB/s), "
            f"torch float32 1024 x 1024 matmul {self.peak_tflops * 1e3:.0f} GFLOP/s"
        )


def _times(fn: Callable[[], Any], repeats: int) -> list[float]:
    fn()  # warm-up: first-call allocation and thread start
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _median_s(fn: Callable[[], Any], repeats: int) -> float:
    return statistics.median(_times(fn, repeats))


def read_rate(mib: int) -> float:
    """GB/s of one thread summing a float32 array of `mib` MiB (the best of 15 runs)."""
    data = np.ones(mib * 2**18, dtype=np.float32)
    return data.nbytes / min(_times(data.sum, 15)) / 1e9


def measure_cpu() -> tuple[float, float, float]:
    """One thread's read rate over 8 MiB (the tiny models' working set, cache-resident) and
    over 256 MiB (memory), and its float32 matmul rate (TFLOP/s): best of several runs."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(1024, 1024)
        peak = 2 * 1024**3 / min(_times(lambda: a @ a, 15)) / 1e12
    finally:
        torch.set_num_threads(threads)
    return read_rate(8), read_rate(256), peak


def _point(model: str, batch: int, new: int, context: int, seconds: float) -> CalibrationPoint:
    return CalibrationPoint(
        model=model,
        batch=batch,
        new=new,
        context=context,
        ms=float(f"{seconds * 1e3:.4g}"),
        source="this-cpu-bench",
    )


def single_steps(engine: Any, ref: str, ids: list[int]) -> list[CalibrationPoint]:
    """One session's forwards: prefills of the first 8 and of all of `ids`, then one decoded
    token after them (median seconds)."""
    from testbed.bench.verify import timed_forward

    sid = engine.open()
    points = [
        _point(ref, 1, n, 0, _median_s(lambda n=n: timed_forward(engine, {sid: ids[:n]}), 30))
        for n in (8, len(ids))
    ]
    engine.score(sid, ids)
    decode = _median_s(lambda: timed_forward(engine, {sid: [5]}), 200)
    engine.close(sid)
    return [*points, _point(ref, 1, 1, len(ids), decode)]


def measure_live(progress: Progress, batches: Iterable[int] = (1, 2, 4, 8, 16)) -> Live:
    """This CPU's figures; the tiny target under PyTorch: verification steps (b sessions x 5
    tokens), prefills and a decode step; the tiny pair under llama.cpp: prefills and decode."""
    from agents.engines.factory import load_engine
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.bench.verify import time_batches
    from testbed.models.tiny import ensure_tiny_pair

    progress("this CPU: bandwidth and FLOP/s")
    bandwidth, memory, peak = measure_cpu()
    progress("this CPU: the tiny pair")
    pair = ensure_tiny_pair()
    target = load_engine(pair.target_hf, kind="torch", threads=1)
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(16, seed=3)]
    torch_points = []
    for b in batches:
        progress(f"this CPU: tiny target, PyTorch, {b} x 5 tokens")
        pt = time_batches(target, prompts, [b], 4, repeats=30)[0]
        context = round(statistics.mean(len(p) for p in prompts[:b]))
        torch_points.append(_point("tiny-target@f32", b, 5, context, pt.batch_ms / 1e3))
    progress("this CPU: tiny target, PyTorch, prefill and decode")
    torch_points += single_steps(target, "tiny-target@f32", prompts[0])
    llama_points = []
    for role, path in (("draft", pair.draft_gguf), ("target", pair.target_gguf)):
        progress(f"this CPU: tiny {role}, llama.cpp")
        engine = load_engine(path, kind="llama", threads=1)
        llama_points += single_steps(engine, f"tiny-{role}@f32", prompts[0])
    points = {"this-cpu": torch_points, "this-cpu-llamacpp": llama_points}
    return Live(bandwidth, memory, peak, points)


def with_live(cat: Catalogue, live: Live) -> Catalogue:
    """cat with this CPU's entries carrying the live figures (for predictions and fits)."""
    spec = cat.spec.model_copy(deep=True)
    for name in LIVE:
        if name in spec.hardware:
            entry = spec.hardware[name]
            entry.bandwidth_gbs = live.bandwidth_gbs
            entry.peak_tflops = live.peak_tflops
            entry.calibration = live.points[name]
    return Catalogue(cat.path, spec)


# ---- the catalogue, rewritten in place ----


def _entry_span(lines: list[str], name: str) -> tuple[int, int]:
    """The line range of `hardware.<name>` in the catalogue's text."""
    top = lines.index("hardware:")
    start = next(i for i in range(top, len(lines)) if lines[i] == f"  {name}:")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^( {2})?\S", lines[i])),
        len(lines),
    )
    return start, end


def _set_line(lines: list[str], span: tuple[int, int], key: str, text: str) -> None:
    for i in range(*span):
        if lines[i].startswith(f"    {key}:"):
            lines[i] = f"    {text}"
            return
    raise ValueError(f"no one-line '{key}:' in the entry")


def rewrite(text: str, fits: dict[str, dict[str, float]], live: Live | None) -> str:
    """The catalogue's text with new `fit:` lines (and this CPU's measured entries)."""
    lines = text.splitlines()
    for name, values in fits.items():
        _set_line(lines, _entry_span(lines, name), "fit", fit_line(values))
    for name in LIVE if live else ():
        span = _entry_span(lines, name)
        _set_line(lines, span, "bandwidth_gbs", f"bandwidth_gbs: {number(live.bandwidth_gbs, 3)}")
        _set_line(lines, span, "peak_tflops", f"peak_tflops: {number(live.peak_tflops, 3)}")
        _set_line(lines, span, "source", f"source: {json.dumps(live.source)}")
        start, end = _entry_span(lines, name)
        at = next(i for i in range(start, end) if lines[i].startswith("    calibration:"))
        while end > at + 1 and not lines[end - 1].strip():
            end -= 1  # keep the blank lines between entries
        items = [
            f"      - {{model: {p.model}, batch: {p.batch}, new: {p.new}, context: {p.context}, "
            f"ms: {number(p.measured_ms)}, source: {p.source}}}"
            for p in live.points[name]
        ]
        lines[at:end] = ["    calibration:", *items]
    return "\n".join(lines) + "\n"


def write_catalogue(cat: Catalogue, fits: dict[str, dict[str, float]], live: Live | None) -> None:
    """Rewrite the catalogue file (validated before it replaces the old one)."""
    from testbed.core.files import atomic_replace
    from testbed.core.loading import parse_yaml, validate

    text = rewrite(cat.path.read_text(), fits, live)
    validate(CatalogueFile, parse_yaml(text, cat.source), cat.source)
    with atomic_replace(cat.path) as tmp:
        tmp.write_text(text)


# ---- output ----

HEADER = (
    f"{'hardware':<22} {'model@format':<24} {'b x new @ ctx':>16} {'published':>10} "
    f"{'predicted':>10} {'error':>7} {'<=15%':>5} {'roofline':>9}  source"
)


def format_row(r: Row) -> str:
    p = r.point
    shape = f"{p.batch} x {p.new} @ {p.context}"
    ok = "excl" if p.excluded else ("yes" if r.within else "NO")
    if p.held_out:
        ok = "h/" + ok
    return (
        f"{r.hardware:<22} {p.model:<24} {shape:>16} {r.measured_ms:>10.4g} "
        f"{r.predicted_ms:>10.4g} {r.error:>+7.1%} {ok:>5} {r.roofline_ms:>9.4g}  {p.source}"
    )


def table(all_rows: list[Row]) -> str:
    """The printed table: one line per point, times in ms."""
    return "\n".join([HEADER, *(format_row(r) for r in all_rows)])


def summary(all_rows: list[Row]) -> str:
    used = [r for r in all_rows if fits(r.point)]
    if not used:
        return "no calibration points"
    inside = sum(r.within for r in used)
    worst = max(used, key=lambda r: abs(r.error))
    return (
        f"{inside} of {len(used)} calibration points within {GOAL:.0%} (worst: {worst.error:+.1%}, "
        f"{worst.hardware} {worst.point.model}), in sample; "
        f"{sum(r.point.held_out for r in all_rows)} held-out points (h/, judged only), "
        f"{sum(r.point.excluded is not None for r in all_rows)} excluded points shown"
    )


def run(
    path: Path,
    echo: Callable[[str], None],
    progress: Progress,
    refit: bool = False,
    write: bool = False,
    live: bool = True,
    json_out: Path | None = None,
    loo: bool = True,
) -> dict[str, Any]:
    """The bench (module docstring); returns the figures it prints."""
    cat = load_catalogue(path)
    stored = rows(cat)
    echo(f"catalogue {cat.source}: every calibration point (times in ms)\n")
    echo(table(stored))
    echo("\n" + summary(stored))
    figures: dict[str, Any] = {"catalogue": cat.source, "rows": [r.as_dict() for r in stored]}
    if loo:
        judged = judge(cat, stored, progress)
        echo(
            "\nper entry: fitted points, fitted values, max |error| in sample (stored fit), "
            "left out one at a time (refitted without the point), held out (never fitted)\n"
        )
        echo(judged_table(judged))
        figures["judged"] = [j.as_dict() for j in judged]
    missed = misses(stored)
    echo(f"\n{len(missed)} points outside {GOAL:.0%}, with the catalogue's reason:")
    for r in missed:
        seed = " [seed regime]" if in_seed_regime(r.point) else ""
        echo(f"  {format_row(r)}{seed}\n      reason: {r.point.miss or '(none recorded)'}")
    echo("\n" + held_out_summary(stored))
    checks = file_checks(cat)
    if checks:
        echo(
            "\nweight formats: the catalogue's bits per weight (the cost model's) against "
            f"published files' bytes x 8 / parameters (goal: within {BITS_GOAL:.0%})\n"
        )
        echo(files_table(checks))
        figures["files"] = [c.as_dict() for c in checks]
    measured = measure_live(progress) if live else None
    if measured:
        live_rows = [row(cat, name, p) for name in LIVE for p in measured.points[name]]
        echo(
            f"\nthis CPU, live: {measured.bandwidth_gbs:.1f} GB/s in cache, "
            f"{measured.memory_gbs:.1f} GB/s from memory, "
            f"{measured.peak_tflops * 1e3:.0f} GFLOP/s (one thread); predicted with the "
            "stored fit\n"
        )
        echo(table(live_rows))
        figures["live"] = {
            "bandwidth_gbs": measured.bandwidth_gbs,
            "memory_gbs": measured.memory_gbs,
            "peak_tflops": measured.peak_tflops,
            "rows": [r.as_dict() for r in live_rows],
        }
    if refit:
        figures["fits"] = refit_all(cat, measured, echo, progress, write)
    if json_out:
        json_out.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def _own_values(cat: Catalogue, name: str, values: dict[str, float]) -> dict[str, float]:
    """values, less those an entry with `fit_from` neither sets nor fits (it borrows them)."""
    entry = cat.spec.hardware[name]
    if entry.fit_from is None:
        return values
    keep = set(entry.fit.model_dump(exclude_none=True)) | set(entry.fitted)
    return {k: v for k, v in values.items() if k in keep}


def refit_all(
    cat: Catalogue, live: Live | None, echo: Callable[[str], None], progress: Progress, write: bool
) -> dict[str, Any]:
    """Refit every entry that has `fitted` values; print the values and a YAML snippet."""
    source = with_live(cat, live) if live else cat
    fits: dict[str, Fit] = {}
    for name, entry in source.spec.hardware.items():
        if entry.fitted:
            progress(f"fitting {name}")
            fits[name] = fit_entry(source, name, entry.calibration)
    # an entry that borrows (`fit_from`) keeps only the values it sets or fits itself
    own = {n: _own_values(cat, n, f.values) for n, f in fits.items()}
    echo("\nrefitted (least squares on relative error), as YAML for hardware.<name>.fit:\n")
    for f in fits.values():
        echo(f"  {f.hardware}:  # worst error over {len(f.errors)} points: {f.worst:.1%}")
        echo(f"    {fit_line(own[f.hardware])}")
    if write:
        write_catalogue(cat, own, live)
        echo(f"\nwrote {cat.source}")
    return {n: {"values": f.values, "worst_error": f.worst} for n, f in fits.items()}
