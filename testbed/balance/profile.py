"""`testbed profile`: measure the cost model on this host with a draft/target pair.

Times one batched forward of each model against the batch size (one new token per sequence:
a decode step; g+1 tokens: a verification) and a prompt's prefill, all in turns (every
round times each once; `interleaved_medians`), fits
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


Step = Callable[[], None]


def interleaved_medians(steps: dict[str, Step], repeats: int) -> dict[str, float]:
    """Median seconds of each step, timed in turns: every round runs each step once.

    A host that slows down for a moment (another process, the hypervisor) then slows one run
    of every step, which the median drops, instead of every run of whichever step was being
    timed: timed one model after the other, a 2-core VM once measured the draft's steps at
    twice their usual time, which shut SD out of a whole lab run.
    """
    for step in steps.values():
        step()  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            runs[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in runs.items()}


def forward_step(engine, prompts: list[list[int]], batch: int, tokens: int) -> tuple[Step, Step]:
    """(step, close): one forward of `batch` sessions appending `tokens` tokens each, rolled
    back after, so it can be timed again; close frees the sessions."""
    sids = [engine.open() for _ in range(batch)]
    engine.score_batch({s: prompts[i % len(prompts)] for i, s in enumerate(sids)})
    base = {s: engine.length(s) for s in sids}
    new = {s: [engine.eos_id + 2 + k for k in range(tokens)] for s in sids}

    def step() -> None:
        engine.score_batch(new)
        for s in sids:
            engine.rollback(s, base[s])

    def close() -> None:
        for s in sids:
            engine.close(s)

    return step, close


def prefill_step(engine, prompt_ids: list[int]) -> tuple[Step, Step]:
    """(step, close): prefill of one prompt in a session, rolled back after."""
    sid = engine.open()
    return (lambda: (engine.score(sid, prompt_ids), engine.rollback(sid, 0))), (
        lambda: engine.close(sid)
    )


def model_config_kv_bytes(engine) -> int:
    """KV bytes per token: 2 (keys, values) x layers x KV heads x head size x element size."""
    cfg = engine.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = engine.model.dtype.itemsize
    return int(2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem)


def weights_bytes(engine) -> int:
    return int(sum(p.numel() * p.element_size() for p in engine.model.parameters()))


def measure_cost_model(
    draft_dir: Path,
    target_dir: Path,
    *,
    draft_len: int = 4,
    batches: Sequence[int] = (1, 2, 4, 8, 16),
    repeats: int = 15,
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
    long = max(prompts, key=len)
    made: dict[str, tuple[Step, Step]] = {}
    try:
        for b in batches:
            made[f"target_decode/{b}"] = forward_step(target, prompts, b, 1)
            made[f"draft_decode/{b}"] = forward_step(draft, prompts, b, 1)
            made[f"verify/{b}"] = forward_step(target, prompts, b, draft_len + 1)
        made["target_prefill"] = prefill_step(target, long)
        made["draft_prefill"] = prefill_step(draft, long)
        timed = interleaved_medians({k: step for k, (step, _) in made.items()}, repeats)
    finally:
        for _, close in made.values():
            close()
    points = {
        kind: [(b, timed[f"{kind}/{b}"]) for b in batches]
        for kind in ("target_decode", "draft_decode", "verify")
    }
    target_cost, draft_cost = (
        ModelCost(
            weights_bytes=weights_bytes(engine),
            kv_bytes_per_token=model_config_kv_bytes(engine),
            decode=fit_step(points[f"{name}_decode"]),
            prefill_per_token_s=timed[f"{name}_prefill"] / len(long),
        )
        for name, engine in (("target", target), ("draft", draft))
    )
    sd = run_sd_bench(draft, target, prompts, draft_len, max_new=48)
    workspace = max_batch * (draft_len + 1) * target.vocab_size * 4  # float32 logits
    return CostModel(
        target=target_cost,
        draft=draft_cost,
        verify=fit_step(points["verify"]),
        draft_len=draft_len,
        acceptance=min(sd.alpha, 0.999),
        verify_workspace_bytes=workspace,
        host=f"{platform.node()} {platform.machine()} {device} threads={threads}",
        points=points,
    )
