"""The BALANCE server process the runner starts on the lab's server host.

It replays the users the runner wrote (prompt, output length, deadline, arrival time) through
admission control and the hybrid engine loop (`agents.balance.serve`) on the real
engines (`agents.balance.engine.EngineExecutor`, PyTorch, greedy), on the wall clock, and
writes per user its mode, completion and output tokens, and a summary with the peak memory:
reserved by admission, and held by the engine (the tokens really in each model's cache times
the model's KV bytes per token, each user's rows of its step's logits, and the weights
resident at that moment), and the process's peak RSS before the first user and at the end
(its growth includes activations and logits as well as the caches).
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import numpy as np

from agents.balance.costmodel import CostModel, load_cost_model
from agents.balance.engine import EngineExecutor
from agents.balance.modes import MODE_NAMES
from agents.balance.problem import Users, default_service
from agents.balance.serve import Workload, serve
from agents.emulation.pacing import pacing_rows
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.engines.base import Engine
from agents.engines.torch_hf import TorchEngine
from agents.records import RecordWriter, read_records
from agents.steal import steal_ms


class MeasuredExecutor(EngineExecutor):
    """The engine executor, noting the most memory its caches and models held at once."""

    def __init__(self, target: Engine, draft: Engine, cost: CostModel) -> None:
        super().__init__(target, draft, cost.draft_len)
        self.cost = cost
        self.peak_held_bytes = float(cost.target.weights_bytes)
        self.serving: dict[int, int] = {}  # uid: mode, of the users started and not stopped

    def held_bytes(self) -> float:
        """Weights resident now (the draft's while any user drafts), the KV bytes of the
        tokens each model's caches hold now, and each user's rows of its mode's step logits."""
        t_tokens, d_tokens = self.kv_tokens()
        c = self.cost
        held = c.target.weights_bytes + t_tokens * c.target.kv_bytes_per_token
        if any(u.draft is not None for u in self.users.values()):
            held += c.draft.weights_bytes
        held += sum(c.workspace_bytes(mode) for mode in self.serving.values())
        return held + d_tokens * c.draft.kv_bytes_per_token

    def start(self, uid: int, mode: int) -> None:
        super().start(uid, mode)
        self.serving[uid] = mode
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes())

    def step(self, mode: int, uids: list[int]) -> tuple[dict[int, int], set[int]]:
        out = super().step(mode, uids)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes())
        return out

    def stop(self, uid: int) -> None:
        super().stop(uid)
        self.serving.pop(uid, None)


def _peak_rss_bytes() -> int:
    """The most resident memory this process has held so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", required=True, help="users.jsonl written by the runner")
    ap.add_argument("--cost", required=True, help="cost-model JSON (`testbed profile`)")
    ap.add_argument("--target", required=True, help="target HF folder")
    ap.add_argument("--draft", required=True, help="draft HF folder")
    ap.add_argument("--policy", required=True, choices=["ad-only", "sd-only", "hybrid"])
    ap.add_argument("--memory-bytes", type=float, required=True)
    ap.add_argument("--fixed-share", type=float, required=True)
    ap.add_argument("--period-s", type=float, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--records", required=True, help="folder for served.jsonl, summary.json")
    add_emulation_option(ap)
    args = ap.parse_args(argv)
    emulation = start_emulation(ap, args.emulation)

    cost = load_cost_model(Path(args.cost))
    rows = read_records(args.users)
    target = emulation.engine(
        TorchEngine(args.target, device=args.device, threads=args.threads), "target"
    )
    draft = emulation.engine(
        TorchEngine(args.draft, device=args.device, threads=args.threads), "draft"
    )
    prompts = [target.tokenize(r["prompt"]) for r in rows]
    users = Users(
        prompt=np.array([len(p) for p in prompts]),
        output=np.array([r["output_tokens"] for r in rows]),
        deadline=np.array([r["deadline_s"] for r in rows]),
    )
    executor = MeasuredExecutor(target, draft, cost)
    rss_loaded = _peak_rss_bytes()  # the models loaded, no user yet
    for uid, (p, r) in enumerate(zip(prompts, rows)):
        executor.submit(uid, p, r["max_new"])
    offset = executor.clock()  # arrivals count from here
    arrival = np.array([r["arrival_s"] for r in rows]) + offset
    service = default_service(cost, args.fixed_share, args.period_s)
    steal_before = steal_ms()
    result = serve(
        cost, Workload(users, arrival), args.memory_bytes, service, executor, args.policy
    )
    steal_after = steal_ms()
    with RecordWriter(args.records) as out:
        for row in pacing_rows({"target": target, "draft": draft}):
            out.write("pacing", row)
        for uid, r in enumerate(rows):
            finished = bool(np.isfinite(result.finish[uid]))
            tokens = executor.outputs.get(uid, [])
            out.write(
                "served",
                {
                    "uid": uid,
                    "problem": r["problem"],
                    "mode": MODE_NAMES[int(result.mode[uid])],
                    "admission": result.reason[uid],
                    "completion_s": float(result.finish[uid] - arrival[uid]) if finished else None,
                    "met": bool(result.met[uid]),
                    "tokens": tokens,
                    "text": target.detokenize(tokens) if tokens else "",
                },
            )
    summary = {
        "makespan_s": result.makespan_s,
        "peak_reserved_bytes": result.peak_memory_bytes,
        "peak_held_bytes": executor.peak_held_bytes,
        "rss_peak_bytes": _peak_rss_bytes(),
        "rss_loaded_bytes": rss_loaded,
        "ad_steps_per_s": service.ad_steps_per_s,
        "sd_rounds_per_s": service.sd_rounds_per_s,
        "most_behind_s": result.most_behind_s,
        "steal_ms": None if None in (steal_before, steal_after) else steal_after - steal_before,
    }
    Path(args.records, "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
