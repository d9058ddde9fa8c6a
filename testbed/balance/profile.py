"""`testbed profile`: measure the cost model on this host with a draft/target pair.

Times one batched forward of each model against the batch size (one new token per sequence:
a decode step; g+1 tokens: a verification) and against the prompt length (prefill), fits
t(b) = fixed + per_seq * b by least squares, reads KV bytes per token and weight bytes off the
model, and measures the pair's acceptance rate on the arithmetic workload (testbed.bench.sd).
Torch is imported here only, inside the function.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from testbed.balance.costmodel import CostModel, ModelCost, StepCost


def fit_step(points: Sequence[tuple[int, float]]) -> StepCost:
    """Least-squares t(b) = fixed + per_seq * b, both clipped at 0."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    per_seq, fixed = np.polyfit(b, t, 1) if len(set(b)) > 1 else (0.0, float(t.mean()))
    if fixed < 0:  # through the origin instead
        fixed, per_seq = 0.0, float((b @ t) / (b @ b))
    return StepCost(fixed_s=float(fixed), per_seq_s=max(float(per_seq), 0.0))


def _median_s(fn: Callable[[], None], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def time_forward(engine, prompts: list[list[int]], batch: int, tokens: int, repeats: int) -> float:
    """Median seconds of one forward of `batch` sessions appending `tokens` tokens each."""
    sids = [engine.open() for _ in range(batch)]
    try:
        engine.score_batch({s: prompts[i % len(prompts)] for i, s in enumerate(sids)})
        base = {s: engine.length(s) for s in sids}
        new = {s: [engine.eos_id + 2 + k for k in range(tokens)] for s in sids}

        def step() -> None:
            engine.score_batch(new)
            for s in sids:
                engine.rollback(s, base[s])

        step()  # warm-up
        return _median_s(step, repeats)
    finally:
        for s in sids:
            engine.close(s)


def model_config_kv_bytes(engine) -> int:
    """KV bytes per token: 2 (keys, values) x layers x KV heads x head size x element size."""
    cfg = engine.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = engine.model.dtype.itemsize
    return int(2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem)


def model_cost(engine, prompts: list[list[int]], batches: list[int], repeats: int):
    """(ModelCost, raw decode points) of one engine."""
    kv = model_config_kv_bytes(engine)
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    points = [(b, time_forward(engine, prompts, b, 1, repeats)) for b in batches]
    long = max(prompts, key=len)
    sid = engine.open()
    try:
        prefill = _median_s(lambda: (engine.score(sid, long), engine.rollback(sid, 0)), repeats)
    finally:
        engine.close(sid)
    cost = ModelCost(
        weights_bytes=int(weights),
        kv_bytes_per_token=int(kv),
        decode=fit_step(points),
        prefill_per_token_s=prefill / len(long),
    )
    return cost, points


def measure_cost_model(
    draft_dir: Path,
    target_dir: Path,
    *,
    draft_len: int = 4,
    batches: Sequence[int] = (1, 2, 4, 8, 16),
    repeats: int = 7,
    acceptance_prompts: int = 20,
    max_batch: int = 64,
    threads: int = 1,
    device: str = "cpu",
) -> CostModel:
    """The cost model of the pair on this host (with the points it was fitted to)."""
    from agents.engines.torch_hf import TorchEngine
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.bench.sd import run_sd_bench

    target = TorchEngine(target_dir, device=device, threads=threads)
    draft = TorchEngine(draft_dir, device=device, threads=threads)
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(acceptance_prompts, seed=5)]
    target_cost, target_pts = model_cost(target, prompts, list(batches), repeats)
    draft_cost, draft_pts = model_cost(draft, prompts, list(batches), repeats)
    verify_pts = [(b, time_forward(target, prompts, b, draft_len + 1, repeats)) for b in batches]
    sd = run_sd_bench(draft, target, prompts, draft_len, max_new=48)
    workspace = max_batch * (draft_len + 1) * target.vocab_size * 4  # float32 logits
    return CostModel(
        target=target_cost,
        draft=draft_cost,
        verify=fit_step(verify_pts),
        draft_len=draft_len,
        acceptance=min(sd.alpha, 0.999),
        verify_workspace_bytes=workspace,
        host=f"{platform.node()} {platform.machine()} {device} threads={threads}",
        points={"target_decode": target_pts, "draft_decode": draft_pts, "verify": verify_pts},
    )
