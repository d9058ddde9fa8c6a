"""Measure the BALANCE cost model on this host with a draft/target pair (`testbed profile`,
and on the server host `python -m agents.balance.measure`, which the runner starts).

Times the engine loop's own steps against the batch size (an AD step and an SD round, run by
`agents.balance.engine` on real sessions), the model forwards inside them (one new token per
sequence: a decode step; g+1 tokens: a verification) and a prompt's prefill, all in turns
(every round times each once; `interleaved_medians`); fits t(b) = fixed + per_seq * b by
least squares to the loop's steps; reads KV bytes per token and weight bytes off the model
(off the model it stands for, for an engine paced to emulated hardware); and measures on the
arithmetic workload how many tokens an SD round yields (agents.spec.speedup).
Torch is imported here only, inside the function.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from agents.balance.costmodel import CostModel, LoopStep, ModelCost, StepCost
from agents.emulation import clock
from agents.emulation.pacing import PacedEngine
from agents.emulation.stepcost import ModelShape
from agents.engines.base import Engine


def fit_step(points: Sequence[tuple[int, float]]) -> StepCost:
    """Least-squares t(b) = fixed + per_seq * b, both clipped at 0."""
    b = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    per_seq, fixed = np.polyfit(b, t, 1) if len(set(b)) > 1 else (0.0, float(t.mean()))
    if fixed < 0:  # through the origin instead
        fixed, per_seq = 0.0, float((b @ t) / (b @ b))
    return StepCost(fixed_s=float(fixed), per_seq_s=max(float(per_seq), 0.0))


Step = Callable[[], None]
LOOP_STEPS = ("ad_step", "ad_step_after_idle", "sd_round", "sd_round_after_idle")


def interleaved_medians(
    steps: dict[str, Step],
    repeats: int,
    idle_before: dict[str, float] | None = None,
    *,
    now: Callable[[], float] = clock.monotonic,
    sleep: Callable[[float], None] = clock.sleep,
) -> dict[str, float]:
    """Median seconds of each step, timed in turns: every round runs each step once.

    A host that slows down for a moment (another process, the hypervisor) then slows one run
    of every step, which the median drops, instead of every run of whichever step was being
    timed: timed one model after the other, a 2-core VM once measured the draft's steps at
    twice their usual time, which shut SD out of a whole lab run. A step named in
    `idle_before` runs after the process slept that many seconds (untimed), as the engine
    loop's first step of a period does; the others run right after the previous step.
    Times are read off `now` and idle waits slept with `sleep` (default: the agents' clock,
    `agents.emulation.clock`).
    """
    idle_before = idle_before or {}
    for step in steps.values():
        step()  # warm-up
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            if name in idle_before:
                sleep(idle_before[name])
            start = now()
            step()
            runs[name].append(now() - start)
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


def loop_step(executor, prompts: list[list[int]], mode: int, batch: int) -> tuple[Step, Step]:
    """(step, close): one step of the engine loop (an AD step or an SD round) over `batch`
    users just prefilled, their output rewound after, so it can be timed again; the next
    step's cache rollback is part of it, as rejected drafts' rollback is part of a round."""
    first = max(executor.users, default=-1) + 1
    uids = list(range(first, first + batch))
    for i, uid in enumerate(uids):
        executor.submit(uid, prompts[i % len(prompts)], max_new=1 << 20)
        executor.start(uid, mode)

    def step() -> None:
        executor.step(mode, uids)
        for uid in uids:
            executor.rewind(uid, 0)

    def close() -> None:
        for uid in uids:
            executor.stop(uid)

    return step, close


def round_tokens(counts: Sequence[int]) -> list[float]:
    """The share of SD rounds that yielded 1, 2, ..., g+1 tokens."""
    total = sum(counts)
    if not total:
        raise ValueError("no SD round was measured")
    return [c / total for c in counts]


def model_config_kv_bytes(engine) -> int:
    """KV bytes per token: 2 (keys, values) x layers x KV heads x head size x element size."""
    cfg = engine.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = engine.model.dtype.itemsize
    return int(2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem)


def weights_bytes(engine) -> int:
    return int(sum(p.numel() * p.element_size() for p in engine.model.parameters()))


def emulated_shape(engine: Engine) -> ModelShape | None:
    """The model a paced engine stands for (its memory is that model's), else None: a real
    engine's memory is its own."""
    return engine.shape if isinstance(engine, PacedEngine) and engine.pace else None


def measure_cost_model(
    draft_dir: Path,
    target_dir: Path,
    *,
    draft_len: int = 4,
    batches: Sequence[int] = (1, 2, 4, 8, 16),
    repeats: int = 15,
    acceptance_prompts: int = 20,
    threads: int = 1,
    device: str = "cpu",
    idle_s: float = 0.05,
    wrap: Callable[[Engine, str], Engine] = lambda engine, _role: engine,
) -> CostModel:
    """The cost model of the pair on this host (with the points it was fitted to).

    Each loop step is timed right after another step (`busy`) and after `idle_s` of sleep
    (`after_idle`: the loop's period, which it waits out when no step is owed); prefill is
    timed after the sleep, as a user starts at the top of a period. `wrap(engine, role)`
    gives the engine the loop runs (an emulated host's: paced to the hardware it stands for,
    `agents.emulation`); times are read off the agents' clock (emulated time)."""
    from agents.balance.engine import EngineExecutor
    from agents.balance.modes import AD, SD
    from agents.engines.torch_hf import TorchEngine
    from agents.spec.speedup import run_sd_bench
    from agents.workloads.arithmetic import heldout_problems, prompt

    target = wrap(TorchEngine(target_dir, device=device, threads=threads), "target")
    draft = wrap(TorchEngine(draft_dir, device=device, threads=threads), "draft")
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(acceptance_prompts, seed=5)]
    long = max(prompts, key=len)
    executor = EngineExecutor(target, draft, draft_len)
    made: dict[str, tuple[Step, Step]] = {}
    try:
        for b in batches:
            for kind, mode in (("ad_step", AD), ("sd_round", SD)):
                made[f"{kind}/{b}"] = loop_step(executor, prompts, mode, b)
                made[f"{kind}_after_idle/{b}"] = loop_step(executor, prompts, mode, b)
            made[f"target_decode/{b}"] = forward_step(target, prompts, b, 1)
            made[f"draft_decode/{b}"] = forward_step(draft, prompts, b, 1)
            made[f"verify/{b}"] = forward_step(target, prompts, b, draft_len + 1)
        made["target_prefill"] = prefill_step(target, long)
        made["draft_prefill"] = prefill_step(draft, long)
        idle = {k: idle_s for k in made if "_after_idle/" in k or k.endswith("_prefill")}
        timed = interleaved_medians({k: step for k, (step, _) in made.items()}, repeats, idle)
    finally:
        for _, close in made.values():
            close()
    points = {
        kind: [(b, timed[f"{kind}/{b}"]) for b in batches]
        for kind in LOOP_STEPS + ("target_decode", "draft_decode", "verify")
    }
    target_cost, draft_cost = (
        ModelCost(
            weights_bytes=int(shape.weight_bytes) if shape else weights_bytes(engine),
            kv_bytes_per_token=int(shape.kv_bytes_per_token) if shape
            else model_config_kv_bytes(engine),
            prefill_per_token_s=timed[f"{name}_prefill"] / len(long),
        )
        for name, engine, shape in (("target", target, emulated_shape(target)),
                                    ("draft", draft, emulated_shape(draft)))
    )  # fmt: skip
    vocab = emulated_shape(target).vocab if emulated_shape(target) else target.vocab_size
    sd = run_sd_bench(draft, target, prompts, draft_len, max_new=48)
    return CostModel(
        target=target_cost,
        draft=draft_cost,
        ad_step=LoopStep(
            busy=fit_step(points["ad_step"]), after_idle=fit_step(points["ad_step_after_idle"])
        ),
        sd_round=LoopStep(
            busy=fit_step(points["sd_round"]), after_idle=fit_step(points["sd_round_after_idle"])
        ),
        draft_len=draft_len,
        acceptance=min(sd.alpha, 0.999),
        round_tokens=round_tokens(sd.round_token_counts),
        logits_row_bytes=vocab * 4,  # float32
        host=f"{platform.node()} {platform.machine()} {device} threads={threads}",
        points=points,
    )


def main(argv: list[str] | None = None) -> int:
    """Measure the cost model on this host (the runner starts this on the server host)."""
    import argparse

    from agents.emulation.settings import add_emulation_option, start_emulation

    ap = argparse.ArgumentParser(description="Measure the BALANCE cost model on this host.")
    ap.add_argument("--draft", type=Path, required=True, help="draft HF folder")
    ap.add_argument("--target", type=Path, required=True, help="target HF folder")
    ap.add_argument("--out", type=Path, required=True, help="the cost model (JSON)")
    ap.add_argument("--draft-len", type=int, default=4, help="drafted tokens per SD round")
    ap.add_argument("--batches", default="1,2,4,8,16", help="batch sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=15, help="timing rounds (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
    add_emulation_option(ap)
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches: expected whole numbers like 1,2,4, got {args.batches!r}")
    emulation = start_emulation(ap, args.emulation)
    cost = measure_cost_model(
        args.draft, args.target, draft_len=args.draft_len, batches=batches,
        repeats=args.repeats, threads=args.threads, device=args.device, wrap=emulation.engine,
    )  # fmt: skip
    cost.save(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
