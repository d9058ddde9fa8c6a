"""The verification server's batched forward: cost per batch against the batch size.

Each of B sessions holds a prompt-length prefix; one `score_batch` scores g+1 new tokens for
every session (what SLED's server does for B devices' drafts). Reported: median time per
batch, verified tokens per second, and the speedup of one batched forward over B separate
ones: the capacity the server gains from batching.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from agents.engines.base import Engine


@dataclass
class BatchPoint:
    batch: int
    batch_ms: float  # median time of one batched forward
    single_ms: float  # median time of one single-session forward

    @property
    def batching_gain(self) -> float:
        """B separate forwards over one batched forward."""
        return self.batch * self.single_ms / self.batch_ms


def _sync(engine: Engine) -> None:
    """Wait for queued GPU work so wall-clock timings are real."""
    device = getattr(engine, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def timed_forward(engine: Engine, requests: dict[int, list[int]]) -> float:
    """Seconds of one `score_batch` of requests; the sessions are rolled back afterwards."""
    lengths = {sid: engine.length(sid) for sid in requests}
    t0 = time.perf_counter()
    engine.score_batch(requests)
    _sync(engine)
    dt = time.perf_counter() - t0
    for sid, n in lengths.items():
        engine.rollback(sid, n)
    return dt


def time_batches(
    engine: Engine,
    prompts: list[list[int]],
    batches: list[int],
    draft_len: int,
    repeats: int = 20,
) -> list[BatchPoint]:
    """Median batched-forward time per batch size (sessions cycle through prompts)."""
    points = []
    new = [5] * (draft_len + 1)
    for b in batches:
        sids = []
        for i in range(b):
            sid = engine.open()
            engine.score(sid, prompts[i % len(prompts)])
            sids.append(sid)
        batch = {sid: new for sid in sids}
        single = {sids[0]: new}
        for _ in range(3):  # warm-up
            timed_forward(engine, batch)
            timed_forward(engine, single)
        batch_ms = statistics.median(timed_forward(engine, batch) for _ in range(repeats)) * 1e3
        single_ms = statistics.median(timed_forward(engine, single) for _ in range(repeats)) * 1e3
        points.append(BatchPoint(b, batch_ms, single_ms))
        for sid in sids:
            engine.close(sid)
    return points
