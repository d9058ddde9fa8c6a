"""SLED device agent: drafts tokens locally and has the edge server verify them.

Per round the device drafts `draft_len` tokens with its small model and sends them for
verification, waiting at most `timeout_ms` for the verdict and resending up to `retries`
times. If every attempt fails the link is declared down: the drafted tokens are emitted as
they are (marked unverified, "fallback") and the device keeps generating from its own model,
sending a HELLO probe every `probe_ms` without waiting for it. The first answer to a probe
brings the device back to verification; it then sends the tokens the server has not seen
as context, so the server's copy of the conversation catches up.

Options (`DeviceConfig`): adaptive draft length (`draft_length`), RTT-following timeouts
(`retry`), confidence stop, look-ahead while a verdict is in flight (`lookahead`), redundant
copies of each VERIFY, speculative sampling with sparse draft distributions, and the
centralized baseline (send the prompt, receive the target's tokens). In the device-only
mode the device never contacts a server: every round keeps its drafts (mode `local`), so the
answer is the draft model's own, all of it unverified (the 100 %-loss reference).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agents.emulation import clock
from agents.emulation.pacing import modelled_total_s, pacing_rows
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.engines.base import Engine, TokenizerMismatchError
from agents.engines.factory import load_engine
from agents.power import PowerSampler, detect_source
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.protocol.auth import key_for_agent
from agents.records import RecordWriter
from agents.sled.central_rounds import centralized_rounds
from agents.sled.device_config import DeviceConfigError, load_device_config
from agents.sled.draft_length import DraftLengthController
from agents.sled.link import ServerLink
from agents.sled.lookahead import LookAhead
from agents.sled.retry import AdaptiveTimeout, FixedTimeout, RetryPolicy
from agents.spec.confidence import confident_prefix
from agents.spec.decoding import draft_tokens, finish
from agents.spec.session import TrackedSession
from agents.spec.sparse import sparse_rows
from agents.workloads.request import answer_limit, answer_text, check_item, prompt_ids, stop_token

# the round falls back
RETRY_LATER = {"kv_pool_full", "kv_queue_timeout", "engine_error", "sequence_too_long"}
GENERATE_AGAIN = {"kv_pool_full", "kv_queue_timeout", "engine_error", "already_generating"}


@dataclass
class DeviceConfig:
    """Knobs of the device agent (defaults from the SLED design).

    draft_policy "fixed" drafts draft_len tokens per round; "adaptive" lets
    `DraftLengthController` choose within [draft_min, draft_max] toward target_acceptance.
    timeout_policy "fixed" waits timeout_ms per attempt; "adaptive" starts there and follows
    the measured RTT (`AdaptiveTimeout`) within [timeout_min_ms, timeout_max_ms]; "backoff" is
    "adaptive" that also doubles the wait on each unanswered attempt until a fresh sample.
    """

    dev: str
    draft_len: int = 4
    timeout_ms: float = 200.0
    retries: int = 3
    max_new: int = 64
    probe_ms: float = 200.0
    draft_policy: Literal["fixed", "adaptive"] = "fixed"
    draft_min: int = 3
    draft_max: int = 8
    target_acceptance: float = 0.75
    timeout_policy: Literal["fixed", "adaptive", "backoff"] = "fixed"
    timeout_min_ms: float = 20.0
    timeout_max_ms: float = 1000.0
    mode: Literal["sled", "centralized", "device-only"] = "sled"
    temperature: float = 0.0  # 0: greedy; > 0: speculative sampling (top_k-truncated drafts)
    top_k: int = 32
    min_confidence: float = 0.0  # stop drafting after a draft less probable than this
    copies: int = 1  # send each VERIFY this many times (and ask for as many verdicts)
    retry_confidence: float = 0.0  # > 0: a retry sends only the drafts at least this confident
    lookahead: int = 0  # greedy: draft up to this many tokens ahead while a verdict is pending
    seed: int | None = None
    generate_timeout_s: float = 300.0

    def retry_policy(self) -> RetryPolicy:
        if self.timeout_policy in ("adaptive", "backoff"):
            return AdaptiveTimeout(self.timeout_ms, self.timeout_min_ms, self.timeout_max_ms,
                                   backoff=self.timeout_policy == "backoff")  # fmt: skip
        return FixedTimeout(self.timeout_ms)

    def draft_controller(self) -> DraftLengthController | None:
        if self.draft_policy == "adaptive":
            return DraftLengthController(self.draft_min, self.draft_max, self.target_acceptance)
        return None


def request_record(dev: str, problem: dict[str, Any], t_start: float, t_end: float,
                   prompt_tokens: int, out: list[int], text: str, verified: int, fallback: int,
                   rounds: int) -> dict[str, Any]:  # fmt: skip
    """One answered problem, as the `requests` table has it (testbed RequestRecord)."""
    return {
        "dev": dev, "problem": str(problem["id"]), "t_start": t_start,
        "t_arrival": problem.get("t_arrival"), "t_end": t_end, "prompt_tokens": prompt_tokens,
        "tokens": len(out), "verified_tokens": verified, "fallback_tokens": fallback,
        "rounds": rounds, "text": text, "ids": out, "reference": problem.get("reference"),
        "asked_tokens": problem.get("max_new") if problem.get("hold") else None,
        "stands_for": problem.get("stands_for"),
    }  # fmt: skip


class DeviceAgent:
    """Runs problems one after another through draft -> verify (or fallback) rounds."""

    def __init__(
        self, engine: Engine, link: ServerLink | None, records: RecordWriter, cfg: DeviceConfig
    ) -> None:
        self.engine = engine
        self.link = link
        self.records = records
        self.cfg = cfg
        self.retry = cfg.retry_policy()
        self.rng = np.random.default_rng(cfg.seed)
        self.lengths = cfg.draft_controller()
        self.drafter = TrackedSession(engine)
        greedy_ahead = cfg.lookahead > 0 and cfg.temperature <= 0
        self.ahead = LookAhead(self.drafter, cfg.lookahead, engine.eos_id) if greedy_ahead else None
        self.carry: tuple[list[int], list[float]] = ([], [])  # look-ahead valid for next round
        self.rid = time.time_ns() // 1000  # increases across restarts of the agent
        self.online = False
        self.epoch = ""  # the server process's id, from its HELLO_ACK
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
        self.epoch = msg.epoch
        self.probe_rids.clear()
        return True

    def handshake(self) -> bool:
        """HELLO with the usual timeout and retries; False leaves the device in fallback."""
        hello = self._hello()
        ex = self.link.request(
            hello,
            lambda m: isinstance(m, wire.HelloAck) and m.rid == hello.rid,
            self.retry,
            self.cfg.retries,
        )
        self.last_probe = clock.monotonic()
        return self._accept_ack(ex.reply)

    def probe(self) -> None:
        """While offline: check for an answer to earlier probes; send a new one when due."""
        msg = self.link.poll(
            lambda m: isinstance(m, wire.HelloAck) and m.rid in self.probe_rids, 0.0
        )
        if self._accept_ack(msg):
            return
        if (clock.monotonic() - self.last_probe) * 1000 >= self.cfg.probe_ms:
            self.link.send(self._hello())
            self.last_probe = clock.monotonic()

    # -- one round -----------------------------------------------------------------------
    def _verify(self, sid: str, committed: list[int], synced: int, drafts: list[int],
                q: np.ndarray | None = None, conf: list[float] | None = None,
                n_retry: int | None = None):  # fmt: skip
        """Send drafts (and, when sampling, their q rows) for verification, resyncing if
        asked; a retry sends only the first `n_retry` drafts if given. Return (verdict,
        exchange)."""
        q_ids, q_probs = sparse_rows(q) if q is not None else ([], [])
        conf = [round(c, 6) for c in conf or []]
        while True:
            rid = self.next_rid()

            def verify(n: int, rid: int = rid, synced: int = synced) -> wire.Verify:
                return wire.Verify(
                    self.cfg.dev, rid, sid, synced, committed[synced:], drafts[:n], self.epoch,
                    self.cfg.temperature if q is not None else 0.0, q_ids[:n], q_probs[:n],
                    conf[:n], self.cfg.copies,
                )  # fmt: skip

            msg = verify(len(drafts))
            ex = self.link.request(
                msg,
                lambda m, rid=rid: (
                    getattr(m, "rid", None) == rid
                    and isinstance(m, (wire.Verdict, wire.Resync, wire.Error))
                ),
                self.retry,
                self.cfg.retries,
                idle=self.ahead.step if self.ahead else None,
                resend=verify(n_retry) if n_retry is not None else None,
            )
            if isinstance(ex.reply, wire.Resync):
                synced = min(synced, ex.reply.have)
                continue
            if isinstance(ex.reply, wire.Error) and ex.reply.code == "stale_epoch":
                if self.handshake():  # the server restarted: new epoch, then resync
                    continue
                return None, ex
            if isinstance(ex.reply, wire.Error) and ex.reply.code in RETRY_LATER:
                return None, ex  # this round falls back; the device probes and comes back
            if isinstance(ex.reply, wire.Error):
                raise RuntimeError(f"server refused request {rid}: {ex.reply.reason}")
            return ex.reply, ex

    def _retry_prefix(self, drafts: list[int], conf: list[float] | None) -> int | None:
        """How many drafts a retry carries (the confident prefix), if fewer than all."""
        if self.cfg.retry_confidence <= 0 or not conf:
            return None
        n = confident_prefix(conf, self.cfg.retry_confidence)
        return n if n < len(drafts) else None

    def _draft(self, committed: list[int], k: int, stop: int):
        """This round's drafts: first the look-ahead carried over, then fresh drafting (which
        ends at the stop token: EOS, or none for a held answer).

        Returns (drafts, q rows or None, confidences, how many came from the look-ahead)."""
        cfg = self.cfg
        reuse, reuse_conf = self.carry
        self.carry = ([], [])
        drafts, conf = list(reuse[:k]), list(reuse_conf[:k])
        low = next((i for i, c in enumerate(conf) if c < cfg.min_confidence), None)
        if low is not None:  # the confidence stop applies to carried drafts too
            drafts, conf = drafts[: low + 1], conf[: low + 1]
        used = len(drafts)
        if low is not None or (drafts and drafts[-1] == stop) or used == k:
            return drafts, None, conf, used
        more, q = draft_tokens(self.drafter, committed + drafts, k - used, cfg.temperature,
                               self.rng, cfg.top_k, conf, cfg.min_confidence, stop)  # fmt: skip
        return drafts + more, q, conf, used

    def run_problem(self, problem: dict[str, Any]) -> dict[str, Any]:
        """Generate an answer to one problem; write round records; return the request record."""
        cfg = self.cfg
        sid = str(problem["id"])
        committed = prompt_ids(self.engine, problem)
        n_prompt = len(committed)
        stop, max_new = stop_token(self.engine, problem), answer_limit(problem, cfg.max_new)
        synced = 0  # how many of `committed` the server holds
        self.carry = ([], [])  # look-ahead of another problem's last round is not ours
        if self.ahead:
            self.ahead.stop_id = stop
        out: list[int] = []
        verified = fallback = rounds = 0
        t_start = clock.now()
        while True:
            t0 = clock.now()
            k = self.lengths.current if self.lengths else cfg.draft_len
            timeout_ms = self.retry.timeout_ms
            modelled_before = modelled_total_s(self.engine)
            drafts, q, conf, used = self._draft(committed, k, stop)
            draft_ms = (clock.now() - t0) * 1000
            modelled_after = modelled_total_s(self.engine)
            draft_modelled_ms = (
                None if modelled_after is None else (modelled_after - modelled_before) * 1000
            )
            if not self.online and self.link is not None:
                self.probe()
            verdict, ex = (None, None)
            if self.ahead:
                self.ahead.start(committed + drafts)
            n_retry = self._retry_prefix(drafts, conf)
            if self.online:
                verdict, ex = self._verify(sid, committed, synced, drafts, q, conf, n_retry)
                if verdict is None:
                    self.online = False
                    self.last_probe = clock.monotonic()
            ahead = len(self.ahead.tokens) if self.ahead else 0
            if self.ahead:
                v = isinstance(verdict, wire.Verdict)
                self.carry = self.ahead.kept(v, v and verdict.accepted == len(drafts),
                                             verdict.token if v else -1)  # fmt: skip
                self.ahead.start([])
            retry_drafts = n_retry if ex is not None and ex.attempts > 1 else None
            if isinstance(verdict, wire.Verdict):
                emitted = drafts[: verdict.accepted] + [verdict.token]
                mode = "verified"
                judged = len(drafts)
                if retry_drafts is not None and verdict.accepted <= retry_drafts:
                    judged = retry_drafts  # most likely the prefix's verdict (else a cached one)
                if self.lengths:
                    self.lengths.observe(verdict.accepted, judged)
            else:
                emitted = drafts
                mode = "fallback" if self.link is not None else "local"
            before = len(out)
            committed.extend(emitted)
            if mode == "verified":
                synced = len(committed)
            out, done = finish(out + emitted, stop, max_new)
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
                    "t_end": clock.now(),
                    "mode": mode,
                    "draft_len": k,
                    "drafted": len(drafts),
                    "conf": conf,
                    "lookahead_used": used,
                    "lookahead_drafted": ahead,
                    "lookahead_kept": len(self.carry[0]),
                    "timeout_ms": timeout_ms,
                    "accepted": verdict.accepted if mode == "verified" else None,
                    "tokens": n_new,
                    "attempts": ex.attempts if ex else 0,
                    "retry_drafts": retry_drafts,
                    "rtt_ms": ex.rtt_ms if ex else None,
                    "waited_ms": ex.waited_ms if ex else 0.0,
                    "draft_ms": draft_ms,
                    "draft_modelled_ms": draft_modelled_ms,
                    "batch": verdict.batch if mode == "verified" else None,
                    "server_queue_ms": verdict.queue_ms if mode == "verified" else None,
                    "server_compute_ms": verdict.compute_ms if mode == "verified" else None,
                },
            )
            rounds += 1
            if done or self.stopping:
                break
        if self.online:
            self.link.send(wire.End(cfg.dev, sid, self.next_rid(), self.epoch))
        record = request_record(cfg.dev, problem, t_start, clock.now(), n_prompt, out,
                                answer_text(self.engine, out), verified, fallback,
                                rounds)  # fmt: skip
        self.records.write("requests", record)
        return record

    def run_centralized(self, problem: dict[str, Any]) -> dict[str, Any]:
        """Centralized baseline: send the prompt, the server's target generates every token.

        The GENERATE is resent every retry timeout (the server ignores a repeat while it is
        still generating and answers it from its cache once done) until `generate_timeout_s`.
        """
        cfg = self.cfg
        sid = str(problem["id"])
        prompt = prompt_ids(self.engine, problem)
        max_new, hold = answer_limit(problem, cfg.max_new), stop_token(self.engine, problem) < 0
        t_start = clock.now()
        reply: wire.Message | None = None
        attempts = 0
        if not self.online:
            self.handshake()
        while self.online and clock.now() - t_start < cfg.generate_timeout_s and not self.stopping:
            rid = self.next_rid()
            msg = wire.Generate(cfg.dev, rid, sid, prompt, max_new, self.epoch, hold)
            while clock.now() - t_start < cfg.generate_timeout_s and not self.stopping:
                self.link.send(msg)
                attempts += 1
                reply = self.link.poll(
                    lambda m, rid=rid: (
                        getattr(m, "rid", None) == rid and isinstance(m, (wire.Result, wire.Error))
                    ),
                    self.retry.timeout_s(),
                )
                if reply is not None:
                    break
            if isinstance(reply, wire.Error) and reply.code == "stale_epoch":
                self.handshake()
                continue
            if isinstance(reply, wire.Error) and reply.code in GENERATE_AGAIN:
                clock.sleep(cfg.probe_ms / 1000)
                continue
            break
        if isinstance(reply, wire.Error) and reply.code == "sequence_too_long":
            reply = None  # recorded as an unanswered request: the server cannot take it
        if isinstance(reply, wire.Error):
            raise RuntimeError(f"server refused {sid}: {reply.reason}")
        out = reply.tokens if isinstance(reply, wire.Result) else []
        t_end = clock.now()
        first = {"attempts": attempts, "waited_ms": (t_end - t_start) * 1000,
                 "server_queue_ms": getattr(reply, "queue_ms", None),
                 "server_compute_ms": getattr(reply, "gen_ms", None)}  # fmt: skip
        decode_ms = (
            reply.gen_ms - reply.first_ms
            if isinstance(reply, wire.Result) and reply.first_ms > 0
            else None
        )
        for row in centralized_rounds(cfg.dev, sid, t_start, t_end, len(out), decode_ms, first):
            self.records.write("rounds", row)
        record = request_record(cfg.dev, problem, t_start, t_end, len(prompt), out,
                                answer_text(self.engine, out), len(out), 0, 1)  # fmt: skip
        self.records.write("requests", record)
        return record

    def run(self, problems: list[dict[str, Any]]) -> int:
        """All problems in order; returns how many were answered."""
        self.engine.warm_up()  # lazy set-up must not land on (and be paced in) the first round
        if self.link is not None:
            self.handshake()
        done = 0
        t0 = clock.now()
        for problem in problems:
            if self.stopping:
                break
            if problem.get("arrive_s") is not None:  # open-loop arrivals (Poisson)
                problem = {**problem, "t_arrival": t0 + float(problem["arrive_s"])}
                clock.sleep(max(0.0, problem["t_arrival"] - clock.now()))
            if self.cfg.mode == "centralized":
                self.run_centralized(problem)
            else:
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
        check_item(item, f"{path}:{n}")
        problems.append(item)
    return problems


def build_parser() -> argparse.ArgumentParser:
    """The device agent's command line."""
    ap = argparse.ArgumentParser(description="SLED device agent (draft model).")
    ap.add_argument("--server", type=parse_address, help="server HOST:PORT (not device-only)")
    ap.add_argument("--dev", required=True, help="this device's name")
    ap.add_argument("--model", help="draft model: .gguf (or HF folder); or draft_model in --config")
    ap.add_argument("--config", type=Path, help="device config file (JSON/YAML, the seed's shape)")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "llama"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--problems", type=Path, required=True, help="JSON lines: id, prompt")
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    ap.add_argument("--key-file", type=Path, help="the lab secret, one line (not device-only)")
    ap.add_argument("--draft-len", type=int, default=4)
    ap.add_argument("--timeout-ms", type=float, default=200.0)
    ap.add_argument("--retries", type=int, default=3)
    ap.add_argument("--draft-policy", choices=["fixed", "adaptive"], default="fixed")
    ap.add_argument("--draft-min", type=int, default=3)
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--target-acceptance", type=float, default=0.75)
    ap.add_argument("--timeout-policy", choices=["fixed", "adaptive", "backoff"], default="fixed")
    ap.add_argument("--timeout-min-ms", type=float, default=20.0)
    ap.add_argument("--timeout-max-ms", type=float, default=1000.0)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=32, help="sampling: draft from the top k")
    ap.add_argument("--seed", type=int, help="sampling: the drafter's random seed")
    ap.add_argument(
        "--lookahead",
        type=int,
        default=0,
        help="greedy: draft up to this many tokens ahead while a verdict is in flight",
    )
    ap.add_argument(
        "--copies",
        type=int,
        default=1,
        choices=range(1, 5),
        help="redundant sends of each VERIFY and its verdict (survives loss at p**copies)",
    )
    ap.add_argument(
        "--retry-confidence",
        type=float,
        default=0.0,
        help="a retry sends only the leading drafts at least this confident (0: all of them)",
    )
    ap.add_argument(
        "--min-confidence",
        type=float,
        default=0.0,
        help="stop drafting after a draft token less probable than this",
    )
    ap.add_argument(
        "--mode",
        choices=["sled", "centralized", "device-only"],
        default="sled",
        help="centralized: send only the prompt; the server's target generates every token; "
        "device-only: the draft alone, no server (no --server, no --key-file)",
    )
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--probe-ms", type=float, default=200.0)
    add_emulation_option(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.config:  # the file's settings become defaults; flags given explicitly win
        try:
            ap.set_defaults(**load_device_config(args.config))
        except DeviceConfigError as exc:
            ap.error(str(exc))
        args = ap.parse_args(argv)
    if not args.model:
        ap.error("a draft model is needed: --model, or draft_model in --config")
    if args.mode != "device-only" and not (args.server and args.key_file):
        ap.error(f"--mode {args.mode} needs --server and --key-file")

    emulation = start_emulation(ap, args.emulation)
    link = None  # device-only: no server, no network
    if args.mode != "device-only":
        link = ServerLink(args.server, key_for_agent(args.key_file, f"device {args.dev}"))
    problems = load_problems(args.problems)
    engine = emulation.engine(
        load_engine(args.model, kind=args.engine, threads=args.threads), "draft"
    )
    cfg = DeviceConfig(
        args.dev, args.draft_len, args.timeout_ms, args.retries, args.max_new, args.probe_ms,
        args.draft_policy, args.draft_min, args.draft_max, args.target_acceptance,
        args.timeout_policy, args.timeout_min_ms, args.timeout_max_ms, args.mode,
        temperature=args.temperature, top_k=args.top_k, seed=args.seed,
        min_confidence=args.min_confidence, copies=args.copies, lookahead=args.lookahead,
        retry_confidence=args.retry_confidence,
    )  # fmt: skip
    t0 = clock.now()
    power = PowerSampler(args.records, detect_source())
    with RecordWriter(args.records) as records, power:
        agent = DeviceAgent(engine, link, records, cfg)

        def stop(*_: object) -> None:
            agent.stopping = True

        signal.signal(signal.SIGTERM, stop)
        try:
            answered = agent.run(problems)
        except TokenizerMismatchError as exc:
            print(f"device {args.dev}: refused by the server: {exc}", file=sys.stderr)
            return 3
        t1 = clock.now()
        power.stop()
        for row in pacing_rows({"draft": engine}):
            records.write("pacing", {"dev": args.dev, **row})
        status = {"dev": args.dev, "answered": answered, "t_start": t0, "t_end": t1,
                  "seconds": t1 - t0, **power.summary.as_status()}  # fmt: skip
        (args.records / "status.json").write_text(json.dumps(status) + "\n")
    print(f"device {args.dev}: answered {answered}/{len(problems)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
