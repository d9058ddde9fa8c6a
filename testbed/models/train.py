"""Train a LlamaForCausalLM from scratch on the synthetic arithmetic set (CPU, deterministic).

Each example is `[BOS] prompt answer [EOS]`, prompt and answer tokenized separately so the
boundary matches what the model sees at inference (prompt alone, then generation). Examples
are packed end to end into rows of one fixed length (`encode_packed`), the way language models
are pre-trained: a row holds several solved problems one after another, so the models learn to
read earlier solved problems before a question (a few-shot prompt of any length) and to go on
past an answer's EOS with another problem, which is what an answer held to a fixed length (as
serving benchmarks hold them) generates. AdamW with linear warm-up and a cosine decay to a
tenth of the peak rate; loss on every token. Determinism: a fixed seed for the weights and for
batch sampling, and a fixed thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agents.workloads.arithmetic import Problem, prompt

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class TrainSpec:
    """Optimiser settings of one training run."""

    steps: int
    lr: float
    batch_size: int = 64
    seed: int = 0
    threads: int = 2
    warmup_frac: float = 0.05
    min_lr_frac: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0


@dataclass(frozen=True)
class TrainProgress:
    """Where a training run stands: the step just done (1-based), its loss, and the time
    left at the pace so far."""

    step: int
    steps: int
    loss: float
    elapsed_s: float

    @property
    def eta_s(self) -> float:
        """Seconds left if the remaining steps take as long as the ones done."""
        return self.elapsed_s / self.step * (self.steps - self.step)

    def line(self, what: str) -> str:
        """`what: step 120/2000, loss 1.234, 3 min 10 s left`."""
        left = int(round(self.eta_s))
        eta = f"{left // 60} min {left % 60:02d} s" if left >= 60 else f"{left} s"
        return f"{what}: step {self.step}/{self.steps}, loss {self.loss:.3f}, {eta} left"


@dataclass
class TrainResult:
    """What a training run did: parameter count, losses, wall time."""

    params: int
    steps: int
    final_loss: float
    wall_s: float
    loss_curve: list[tuple[int, float]] = field(default_factory=list)


def example_ids(
    tokenizer: Tokenizer, problems: Sequence[Problem], bos_id: int, eos_id: int
) -> list[list[int]]:
    """`[BOS] prompt answer [EOS]` per problem, prompt and answer tokenized separately."""
    prompts = tokenizer.encode_batch([prompt(p) for p in problems], add_special_tokens=False)
    answers = tokenizer.encode_batch([p.answer for p in problems], add_special_tokens=False)
    return [[bos_id, *q.ids, *a.ids, eos_id] for q, a in zip(prompts, answers)]


def encode_packed(
    tokenizer: Tokenizer, problems: Sequence[Problem], row_len: int, bos_id: int, eos_id: int
) -> torch.Tensor:
    """An (n, row_len) id tensor: every problem's `[BOS] prompt answer [EOS]` end to end, cut
    into rows of row_len tokens (the tail that fills no whole row is dropped)."""
    import torch

    if row_len < 2:
        raise ValueError(f"row_len must be >= 2, got {row_len}")
    stream = [t for ids in example_ids(tokenizer, problems, bos_id, eos_id) for t in ids]
    rows = len(stream) // row_len
    if rows == 0:
        raise ValueError(f"{len(stream)} tokens fill no row of {row_len}")
    return torch.tensor(stream[: rows * row_len], dtype=torch.long).view(rows, row_len)


def lr_factor(step: int, spec: TrainSpec) -> float:
    """Multiplier of the peak learning rate at step: linear warm-up, cosine to min_lr_frac."""
    warm = max(1, int(spec.steps * spec.warmup_frac))
    cosine = 0.5 * (1 + math.cos(math.pi * min(step, spec.steps) / spec.steps))
    return min(1.0, (step + 1) / warm) * (spec.min_lr_frac + (1 - spec.min_lr_frac) * cosine)


def train_model(
    config: LlamaConfig,
    data: torch.Tensor,
    spec: TrainSpec,
    progress: Callable[[TrainProgress], None] | None = None,
    progress_every_s: float = 5.0,
) -> tuple[LlamaForCausalLM, TrainResult]:
    """Train a fresh model of config on rows of data.

    The loss curve samples every 25th step; `progress` hears about the run at most every
    `progress_every_s` seconds and after the last step (reporting does not touch the
    computation, so it cannot change the weights).
    """
    import torch
    from transformers import LlamaForCausalLM

    if spec.steps < 1 or spec.batch_size < 1:
        raise ValueError(f"TrainSpec: steps and batch_size must be >= 1, got {spec}")
    old_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
        model.train()
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(
            model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=spec.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, spec))
        gen = torch.Generator().manual_seed(spec.seed)
        curve: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        loss_value = float("nan")
        last_report = t0
        for step in range(spec.steps):
            batch = data[torch.randint(0, len(data), (spec.batch_size,), generator=gen)]
            logits = model(input_ids=batch).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)
            )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if step % 25 == 0 or step == spec.steps - 1:
                loss_value = float(loss.item())
                curve.append((step, round(loss_value, 4)))
            now = time.perf_counter()
            last = step == spec.steps - 1
            if progress and (last or now - last_report >= progress_every_s):
                last_report = now
                progress(TrainProgress(step + 1, spec.steps, float(loss.item()), now - t0))
        model.eval()
        wall = time.perf_counter() - t0
    finally:
        torch.set_num_threads(old_threads)
    return model, TrainResult(n_params, spec.steps, round(loss_value, 4), round(wall, 1), curve)
