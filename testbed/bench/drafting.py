"""Draft model quantizations: acceptance and drafting rate, and the agent against raw llama.cpp.

For each variant of the tiny draft (f32, f16, q8_0, q4_0; `testbed.models.gguf_export`), on
the same held-out prompts:
- acceptance: accepted / drafted in speculative decoding against the tiny target (k = 4);
- agent rate: tokens per second of the device's drafting loop (`LlamaCppEngine.draft_greedy`,
  a fresh session per round: prefill of the prompt, then `tokens` greedy drafts);
- raw rate: the same rounds through llama-cpp-python's own `Llama.generate` (greedy), the
  reference the agent must keep up with (goal: agent >= 95 % of raw).
Rates are measured back to back in one process, variant by variant.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import typer

VARIANTS = ("f32", "f16", "q8_0", "q4_0")


@dataclass
class DraftFigure:
    variant: str
    bytes: int
    acceptance: float
    agent_tok_s: float
    raw_tok_s: float

    @property
    def agent_vs_raw(self) -> float:
        return self.agent_tok_s / self.raw_tok_s


def variant_files(draft_hf: Path, draft_f32: Path, folder: Path) -> dict[str, Path]:
    """The draft as every variant (f32 is the cached one; the others are written to folder)."""
    from testbed.models.gguf_export import export_gguf, quantize_gguf

    files = {"f32": draft_f32, "f16": export_gguf(draft_hf, folder / "draft-f16.gguf", "f16")}
    for kind in ("q8_0", "q4_0"):
        files[kind] = quantize_gguf(draft_f32, folder / f"draft-{kind}.gguf", kind)
    return files


def agent_rate(path: Path, prompts: list[list[int]], tokens: int, seconds: float) -> float:
    from agents.engines.llama_cpp import LlamaCppEngine

    eng = LlamaCppEngine(path, n_threads=1)
    drafted, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for ids in prompts:
            sid = eng.open()
            drafted += len(eng.draft_greedy(sid, ids, tokens, stop_at_eos=False))
            eng.close(sid)
    return drafted / (time.perf_counter() - t0)


def raw_rate(path: Path, prompts: list[list[int]], tokens: int, seconds: float) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=1, n_batch=512, verbose=False)
    drafted, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for ids in prompts:
            llm.reset()
            for n, _ in enumerate(llm.generate(ids, top_k=1, temp=0.0, reset=True), 1):
                if n == tokens:
                    break
            drafted += tokens
    return drafted / (time.perf_counter() - t0)


def acceptance(path: Path, target, prompts: list[list[int]], max_new: int) -> float:
    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.spec.decoding import generate_sd
    from agents.spec.rates import acceptance_rate

    draft = LlamaCppEngine(path, n_threads=1)
    accepted = drafted = 0
    for ids in prompts:
        gen = generate_sd(draft, target, ids, max_new, 4)
        accepted, drafted = accepted + gen.accepted, drafted + gen.drafted
    return acceptance_rate(accepted, drafted) or 0.0


def cli(
    prompts: int = typer.Option(10, help="held-out problems"),
    tokens: int = typer.Option(8, help="drafted tokens per round"),
    seconds: float = typer.Option(2.0, help="timing per rate measurement"),
    max_new: int = typer.Option(48, help="tokens per answer in the acceptance run"),
) -> None:
    """Quantized drafts (f32, f16, q8_0, q4_0): acceptance and drafting rate vs raw llama.cpp."""
    from agents.engines.torch_hf import TorchEngine
    from agents.workloads.arithmetic import heldout_problems, prompt
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    target = TorchEngine(pair.target_hf, threads=1)
    ids = [target.tokenize(prompt(p)) for p in heldout_problems(prompts, seed=3)]
    with tempfile.TemporaryDirectory(prefix="drafts-") as tmp:
        files = variant_files(pair.draft_hf, pair.draft_gguf, Path(tmp))
        typer.echo(f"Draft variants on {prompts} prompts, rounds of {tokens} drafts, 1 thread")
        for name in VARIANTS:
            path = files[name]
            fig = DraftFigure(name, path.stat().st_size, acceptance(path, target, ids, max_new),
                              agent_rate(path, ids, tokens, seconds),
                              raw_rate(path, ids, tokens, seconds))  # fmt: skip
            typer.echo(
                f"  {name:5s} {fig.bytes / 1024:7.1f} KiB  acceptance {fig.acceptance:.3f}  "
                f"agent {fig.agent_tok_s:8.0f} tok/s  raw llama-cpp-python "
                f"{fig.raw_tok_s:8.0f} tok/s  agent/raw {fig.agent_vs_raw:.1%} (goal >= 95 %)"
            )
