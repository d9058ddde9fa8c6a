"""The simulator against the real engine: the same workload, admission and loop, twice.

Users are arithmetic problems arriving over time; each one's output length is the target's
greedy answer length (the engine stops at EOS there, so both runs know the same lengths).
The real run drives `agents.balance.engine.EngineExecutor` on the wall clock; the simulated
run replays the same arrivals on the profiled cost model. Compared: each user's completion
time (finish minus arrival) where both runs served it, and the users served within deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from agents.balance.costmodel import CostModel
from agents.balance.problem import Service, Users
from agents.balance.serve import ServeResult, Workload, serve
from testbed.balance.simulator import simulate


@dataclass(frozen=True)
class Comparison:
    measured: ServeResult
    predicted: ServeResult
    latency_error: np.ndarray  # per user served by both: predicted / measured - 1

    @property
    def mean_abs_error(self) -> float:
        return float(np.mean(np.abs(self.latency_error))) if len(self.latency_error) else 0.0


def compare_with_engine(
    cost: CostModel,
    draft_dir: Path,
    target_dir: Path,
    users: int,
    rate_per_s: float,
    memory_budget: float,
    service: Service,
    policy: str = "hybrid",
    seed: int = 0,
    threads: int = 1,
) -> Comparison:
    from agents.balance.engine import EngineExecutor
    from agents.engines.torch_hf import TorchEngine
    from agents.spec.decoding import generate_ad
    from agents.workloads.arithmetic import heldout_problems, prompt

    target = TorchEngine(target_dir, threads=threads)
    draft = TorchEngine(draft_dir, threads=threads)
    rng = np.random.default_rng(seed)
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(users, seed=seed + 100)]
    max_new = 64
    lengths = np.array([len(generate_ad(target, p, max_new).tokens) for p in prompts])
    work = Workload(
        Users(
            prompt=np.array([len(p) for p in prompts]),
            output=lengths,
            deadline=0.2 + lengths * rng.uniform(0.01, 0.05, users),
        ),
        np.cumsum(rng.exponential(1 / rate_per_s, users)),
    )
    executor = EngineExecutor(target, draft, cost.draft_len)
    for uid, p in enumerate(prompts):
        executor.submit(uid, p, max_new)
    executor.wait_until(0.0)
    offset = executor.clock()
    shifted = Workload(work.users, work.arrival + offset)
    measured = serve(cost, shifted, memory_budget, service, executor, policy)
    measured = replace(measured, finish=measured.finish - offset)
    predicted = simulate(cost, work, memory_budget, service, policy, seed)
    both = np.isfinite(measured.finish) & np.isfinite(predicted.finish)
    lat_m = measured.finish[both] - work.arrival[both]
    lat_p = predicted.finish[both] - work.arrival[both]
    return Comparison(measured, predicted, lat_p / lat_m - 1)


@dataclass(frozen=True)
class MemoryCheck:
    users: int
    tokens: int  # per user, in each model's cache
    predicted_bytes: float  # KV of both models by the cost model
    measured_bytes: float  # growth of RSS (CPU) or of torch's allocated bytes (CUDA)

    @property
    def ratio(self) -> float:
        return self.measured_bytes / self.predicted_bytes


def _resident_bytes() -> int:
    """This process's resident set size, from /proc, after glibc returns its free memory.

    Without the trim, freed logits and activations stay resident and count as growth.
    """
    import ctypes
    import os

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_memory(
    cost: CostModel,
    draft_dir: Path,
    target_dir: Path,
    users: int = 64,
    tokens: int = 200,
    device: str = "cpu",
) -> MemoryCheck:
    """Fill `users` SD sessions with `tokens` tokens each and compare the growth with the model."""
    import torch

    from agents.balance.engine import EngineExecutor
    from agents.balance.modes import SD
    from agents.engines.torch_hf import TorchEngine

    target = TorchEngine(target_dir, device=device, threads=1)
    draft = TorchEngine(draft_dir, device=device, threads=1)
    executor = EngineExecutor(target, draft, cost.draft_len)
    rng = np.random.default_rng(0)
    prompts = [
        [target.bos_id, *rng.integers(3, target.vocab_size, tokens).tolist()] for _ in range(users)
    ]

    def used() -> int:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return _resident_bytes()

    executor.submit(-1, prompts[0], 1)  # warm the allocator and the kernels once
    executor.start(-1, SD)
    executor.stop(-1)
    before = used()
    for uid, p in enumerate(prompts):
        executor.submit(uid, p, 1)
        executor.start(uid, SD)  # both caches hold the prompt but its last token
    after = used()
    held_target, held_draft = executor.kv_tokens()
    predicted = (
        held_target * cost.target.kv_bytes_per_token + held_draft * cost.draft.kv_bytes_per_token
    )
    for uid in range(users):
        executor.stop(uid)
    return MemoryCheck(users, tokens, float(predicted), float(after - before))
