"""Compute emulation on a host: the dilated clock, paced engines and the controller's emulation
file (agents.emulation), checked on the real tiny pair."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from agents.emulation import clock
from agents.emulation.clock import Clock
from agents.emulation.pacing import PacedEngine, pacing_rows
from agents.emulation.settings import EmulationError, load_emulation, parse_emulation
from agents.emulation.stepcost import Hardware, ModelShape, step_seconds
from agents.engines.factory import load_engine

SLOW = Hardware("slow-box", memory_gb=8, bandwidth_gbs=1e6, peak_tflops=1e6, step_overhead_ms=30)
FAST = Hardware("fast-box", memory_gb=8, bandwidth_gbs=1e9, peak_tflops=1e9)
SHAPE = ModelShape("one-b", 1e9, 16, 2048, 32, 8, 64, 128256, 0.5625, tied_embeddings=True)


@pytest.fixture
def target(tiny_pair):
    return load_engine(tiny_pair.target_hf, kind="torch")


@pytest.fixture
def draft(tiny_pair):
    return load_engine(tiny_pair.draft_gguf, kind="llama")


@pytest.fixture(autouse=True)
def real_clock():
    clock.configure(1.0)
    yield
    clock.configure(1.0)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def test_a_paced_forward_returns_the_same_logits_no_sooner_than_its_modelled_time(target):
    paced = PacedEngine(target, SLOW, SHAPE)
    prompt = target.tokenize("Q: 2 + 3 = ?")
    plain_sid, paced_sid = target.open(), paced.open()
    want = target.score(plain_sid, prompt)
    got, took = timed(paced.score, paced_sid, prompt)
    assert np.array_equal(got, want)
    modelled = step_seconds(SLOW, SHAPE, [(len(prompt), 0)])
    assert modelled >= 0.030
    assert took >= modelled
    assert paced.stats.forwards == 1 and paced.stats.behind == 0
    assert paced.last is not None and paced.last.modelled_s == pytest.approx(modelled)


def test_dilation_stretches_the_sleep_and_reports_emulated_time(target):
    clock.configure(3.0)
    paced = PacedEngine(target, SLOW, SHAPE)
    sid = paced.open()
    _, took = timed(paced.score, sid, target.tokenize("Q: 1 + 1 = ?"))
    modelled = paced.last.modelled_s
    assert took >= 3 * modelled
    assert paced.last.took_s == pytest.approx(took / 3, rel=0.05)


def test_a_forward_slower_than_its_hardware_is_behind_and_not_slept(target):
    paced = PacedEngine(target, FAST, SHAPE)
    sid = paced.open()
    paced.score(sid, target.tokenize("Q: 4 + 4 = ?"))
    assert paced.stats.behind == 1
    assert paced.last.behind and paced.last.computed_s > paced.last.modelled_s
    (row,) = pacing_rows({"target": paced})
    assert row["behind"] == 1 and row["forwards"] == 1 and row["hardware"] == "fast-box"
    assert row["error_ms_p50"] is None  # no forward was on time


def test_predicting_only_never_sleeps(target):
    predicted = PacedEngine(target, SLOW, SHAPE, pace=False)
    sid = predicted.open()
    _, took = timed(predicted.score, sid, [target.bos_id])
    assert took < predicted.last.modelled_s
    assert pacing_rows({"target": predicted})[0]["paced"] is False


def test_batched_forwards_are_paced_as_one_step_over_every_sequence(target):
    paced = PacedEngine(target, SLOW, SHAPE)
    a, b = paced.open(), paced.open()
    paced.score(a, target.tokenize("Q: 5 + 5 = ?"))
    before = paced.length(a)
    paced.score_batch({a: [7], b: target.tokenize("Q: 1 + 2 = ?")})
    want = step_seconds(SLOW, SHAPE, [(1, before), (len(target.tokenize("Q: 1 + 2 = ?")), 0)])
    assert paced.last.modelled_s == pytest.approx(want)
    assert paced.last.sequences == 2


def test_greedy_drafting_is_paced_per_forward_and_drafts_the_same_tokens(draft):
    prompt = draft.tokenize("Q: 12 + 30 = ?")
    plain_sid = draft.open()
    want = draft.draft_greedy(plain_sid, prompt, 5, stop_at_eos=False)
    paced = PacedEngine(draft, SLOW, SHAPE)
    sid = paced.open()
    got, took = timed(paced.draft_greedy, sid, prompt, 5, False)
    assert got == want
    assert paced.stats.forwards == 5  # the prompt's forward, then 4 drafts fed back
    assert took >= paced.stats.modelled_s >= 5 * 0.030


def test_an_engine_without_a_fast_path_offers_none_when_paced(target):
    assert getattr(PacedEngine(target, SLOW, SHAPE), "draft_greedy", None) is None


def test_the_clock_maps_real_to_emulated_time_around_its_epoch():
    c = Clock(4.0, epoch=1000.0)
    assert c.wall(1008.0) == pytest.approx(1002.0)
    assert c.to_real(0.5) == 2.0 and c.to_emulated(2.0) == 0.5
    with pytest.raises(ValueError, match="positive"):
        Clock(0.0)


def test_the_emulation_file_round_trips_and_starts_the_clock(tmp_path: Path, target):
    doc = {
        "time_dilation": 2.0,
        "clock_epoch": 1.0,
        "pace": True,
        "hardware": SLOW.as_dict(),
        "models": {"target": SHAPE.as_dict()},
    }
    path = tmp_path / "emulation.json"
    path.write_text(json.dumps(doc))
    emu = load_emulation(path)
    assert emu.hardware == SLOW and emu.models["target"] == SHAPE
    assert emu.start().dilation == 2.0 and clock.current().epoch == 1.0
    assert isinstance(emu.engine(target, "target"), PacedEngine)
    assert emu.engine(target, "draft") is target  # no draft model named: unpaced


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "expected a JSON object"),
        ({"time_dilation": 0}, "time_dilation: expected a positive number"),
        ({"time_dilation": "x"}, "time_dilation: expected a positive number"),
        ({"pace": "yes"}, "pace: expected true or false"),
        ({"speed": 3}, "speed: unknown key"),
        ({"hardware": {"name": "x", "bandwidth_gbs": "fast"}}, "hardware.bandwidth_gbs"),
        ({"hardware": {"name": "x", "gpus": 2}}, "hardware.gpus: not a Hardware field"),
        ({"models": {"draft": {"name": "m", "layers": -1}}}, "models.draft.layers"),
        ({"models": [1]}, "models: expected a mapping"),
    ],
)
def test_a_bad_emulation_file_names_the_key(doc, message):
    with pytest.raises(EmulationError, match=message):
        parse_emulation(doc, "emu.json")


def test_an_unreadable_emulation_file_is_named(tmp_path: Path):
    path = tmp_path / "e.json"
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(EmulationError, match=r"e\.json: not a JSON document"):
        load_emulation(path)
    with pytest.raises(EmulationError, match="no such emulation file"):
        load_emulation(tmp_path / "missing.json")
