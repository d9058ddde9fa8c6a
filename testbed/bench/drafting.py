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

import time
from dataclasses import dataclass
from pathlib import Path

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
