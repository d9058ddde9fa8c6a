"""The pacing's own error on this machine: how close a paced forward's real duration comes to
its budget (`agents.emulation.pacing`).

Real engines of the tiny pair run forwards paced as a catalogue model on its hardware, back to
back: the target (PyTorch) verifying 5 tokens for batches of 1, 4 and 16 sessions as
Llama-3.1-8B on one A100, and the draft (llama.cpp) decoding one token as Llama-3.2-1B q4_0 on
a Raspberry Pi 5. Each forward's error is its real duration minus its budget (real ms); the
figures are the median and p99 over the forwards that were on time, beside the forwards that
were behind. Goal: median error <= 0.2 ms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.emulation.pacing import PacedEngine
from agents.engines.factory import load_engine
from testbed.models.tiny import ensure_tiny_pair
from testbed.topo.catalogue import load_catalogue

ERROR_GOAL_MS = 0.2


@dataclass(frozen=True)
class PacingCase:
    label: str
    engine: str  # "target" (torch) or "draft" (llama.cpp)
    hardware: str
    model: str
    batch: int
    tokens: int
    forwards: int


CASES = (
    PacingCase("8B verification on an A100, batch 1", "target", "a100-80gb", "llama-3.1-8b@bf16",
               1, 5, 60),
    PacingCase("8B verification on an A100, batch 4", "target", "a100-80gb", "llama-3.1-8b@bf16",
               4, 5, 60),
    PacingCase("8B verification on an A100, batch 16", "target", "a100-80gb",
               "llama-3.1-8b@bf16", 16, 5, 60),
    PacingCase("1B q4_0 decoding on a Pi 5", "draft", "pi5", "llama-3.2-1b@q4_0", 1, 1, 40),
)  # fmt: skip


def measure_case(case: PacingCase) -> dict[str, Any]:
    """Run the case's forwards paced; its error figures (PacingStats.summary) and label."""
    pair = ensure_tiny_pair()
    path, kind = (
        (pair.target_hf, "torch") if case.engine == "target" else (pair.draft_gguf, "llama")
    )
    catalogue = load_catalogue()
    inner = load_engine(path, kind=kind)
    paced = PacedEngine(
        inner,
        catalogue.hardware(case.hardware, case.label),
        catalogue.model(case.model, case.label),
    )
    prompt = inner.tokenize("Q: 17 + 25 = ?")
    sids = [inner.open() for _ in range(case.batch)]
    inner.score_batch({s: prompt for s in sids})
    feed = {s: [inner.eos_id + 2 + k for k in range(case.tokens)] for s in sids}
    for _ in range(case.forwards):
        paced.score_batch(feed)
        for s in sids:
            inner.rollback(s, len(prompt))
    return {"case": case.label, "hardware": case.hardware, "model": case.model,
            "batch": case.batch, **paced.stats.summary()}  # fmt: skip


def run_pacing(
    echo: Callable[[str], None], progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every case, printed as a table; returns the figures."""
    rows = []
    for case in CASES:
        progress(f"pacing: {case.label}")
        rows.append(measure_case(case))
    echo("\npacing on this machine: a paced forward's real duration minus its budget (real ms)")
    echo(f"{'case':<40}{'forwards':>9}{'behind':>8}{'error p50':>11}{'p99':>8}{'modelled ms':>13}")
    for r in rows:
        p50, p99 = r["error_ms_p50"], r["error_ms_p99"]
        echo(
            f"{r['case']:<40}{r['forwards']:>9}{r['behind']:>8}"
            f"{'-' if p50 is None else f'{p50:.3f}':>11}{'-' if p99 is None else f'{p99:.3f}':>8}"
            f"{1000 * r['modelled_s'] / max(r['forwards'], 1):>13.2f}"
        )
    worst = max((r["error_ms_p50"] or 0.0) for r in rows)
    verdict = "met" if worst <= ERROR_GOAL_MS else "missed"
    echo(f"worst median error {worst:.3f} ms (goal <= {ERROR_GOAL_MS} ms: {verdict})")
    return rows
