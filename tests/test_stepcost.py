"""The cost model (agents/emulation/stepcost.py): the shapes its formula must have."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.emulation.stepcost import (
    Hardware,
    ModelShape,
    decode_seconds,
    prefill_seconds,
    smooth_max,
    step_seconds,
    step_time,
)
from testbed.topo.catalogue import load_catalogue

CAT = load_catalogue()
BARE = Hardware(name="bare", memory_gb=80, bandwidth_gbs=1000, peak_tflops=100)


def model(ref: str) -> ModelShape:
    return CAT.model(ref, "test")


def hardware(name: str) -> Hardware:
    return CAT.hardware(name, "test")


def test_memory_bound_decode_scales_with_weight_bytes() -> None:
    q8, q4 = model("llama-3.1-8b@q8_0"), model("llama-3.1-8b@q4_0")
    # Q4_0 keeps the 128256 x 4096 output head at Q6_K (6.5625 bits): 8.5 / 4.5 on the rest
    head = 128256 * 4096
    matrices = q4.matmul_params - head
    bytes_ratio = (8.5 * q4.matmul_params) / (4.5 * matrices + 6.5625 * head)
    assert 1.7 < bytes_ratio < 8.5 / 4.5
    assert decode_seconds(BARE, q8, 1, 0) / decode_seconds(BARE, q4, 1, 0) == pytest.approx(
        bytes_ratio, rel=0.01
    )
    pi5 = hardware("pi5")  # its decoding is not purely memory-bound: only that part scales
    ratio = step_time(pi5, q8, [(1, 0)]).memory_s / step_time(pi5, q4, [(1, 0)]).memory_s
    assert ratio == pytest.approx(bytes_ratio, rel=1e-4)  # the KV of one token aside
    # the input embedding is a lookup: an untied model streams its matrices only
    m = model("llama-3.1-8b@bf16")
    matrices = (m.params - m.vocab * m.hidden) * 2 + m.kv_bytes_per_token
    assert step_time(BARE, m, [(1, 0)]).memory_s == pytest.approx(matrices / 1e12)


def test_tensor_parallel_is_faster_but_not_linear() -> None:
    one = decode_seconds(hardware("a100-80gb"), model("llama-3.1-70b@f16"), 1, 512)
    four = decode_seconds(hardware("a100-80gb-x4"), model("llama-3.1-70b@f16"), 1, 512)
    assert four < one < 4 * four


@pytest.mark.parametrize("name", ["pi5", "jetson-orin-nano", "a100-80gb-x4", "h200", "this-cpu"])
def test_prefill_grows_with_tokens(name: str) -> None:
    times = [prefill_seconds(hardware(name), model("llama-3.2-1b@bf16"), n) for n in (1, 64, 512)]
    assert times == sorted(times) and times[0] < times[-1]


def test_fitted_70b_batch_curve_is_flat_then_rising() -> None:
    hw, m = hardware("a100-80gb-x4"), model("llama-2-70b@f16")
    t = {b: decode_seconds(hw, m, b, 576) for b in (1, 32, 64)}
    assert t[32] / t[1] < 1.3
    assert t[64] / t[32] > 1.2


def test_plain_roofline_is_far_too_fast_for_the_70b() -> None:
    hw, m = hardware("a100-80gb-x4"), model("llama-2-70b@f16")
    plain = replace(hw, bw_efficiency=1.0, flops_efficiency=1.0, attention_efficiency=0.0)
    parts = step_time(plain, m, [(1, 576)])
    assert decode_seconds(hw, m, 1, 576) / max(parts.memory_s, parts.compute_s) > 2.3


def test_smooth_max_bounds_and_limits() -> None:
    assert smooth_max(3.0, 4.0, 2) == pytest.approx(5.0)
    assert smooth_max(3.0, 4.0, 1) == pytest.approx(7.0)
    assert smooth_max(3.0, 4.0, 60) == pytest.approx(4.0, rel=0.01)
    assert smooth_max(0.0, 0.0, 2) == 0.0
    assert smooth_max(1e-9, 2e-9, 20) > 0  # no underflow for tiny times


def test_overheads_apply_where_they_belong() -> None:
    m = model("tiny-target@f32")
    hw = replace(BARE, batched_overhead_ms=1.0, token_overhead_us=10.0, layer_overhead_us=100.0)
    base = step_seconds(BARE, m, [(5, 30)])
    assert step_seconds(hw, m, [(5, 30)]) - base == pytest.approx(6 * 100e-6 + 5 * 10e-6)
    two = step_seconds(hw, m, [(5, 30)] * 2) - step_seconds(BARE, m, [(5, 30)] * 2)
    assert two == pytest.approx(1e-3 + 6 * 100e-6 + 10 * 10e-6)


def test_attention_efficiency_zero_means_the_matmuls() -> None:
    m = model("llama-2-70b@f16")
    same = replace(BARE, flops_efficiency=0.5)
    explicit = replace(same, attention_efficiency=0.5)
    slow = replace(same, attention_efficiency=0.05)
    long = [(4096, 0)]
    assert step_seconds(same, m, long) == pytest.approx(step_seconds(explicit, m, long))
    assert step_seconds(slow, m, long) > step_seconds(same, m, long)


def test_fewer_layers_cost_less_fixed_time_on_the_same_gpu() -> None:
    small, large = model("llama-3.2-1b@bf16"), model("llama-3.1-8b@bf16")
    for name in ("a100-80gb", "a100-80gb-x4", "l4", "jetson-orin-nano"):
        hw = hardware(name)
        fixed = [
            step_time(hw, m, [(1, 256)]).overhead_s + step_time(hw, m, [(1, 256)]).allreduce_s
            for m in (small, large)
        ]
        assert fixed[0] < fixed[1], name
    hw = hardware("a100-80gb")  # the tiny target's 6 layers: about a millisecond, not 22
    assert decode_seconds(hw, model("tiny-target@f32"), 1, 32) < 2e-3
    # the 11B's 32-layer text decoder on the 4x A100 pays 32 layers' overhead, not the 70B's 80
    x4 = hardware("a100-80gb-x4")
    vision, big = model("llama-3.2-11b-vision@bf16"), model("llama-3.1-70b@bf16")
    assert decode_seconds(x4, vision, 1, 512) < 0.5 * decode_seconds(x4, big, 1, 512)


@pytest.mark.parametrize("name", ["a100-80gb", "a100-40gb", "l4"])
def test_speculative_round_beats_autoregressive_on_one_gpu(name: str) -> None:
    """BALANCE's SD mode on one GPU: a 1B draft proposes 4 tokens, the 8B target verifies
    them in one 5-token forward; at a per-token acceptance of 0.7 a round yields
    (1 - 0.7^5) / (1 - 0.7) = 2.77 tokens, and must cost less per token than 8B decoding."""
    hw, draft, target = hardware(name), model("llama-3.2-1b@bf16"), model("llama-3.1-8b@bf16")
    g, accept, ctx = 4, 0.7, 512
    tokens = (1 - accept ** (g + 1)) / (1 - accept)
    round_s = g * decode_seconds(hw, draft, 1, ctx) + step_seconds(hw, target, [(g + 1, ctx)])
    assert round_s / tokens < 0.85 * decode_seconds(hw, target, 1, ctx)


def test_published_single_a100_decode_rates() -> None:
    """An 8B at batch 1 on one A100 under an engine with CUDA graphs: 10-12 ms a token
    (gpt-fast 10.7, vLLM 0.6 11.4); a 1B draft several times faster, not 20+ ms."""
    hw = hardware("a100-80gb")
    assert 0.010 < decode_seconds(hw, model("llama-3.1-8b@bf16"), 1, 512) < 0.012
    assert decode_seconds(hw, model("llama-3.2-1b@bf16"), 1, 512) < 0.005


def test_idle_params_take_memory_not_time() -> None:
    vision = model("llama-3.2-11b-vision@bf16")
    text = model("llama-3.1-8b@bf16")
    assert vision.weight_bytes > 1.3 * text.weight_bytes
    hw = hardware("a100-80gb")
    ratio = decode_seconds(hw, vision, 1, 256) / decode_seconds(hw, text, 1, 256)
    assert ratio == pytest.approx(1.0, abs=0.01)


def test_records_round_trip_as_dicts() -> None:
    hw, m = hardware("a100-80gb-x4"), model("llama-3.2-1b@q4_0")
    assert Hardware.from_dict({**hw.as_dict(), "unknown": 1}) == hw
    assert ModelShape.from_dict(m.as_dict()) == m
