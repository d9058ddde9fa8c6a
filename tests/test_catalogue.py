"""The hardware-and-model catalogue (topologies/hardware.yaml), its fit and its bench."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from agents.emulation.stepcost import step_seconds
from testbed.bench.hardware import GOAL, Live, fit_entry, rewrite, rows, write_catalogue
from testbed.core.errors import BadInputError
from testbed.models.configs import DRAFT, TARGET
from testbed.topo.catalogue import (
    DEFAULT_PATH,
    CalibrationPoint,
    Catalogue,
    llama_params,
    load_catalogue,
)

CAT = load_catalogue()
SRC = "experiments/x.yaml: lab.server"


def copy(tmp_path: Path, old: str = "", new: str = "") -> Path:
    """The shipped catalogue in tmp_path, with `old` replaced by `new` once."""
    text = DEFAULT_PATH.read_text()
    assert old in text
    path = tmp_path / "hardware.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def bad(path: Path) -> str:
    with pytest.raises(BadInputError) as err:
        load_catalogue(path)
    assert str(path) in str(err.value)
    return str(err.value)


# ---- the shipped data ----


def test_every_entry_and_model_resolves() -> None:
    for name in CAT.spec.hardware:
        assert CAT.hardware(name, SRC).name == name
    for name in CAT.spec.models:
        for fmt in CAT.spec.formats:
            assert CAT.model(f"{name}@{fmt}", SRC).weight_bytes > 0


def test_every_calibration_point_is_within_the_goal() -> None:
    fitted = [r for r in rows(CAT) if r.point.excluded is None and not r.point.held_out]
    assert len(fitted) >= 40
    outside = [(r.hardware, r.point.model, f"{r.error:+.1%}") for r in fitted if not r.within]
    assert outside == []
    assert {r.hardware for r in fitted} >= {
        "pi5", "jetson-orin-nano", "jetson-orin-nano-super", "a100-80gb-x4", "h200", "this-cpu",
    }  # fmt: skip


def test_every_held_out_miss_says_why() -> None:
    from testbed.bench.hardware import in_seed_regime

    held = [r for r in rows(CAT) if r.point.held_out and r.point.excluded is None]
    assert len(held) >= 30 and {r.point.source for r in held} >= {"splitwise", "llama-cpp-pr5625"}
    assert all(len(r.point.miss or "") > 40 for r in held if not r.within)
    # the Splitwise decodes the fit never saw are within the goal on both servers
    decodes = [r for r in held if r.point.source == "splitwise" and r.point.new == 1]
    assert len(decodes) == 20 and all(r.within for r in decodes)
    assert any(in_seed_regime(r.point) and r.point.new > 1 and r.point.batch == 1 for r in held)


def test_the_goal_check_can_fail() -> None:
    spec = CAT.spec.model_copy(deep=True)
    fit = spec.hardware["a100-80gb-x4"].fit
    fit.step_overhead_ms = fit.layer_overhead_us = 0.0  # a plain-roofline-like server
    worse = [r for r in rows(Catalogue(CAT.path, spec)) if r.hardware == "a100-80gb-x4"]
    assert sum(not r.within for r in worse) >= 5


def test_plain_roofline_misses_the_70b_by_far() -> None:
    r = next(r for r in rows(CAT) if r.hardware == "a100-80gb-x4")
    assert r.measured_ms / r.roofline_ms > 2.3 and abs(r.error) <= GOAL


def test_model_counts_match_their_shapes() -> None:
    for name, m in CAT.spec.models.items():
        if not m.idle_params:
            assert m.params == llama_params(m), name
    for name, spec, params in (("tiny-draft", DRAFT, 321_696), ("tiny-target", TARGET, 1_290_112)):
        m = CAT.spec.models[name]
        shape = (m.layers, m.hidden, m.ffn, m.heads, m.kv_heads)
        assert shape == (spec.layers, spec.hidden, spec.ffn, spec.heads, spec.kv_heads)
        assert m.params == params  # the tiny pair's manifest


def test_fit_from_borrows_the_fit_with_its_own_figures() -> None:
    one, small = CAT.hardware("a100-80gb", SRC), CAT.hardware("a100-40gb", SRC)
    assert small.devices == 1 and small.bandwidth_gbs == 1555
    assert small.layer_overhead_us == one.layer_overhead_us > 0
    l4 = CAT.hardware("l4", SRC)
    assert (l4.bandwidth_gbs, l4.step_overhead_ms) == (300, one.step_overhead_ms)
    # an entry may fit some values itself and borrow the rest
    x4, x2 = CAT.hardware("a100-80gb-x4", SRC), CAT.hardware("a100-80gb-x2", SRC)
    assert x2.devices == 2 and x2.step_overhead_ms == x4.step_overhead_ms
    assert 0 < x2.layer_overhead_us < x4.layer_overhead_us  # two-way all-reduces are cheaper
    assert CAT.fit_values("a100-80gb-x2", SRC)["seq_overhead_us"] == x4.seq_overhead_us


def test_single_gpu_entries_have_their_own_fit_per_layer_and_per_forward() -> None:
    for name in ("a100-80gb", "a100-80gb-x4"):
        entry = CAT.spec.hardware[name]
        assert entry.fit_from is None and entry.calibration and entry.priors
        assert "layer_overhead_us" in entry.fitted, name
        hw = CAT.hardware(name, SRC)
        assert hw.layer_overhead_us > 0 and hw.step_overhead_ms > 0, name
    assert "step_overhead_ms" in CAT.spec.hardware["a100-80gb"].fitted
    # most of a 32-layer model's fixed cost is per layer, not per forward
    one = CAT.hardware("a100-80gb", SRC)
    assert one.step_overhead_ms * 1e3 < 32 * one.layer_overhead_us


# ---- what a caller gets wrong ----


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: CAT.hardware("pi6", SRC), "unknown hardware 'pi6' (known: pi5, "),
        (lambda: CAT.model("llama-9b@q4_0", SRC), "unknown model 'llama-9b'"),
        (lambda: CAT.model("llama-3.2-1b", SRC), "expected '<model>@<format>'"),
        (lambda: CAT.model("llama-3.2-1b@q3_k", SRC), "unknown format 'q3_k' (known: q4_0"),
    ],
)
def test_unknown_names_are_refused_naming_the_source(call, expected: str) -> None:
    with pytest.raises(BadInputError) as err:
        call()
    assert str(err.value).startswith(f"{SRC}: ") and expected in str(err.value)


def test_a_negative_bandwidth_names_the_file_and_key(tmp_path: Path) -> None:
    message = bad(copy(tmp_path, "bandwidth_gbs: 17.1", "bandwidth_gbs: -17.1"))
    assert "hardware.pi5.bandwidth_gbs" in message and "greater than 0" in message


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("    memory_gb: 8\n", "    memory_gb: 8\n    colour: red\n", "hardware.pi5.colour"),
        ("source: tunney-matmul}", "source: nowhere}", "hardware.pi5.calibration.0.source"),
        ("tinyllama-1.1b@q8_0, batch: 1", "tinyllama@q8_0, batch: 1", "calibration.0.model"),
        ("fit_from: a100-80gb-x4", "fit_from: a100", "hardware.a100-80gb-x2.fit_from"),
        ("tok_s: 4.61,", "tok_s: 4.61, ms: 200,", "give exactly one of ms and tok_s"),
    ],
)
def test_bad_entries_name_the_file_and_key(tmp_path: Path, old: str, new: str, key: str) -> None:
    assert key in bad(copy(tmp_path, old, new))


def test_a_file_that_is_not_a_mapping_or_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hardware.yaml"
    path.write_text("- pi5\n- a100\n")
    assert "expected a mapping" in bad(path)
    path.write_bytes(os.urandom(4096) + b"\xff\xfe")
    bad(path)
    assert "no such file" in bad(tmp_path / "missing.yaml")


def test_a_model_that_does_not_fit_is_refused_naming_the_sizes() -> None:
    with pytest.raises(BadInputError) as err:
        CAT.check_fits("a100-80gb", ["llama-3.1-70b@f16"], SRC)
    message = str(err.value)
    assert message.startswith(SRC) and "llama-3.1-70b@f16" in message
    assert "need 141.1 GB" in message and "80.0 GB of a100-80gb" in message
    CAT.check_fits("a100-80gb-x4", ["llama-3.1-70b@f16"], SRC)
    CAT.check_fits("pi5", ["llama-3.2-1b@q4_0", "tinyllama-1.1b@q8_0"], SRC)
    with pytest.raises(BadInputError, match="KV cache for 1,000,000 tokens"):
        CAT.check_fits("a100-80gb-x4", ["llama-3.1-70b@f16"], SRC, kv_tokens=1_000_000)


def test_loading_is_cached_until_the_file_changes(tmp_path: Path) -> None:
    assert load_catalogue() is load_catalogue(DEFAULT_PATH)
    path = copy(tmp_path)
    first = load_catalogue(path)
    assert load_catalogue(path) is first
    path.write_text(path.read_text().replace("bandwidth_gbs: 17.1", "bandwidth_gbs: 18"))
    os.utime(path, ns=(1, first.path.stat().st_mtime_ns + 1_000_000))
    assert load_catalogue(path).hardware("pi5", SRC).bandwidth_gbs == 18


# ---- the fit and the bench ----


def test_the_fit_recovers_known_values() -> None:
    truth = CAT.hardware("pi5", SRC)
    points = [
        CalibrationPoint(model=ref, batch=1, new=new, context=ctx, source="tunney-matmul", ms=1)
        for ref, new, ctx in [
            ("tinyllama-1.1b@q8_0", 1, 128),
            ("llama-3.1-8b@q4_k_m", 1, 256),
            ("llama-3.2-3b@q8_0", 64, 0),
            ("llama-3.2-1b@f16", 1, 512),
        ]
    ]
    points = [
        p.model_copy(update={"ms": step_seconds(truth, CAT.model(p.model, SRC), p.shape) * 1e3})
        for p in points
    ]
    spec = CAT.spec.model_copy(deep=True)
    spec.hardware["pi5"].fit = spec.hardware["pi5"].fit.model_copy(
        update={"bw_efficiency": 0.3, "flops_efficiency": 0.9}  # the fitted ones; priors kept
    )
    fit = fit_entry(Catalogue(CAT.path, spec), "pi5", points)
    assert fit.worst < 1e-4
    assert fit.values["bw_efficiency"] == pytest.approx(truth.bw_efficiency, rel=1e-3)
    assert fit.values["flops_efficiency"] == pytest.approx(truth.flops_efficiency, rel=1e-3)


def _pi5_with(points: list[CalibrationPoint], moved: bool = True) -> Catalogue:
    """The shipped catalogue with pi5's points replaced (its fitted values moved off the truth
    unless `moved` is false, so a fit must find them)."""
    spec = CAT.spec.model_copy(deep=True)
    spec.hardware["pi5"].calibration = points
    if moved:
        spec.hardware["pi5"].fit = spec.hardware["pi5"].fit.model_copy(
            update={"bw_efficiency": 0.3, "flops_efficiency": 0.9}
        )
    return Catalogue(CAT.path, spec)


def _exact_pi5_points(scale: dict[int, float] | None = None) -> list[CalibrationPoint]:
    """Points priced by the stored pi5 model, the i-th one's time times scale[i]."""
    truth = CAT.hardware("pi5", SRC)
    shapes = [
        ("tinyllama-1.1b@q8_0", 1, 128),
        ("llama-3.1-8b@q4_k_m", 1, 256),
        ("llama-3.2-3b@q8_0", 64, 0),
        ("llama-3.2-1b@f16", 1, 512),
        ("llama-3.2-1b@q8_0", 32, 0),
    ]
    out = []
    for i, (ref, new, ctx) in enumerate(shapes):
        p = CalibrationPoint(model=ref, batch=1, new=new, context=ctx, source="tunney-matmul", ms=1)
        ms = step_seconds(truth, CAT.model(ref, SRC), p.shape) * 1e3 * (scale or {}).get(i, 1)
        out.append(p.model_copy(update={"ms": ms}))
    return out


def test_leave_one_out_refits_without_the_point() -> None:
    from testbed.bench.hardware import leave_one_out

    # point 4 measured twice as slow as the model: without it the rest fit exactly, so its
    # left-out prediction is the true time, half the measured one; kept in, the fit would
    # move toward it and the error would shrink
    cat = _pi5_with(_exact_pi5_points({4: 2.0}))
    in_sample = fit_entry(cat, "pi5", cat.spec.hardware["pi5"].calibration).errors[4]
    loo = leave_one_out(cat, "pi5")
    assert len(loo) == 5
    assert loo[4] == pytest.approx(-0.5, abs=1e-3)
    assert abs(in_sample) < 0.45


def test_held_out_points_are_never_fitted() -> None:
    from testbed.bench.hardware import judge

    points = _exact_pi5_points({4: 3.0})
    points[4] = points[4].model_copy(update={"held_out": True})
    cat = _pi5_with(points)
    fit = fit_entry(cat, "pi5", points)
    assert len(fit.errors) == 4 and fit.worst < 1e-4
    truth = CAT.hardware("pi5", SRC)
    assert fit.values["bw_efficiency"] == pytest.approx(truth.bw_efficiency, rel=1e-3)
    stored = _pi5_with(points, moved=False)  # judged with the stored (true) values
    (judged,) = [j for j in judge(stored, rows(stored), lambda _: None) if j.hardware == "pi5"]
    assert judged.points == 4 and judged.fitted == 2
    assert judged.held_out == [pytest.approx(1 / 3 - 1, abs=1e-3)]
    assert len(judged.loo) == 4


def test_a_held_out_field_of_the_wrong_type_names_the_file_and_key(tmp_path: Path) -> None:
    old = "tok_s: 9, source: tunney-matmul}"
    message = bad(copy(tmp_path, old, "tok_s: 9, source: tunney-matmul, held_out: maybe}"))
    assert "hardware.pi5.calibration.0.held_out" in message


def test_published_files_check_the_formats_bits() -> None:
    from testbed.bench.hardware import file_checks, files_table

    checks = {(c.format, c.file.model): c for c in file_checks(CAT)}
    one = checks[("q4_0", "llama-3.2-1b")]
    assert one.effective == pytest.approx(773e6 * 8 / 1_235_814_400)
    # the tied 128256 x 2048 embedding at Q6_K, the rest at Q4_0: about 4.94 bits a weight
    head = 128256 * 2048
    expected = (4.5 * (1_235_814_400 - head) + 6.5625 * head) / 1_235_814_400
    assert one.bits == pytest.approx(expected) and one.within
    assert all(c.within or c.file.miss for c in checks.values())
    assert abs(checks[("q8_0", "llama-3.1-8b")].error) < 0.01
    assert "5.004" in files_table(list(checks.values()))


def test_a_formats_head_bits_price_the_output_head_in_memory_and_in_every_forward() -> None:
    """Q4_0 keeps the output head at Q6_K: without head_bits the 1B draft streams 10 % fewer
    bytes a token than its published file holds."""
    with_head = CAT.model("llama-3.2-1b@q4_0", "test")
    without = replace(with_head, head_bytes_per_param=None)
    head = 128256 * 2048
    extra = head * (6.5625 - 4.5) / 8
    assert with_head.weight_bytes == pytest.approx(without.weight_bytes + extra)
    assert with_head.streamed_bytes == pytest.approx(without.streamed_bytes + extra)
    assert with_head.weight_bytes == pytest.approx(763e6, rel=0.005)  # the file less metadata
    pi5 = CAT.hardware("pi5", "test")
    slower = step_seconds(pi5, with_head, [(1, 128)]) / step_seconds(pi5, without, [(1, 128)])
    assert 1.05 < slower < 1.12  # a bandwidth-bound decode, about the bytes' ratio


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("bytes: 773000000", "bytes: -773000000", "formats.q4_0.files.0.bytes"),
        (
            "- model: llama-3.2-1b\n        bytes",
            "- model: llama-9b\n        bytes",
            "formats.q4_0.files.0.model",
        ),
        (
            "source: bartowski-gguf\n        miss",
            "source: nowhere\n        miss",
            "formats.q4_0.files.0.source",
        ),
        ("bytes: 773000000", "bytes: 773000000\n        size: 1", "formats.q4_0.files.0.size"),
    ],
)
def test_a_bad_published_file_names_the_file_and_key(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    assert key in bad(copy(tmp_path, old, new))


def test_rewrite_replaces_fit_lines_and_this_cpus_measurements(tmp_path: Path) -> None:
    path = copy(tmp_path)
    cat = load_catalogue(path)
    values = {**cat.fit_values("pi5", SRC), "bw_efficiency": 0.123456, "step_overhead_ms": 2e-7}
    point = CalibrationPoint(
        model="tiny-target@f32", batch=3, new=5, context=30, ms=4.5, source="this-cpu-bench"
    )
    live = Live(30.0, 15.0, 0.2, {"this-cpu": [point], "this-cpu-llamacpp": [point]})
    text = rewrite(path.read_text(), {"pi5": values}, None)
    assert "step_overhead_ms: 0.0000002," in text and "e-07" not in text  # YAML reads 2e-07 as text
    write_catalogue(cat, {"pi5": values}, live)
    new = load_catalogue(path)
    assert new.hardware("pi5", SRC).bw_efficiency == 0.1235
    assert new.spec.hardware["this-cpu"].calibration == [point]
    assert new.hardware("this-cpu-llamacpp", SRC).bandwidth_gbs == 30
    assert new.spec.hardware["this-cpu"].source == live.source
    assert new.spec.hardware["h200"] == cat.spec.hardware["h200"]


def test_bench_hardware_prints_every_point_and_writes_json(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from testbed.cli import app

    out = tmp_path / "figures.json"
    result = CliRunner().invoke(app, ["bench", "hardware", "--no-live", "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert len(figures["rows"]) == sum(len(h.calibration) for h in CAT.spec.hardware.values())
    assert "a100-80gb-x4" in result.output and "calibration points within 15%" in result.output
    refused = CliRunner().invoke(app, ["bench", "hardware", "--no-live", "--write"])
    assert refused.exit_code == 2
    broken = copy(tmp_path, "bandwidth_gbs: 17.1", "bandwidth_gbs: -1")
    result = CliRunner().invoke(app, ["bench", "hardware", "--no-live", "--catalogue", str(broken)])
    assert result.exit_code == 2 and "hardware.pi5.bandwidth_gbs" in result.output


def test_refit_and_write_keeps_a_borrowing_entry_borrowing(tmp_path: Path) -> None:
    from testbed.bench.hardware import refit_all

    cat = load_catalogue(copy(tmp_path))
    refit_all(cat, None, lambda _: None, lambda _: None, write=True)
    new = load_catalogue(cat.path)
    x2 = new.spec.hardware["a100-80gb-x2"]
    assert x2.fit_from == "a100-80gb-x4"
    assert set(x2.fit.model_dump(exclude_none=True)) == set(x2.fitted)
    for name, entry in new.spec.hardware.items():
        if entry.fitted:
            assert all(
                abs(r.error) <= GOAL
                for r in rows(new)
                if r.hardware == name and not r.point.excluded and not r.point.held_out
            ), name


def test_excluded_points_say_why_and_stay_out_of_the_fit() -> None:
    excluded = [p for h in CAT.spec.hardware.values() for p in h.calibration if p.excluded]
    assert excluded and all(len(p.excluded or "") > 20 for p in excluded)
    h200 = CAT.spec.hardware["h200"]
    fit = fit_entry(CAT, "h200", h200.calibration)
    assert len(fit.errors) == sum(p.excluded is None for p in h200.calibration)
    assert replace(CAT.hardware("h200", SRC), **fit.values).step_overhead_ms > 10


def test_orin_nano_decodes_1b_class_q4_models_at_30_to_70_tok_s() -> None:
    hw = CAT.hardware("jetson-orin-nano", SRC)
    for ref in ("llama-3.2-1b@q4_0", "tinyllama-1.1b@q4_0"):
        rate = 1 / step_seconds(hw, CAT.model(ref, SRC), [(1, 256)])
        assert 30 <= rate <= 70, ref


class CountingEngine:
    """The few Engine calls the live bench makes, recording the forwards' shapes."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.forwards: list[tuple[int, int]] = []

    def open(self) -> int:
        self.tokens[len(self.tokens)] = []
        return len(self.tokens) - 1

    def length(self, sid: int) -> int:
        return len(self.tokens[sid])

    def score(self, sid: int, toks: list[int]) -> None:
        self.forwards.append((len(toks), len(self.tokens[sid])))
        self.tokens[sid] += toks

    def score_batch(self, requests: dict[int, list[int]]) -> None:
        for sid, toks in requests.items():
            self.score(sid, toks)

    def rollback(self, sid: int, n: int) -> None:
        del self.tokens[sid][n:]

    def close(self, sid: int) -> None:
        del self.tokens[sid]


def test_live_steps_time_two_prefills_and_a_decode() -> None:
    from testbed.bench.hardware import measure_cpu, single_steps

    engine = CountingEngine()
    points = single_steps(engine, "tiny-draft@f32", list(range(20)))
    assert [(p.batch, p.new, p.context) for p in points] == [(1, 8, 0), (1, 20, 0), (1, 1, 20)]
    assert set(engine.forwards) == {(8, 0), (20, 0), (1, 20)} and not engine.tokens
    assert all(p.ms and p.ms > 0 and p.source == "this-cpu-bench" for p in points)
    cache, memory, peak = measure_cpu()
    assert cache > 0 and memory > 0 and peak > 0
