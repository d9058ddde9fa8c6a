"""The server alone: every device's problems answered on the server host, no network.

`--mode ad` generates with the target alone (autoregressive, greedy); `--mode sd` runs
speculative decoding with the draft and the target both on the server (greedy, so the answer
is the target's own greedy answer). These are the `server-ad` and `server-sd` playbook modes:
the reference points SLED is compared with when no device drafts.

Problems carry the name of the device they belong to (`dev`); records keep it, so per-device
figures exist as in the other modes. The problems are answered one at a time, in the order of
the file (the runner interleaves devices), or at their arrival times (`arrive_s`, open loop).
Each request writes one round (mode `server-ad` / `server-sd`) and one request record, in the
device agent's schemas; every token is the target's (verified).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any, Literal

from agents.emulation import clock
from agents.emulation.pacing import pacing_rows
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.engines.base import Engine
from agents.engines.factory import load_engine
from agents.power import PowerSampler, detect_source
from agents.records import RecordWriter
from agents.sled.device import load_problems, request_record
from agents.spec.decoding import Generation, generate_ad, generate_sd
from agents.workloads.request import answer_limit, answer_text, prompt_ids, stop_token


class LocalServer:
    """Answers problems with the target alone (AD) or draft + target (SD) on one host."""

    def __init__(
        self,
        mode: Literal["ad", "sd"],
        target: Engine,
        draft: Engine | None,
        records: RecordWriter,
        max_new: int,
        draft_len: int = 4,
    ) -> None:
        if mode == "sd" and draft is None:
            raise ValueError("mode sd needs a draft model")
        self.mode = mode
        self.target = target
        self.draft = draft
        self.records = records
        self.max_new = max_new
        self.draft_len = draft_len
        self.stopping = False

    def generate(self, prompt: list[int], max_new: int, stop: int) -> Generation:
        if self.mode == "sd" and self.draft is not None:
            return generate_sd(self.draft, self.target, prompt, max_new, self.draft_len,
                               stop_id=stop)  # fmt: skip
        return generate_ad(self.target, prompt, max_new, stop_id=stop)

    def run_problem(self, problem: dict[str, Any]) -> dict[str, Any]:
        """Answer one problem; write its round and request records; return the request."""
        dev, sid = str(problem["dev"]), str(problem["id"])
        prompt = prompt_ids(self.target, problem)
        t_start = clock.now()
        gen = self.generate(prompt, answer_limit(problem, self.max_new),
                            stop_token(self.target, problem))  # fmt: skip
        t_end = clock.now()
        out = gen.tokens
        self.records.write(
            "rounds",
            {"dev": dev, "problem": sid, "round": 0, "t_start": t_start, "t_end": t_end,
             "mode": f"server-{self.mode}", "tokens": len(out),
             "drafted": gen.drafted, "accepted": gen.accepted if self.mode == "sd" else None,
             "draft_ms": gen.draft_seconds * 1000,
             "server_compute_ms": (t_end - t_start) * 1000},
        )  # fmt: skip
        text = answer_text(self.target, out)
        n = len(out)
        record = request_record(dev, problem, t_start, t_end, len(prompt), out, text, n, 0, 1)
        self.records.write("requests", record)
        return record

    def run(self, problems: list[dict[str, Any]]) -> int:
        """All problems, in file order or at their arrival times; returns how many."""
        for engine in (self.target, self.draft):
            if engine is not None:
                engine.warm_up()  # lazy set-up must not land on the first answer
        t0 = clock.now()
        if any(p.get("arrive_s") is not None for p in problems):
            problems = sorted(problems, key=lambda p: float(p.get("arrive_s") or 0.0))
        done = 0
        for problem in problems:
            if self.stopping:
                break
            if problem.get("arrive_s") is not None:
                problem = {**problem, "t_arrival": t0 + float(problem["arrive_s"])}
                clock.sleep(max(0.0, problem["t_arrival"] - clock.now()))
            self.run_problem(problem)
            done += 1
        return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Every device's problems on the server alone.")
    ap.add_argument("--mode", choices=["ad", "sd"], required=True, help="target alone, or SD")
    ap.add_argument("--target", required=True, help="target model: HF folder or .gguf")
    ap.add_argument("--draft", help="draft model (mode sd): .gguf or HF folder")
    ap.add_argument("--device", default="cpu", help="torch device of the target (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft-len", type=int, default=4, help="mode sd: tokens per draft")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--problems", type=Path, required=True, help="JSON lines: dev, id, prompt")
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    add_emulation_option(ap)
    args = ap.parse_args(argv)
    if args.mode == "sd" and not args.draft:
        ap.error("--mode sd needs --draft")
    emulation = start_emulation(ap, args.emulation)
    problems = load_problems(args.problems)
    if missing := [str(p["id"]) for p in problems if "dev" not in p]:
        ap.error(f"{args.problems}: problems {', '.join(missing)} lack the key 'dev'")
    target = emulation.engine(
        load_engine(args.target, device=args.device, threads=args.threads), "target"
    )
    draft = None
    if args.mode == "sd":
        draft = emulation.engine(load_engine(args.draft, threads=args.threads), "draft")
    t0 = clock.now()
    power = PowerSampler(args.records, detect_source())
    with RecordWriter(args.records) as records, power:
        server = LocalServer(args.mode, target, draft, records, args.max_new, args.draft_len)

        def stop(*_: object) -> None:
            server.stopping = True

        signal.signal(signal.SIGTERM, stop)
        answered = server.run(problems)
        t1 = clock.now()
        power.stop()
        engines = {"target": target} | ({"draft": draft} if draft is not None else {})
        for row in pacing_rows(engines):
            records.write("pacing", row)
        status = {"answered": answered, "t_start": t0, "t_end": t1, "seconds": t1 - t0,
                  **power.summary.as_status()}  # fmt: skip
        (args.records / "status.json").write_text(json.dumps(status) + "\n")
    print(f"server-{args.mode}: answered {answered}/{len(problems)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
