"""SLED device agent: drafts tokens locally and has the edge server verify them.

Per round the device drafts `draft_len` tokens with its small model and sends them for
verification, waiting at most `timeout_ms` for the verdict and resending up to `retries`
times. If every attempt fails the link is declared down: the drafted tokens are emitted as
they are (marked unverified, "fallback") and the device keeps generating from its own model,
sending a HELLO probe every `probe_ms` without waiting for it. The first answer to a probe
brings the device back to verification; it then sends the tokens the server has not seen
as context, so the server's copy of the conversation catches up.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.engines.base import Engine, TokenizerMismatchError
from agents.engines.factory import load_engine
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.records import RecordWriter
from agents.sled.link import ServerLink
from agents.spec.decoding import draft_tokens, finish
from agents.spec.session import TrackedSession


@dataclass
class DeviceConfig:
    """Knobs of the device agent (defaults from the SLED design)."""

    dev: str
    draft_len: int = 4
    timeout_ms: float = 200.0
    retries: int = 3
    max_new: int = 64
    probe_ms: float = 200.0


class DeviceAgent:
    """Runs problems one after another through draft -> verify (or fallback) rounds."""

    def __init__(
        self, engine: Engine, link: ServerLink, records: RecordWriter, cfg: DeviceConfig
    ) -> None:
        self.engine = engine
        self.link = link
        self.records = records
        self.cfg = cfg
        self.drafter = TrackedSession(engine)
        self.rid = int(time.time() * 1000)  # increases across restarts of the agent
        self.online = False
        self.probe_rids: set[int] = set()
        self.last_probe = float("-inf")
        self.stopping = False

    def next_rid(self) -> int:
        self.rid += 1
        return self.rid

    # -- link state ----------------------------------------------------------------------
    def _hello(self) -> wire.Hello:
        rid = self.next_rid()
        self.probe_rids.add(rid)
        return wire.Hello(dev=self.cfg.dev, tokenizer=self.engine.tokenizer_hash, rid=rid)

    def _accept_ack(self, msg: wire.Message | None) -> bool:
        if not isinstance(msg, wire.HelloAck):
            return False
        if not msg.ok:
            raise TokenizerMismatchError(msg.reason)
        self.online = True
        self.probe_rids.clear()
        return True

    def handshake(self) -> bool:
        """HELLO with the usual timeout and retries; False leaves the device in fallback."""
        hello = self._hello()
        ex = self.link.request(
            hello,
            lambda m: isinstance(m, wire.HelloAck) and m.rid == hello.rid,
            self.cfg.timeout_ms / 1000,
            self.cfg.retries,
        )
        self.last_probe = time.monotonic()
        return self._accept_ack(ex.reply)

    def probe(self) -> None:
        """While offline: check for an answer to earlier probes; send a new one when due."""
        msg = self.link.poll(
            lambda m: isinstance(m, wire.HelloAck) and m.rid in self.probe_rids, 0.0
        )
        if self._accept_ack(msg):
            return
        if (time.monotonic() - self.last_probe) * 1000 >= self.cfg.probe_ms:
            self.link.send(self._hello())
            self.last_probe = time.monotonic()

    # -- one round -----------------------------------------------------------------------
    def _verify(self, sid: str, committed: list[int], synced: int, drafts: list[int]):
        """Send drafts for verification (resyncing if asked); return (verdict, exchange)."""
        while True:
            rid = self.next_rid()
            msg = wire.Verify(self.cfg.dev, rid, sid, synced, committed[synced:], drafts)
            ex = self.link.request(
                msg,
                lambda m, rid=rid: (
                    getattr(m, "rid", None) == rid
                    and isinstance(m, (wire.Verdict, wire.Resync, wire.Error))
                ),
                self.cfg.timeout_ms / 1000,
                self.cfg.retries,
            )
            if isinstance(ex.reply, wire.Resync):
                synced = min(synced, ex.reply.have)
                continue
            if isinstance(ex.reply, wire.Error):
                raise RuntimeError(f"server refused request {rid}: {ex.reply.reason}")
            return ex.reply, ex

    def run_problem(self, problem: dict[str, Any]) -> dict[str, Any]:
        """Generate an answer to one problem; write round records; return the request record."""
        cfg = self.cfg
        sid = str(problem["id"])
        committed = self.engine.tokenize(problem["prompt"])
        n_prompt = len(committed)
        synced = 0  # how many of `committed` the server holds
        out: list[int] = []
        verified = fallback = rounds = 0
        t_start = time.time()
        while True:
            t0 = time.time()
            drafts, _ = draft_tokens(self.drafter, committed, cfg.draft_len)
            draft_ms = (time.time() - t0) * 1000
            if not self.online:
                self.probe()
            verdict, ex = (None, None)
            if self.online:
                verdict, ex = self._verify(sid, committed, synced, drafts)
                if verdict is None:
                    self.online = False
                    self.last_probe = time.monotonic()
            if isinstance(verdict, wire.Verdict):
                emitted = drafts[: verdict.accepted] + [verdict.token]
                mode = "verified"
            else:
                emitted = drafts
                mode = "fallback"
            before = len(out)
            committed.extend(emitted)
            if mode == "verified":
                synced = len(committed)
            out, done = finish(out + emitted, self.engine.eos_id, cfg.max_new)
            n_new = len(out) - before
            if mode == "verified":
                verified += n_new
            else:
                fallback += n_new
            self.records.write(
                "rounds",
                {
                    "dev": cfg.dev,
                    "problem": sid,
                    "round": rounds,
                    "t_start": t0,
                    "t_end": time.time(),
                    "mode": mode,
                    "drafted": len(drafts),
                    "accepted": verdict.accepted if mode == "verified" else None,
                    "tokens": n_new,
                    "attempts": ex.attempts if ex else 0,
                    "rtt_ms": ex.rtt_ms if ex else None,
                    "waited_ms": ex.waited_ms if ex else 0.0,
                    "draft_ms": draft_ms,
                    "batch": verdict.batch if mode == "verified" else None,
                    "server_queue_ms": verdict.queue_ms if mode == "verified" else None,
                    "server_compute_ms": verdict.compute_ms if mode == "verified" else None,
                },
            )
            rounds += 1
            if done or self.stopping:
                break
        if self.online:
            self.link.send(wire.End(cfg.dev, sid, self.next_rid()))
        record = {
            "dev": cfg.dev,
            "problem": sid,
            "t_start": t_start,
            "t_end": time.time(),
            "prompt_tokens": n_prompt,
            "tokens": len(out),
            "verified_tokens": verified,
            "fallback_tokens": fallback,
            "rounds": rounds,
            "text": self.engine.detokenize(out),
            "reference": problem.get("reference"),
        }
        self.records.write("requests", record)
        return record

    def run(self, problems: list[dict[str, Any]]) -> int:
        """All problems in order; returns how many were answered."""
        self.handshake()
        done = 0
        for problem in problems:
            if self.stopping:
                break
            self.run_problem(problem)
            done += 1
        return done


def load_problems(path: Path) -> list[dict[str, Any]]:
    """Problems as JSON lines with keys id, prompt and (optionally) reference."""
    problems = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        for key in ("id", "prompt"):
            if key not in item:
                raise ValueError(f"{path}:{n}: problem lacks the key {key!r}")
        problems.append(item)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SLED device agent (draft model).")
    ap.add_argument("--server", type=parse_address, required=True, help="server HOST:PORT")
    ap.add_argument("--dev", required=True, help="this device's name")
    ap.add_argument("--model", required=True, help="draft model: .gguf (or HF folder)")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "llama"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--problems", type=Path, required=True, help="JSON lines: id, prompt")
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--timeout-ms", type=float, default=200.0)
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--probe-ms", type=float, default=200.0)
    args = ap.parse_args(argv)

    problems = load_problems(args.problems)
    engine = load_engine(args.model, kind=args.engine, threads=args.threads)
    cfg = DeviceConfig(
        args.dev, args.draft_len, args.timeout_ms, args.retries, args.max_new, args.probe_ms
    )
    link = ServerLink(args.server)
    t0 = time.time()
    with RecordWriter(args.records) as records:
        agent = DeviceAgent(engine, link, records, cfg)

        def stop(*_: object) -> None:
            agent.stopping = True

        signal.signal(signal.SIGTERM, stop)
        try:
            answered = agent.run(problems)
        except TokenizerMismatchError as exc:
            print(f"device {args.dev}: refused by the server: {exc}", file=sys.stderr)
            return 3
        t1 = time.time()
        status = {"dev": args.dev, "answered": answered, "t_start": t0, "t_end": t1,
                  "seconds": t1 - t0}  # fmt: skip
        (args.records / "status.json").write_text(json.dumps(status) + "\n")
    print(f"device {args.dev}: answered {answered}/{len(problems)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
