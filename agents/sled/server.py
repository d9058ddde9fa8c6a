"""SLED verification server: verifies the drafts of many devices in batched target forwards.

A single-threaded UDP loop. The first request to arrive opens a batch window of `window_ms`;
requests arriving within it (up to `max_batch`) are grouped by the batch strategy
(`batching`: arrival order, or best fit by length) and each group is verified in one
`score_batch` forward of the target; centralized requests (GENERATE) advance between
batches, one token per step (`centralized`). Sessions share one KV budget (`kv_pool`); a
VERIFY or GENERATE that does not fit is refused or waits in the pool's queue, by policy;
SIGUSR1 fills the pool (a fault: nothing opens or grows), SIGUSR2 empties it again.
Each (device, session) keeps its committed tokens and a tracked KV session; a repeated
request id is answered from the per-device reply cache without recomputing.

Hostile networks: every datagram must carry the lab key's tag; request ids must grow per
device (an older one is a replay; only authenticated datagrams move the counter, so a forged
id cannot silence a device); VERIFY and END must carry this process's epoch; requests are
checked against `guard.Limits` before they reach the engine. Each refusal is counted by
reason and answered with an Error only when the answer is no larger than the datagram (no
amplification); the counts are written to `refusals.jsonl` when the server stops.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import select
import signal
import socket
import sys
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from agents.emulation import clock
from agents.emulation.pacing import last_modelled_ms, pacing_rows
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.engines.base import Engine
from agents.engines.factory import load_engine
from agents.power import PowerSampler, detect_source
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.protocol.auth import LabKey, key_for_agent
from agents.records import RecordWriter
from agents.sled.batching import Shape, Strategy, padding_share, plan_groups
from agents.sled.centralized import ContinuousBatcher, first_token_ms
from agents.sled.kv_pool import KvPool, KvQueue, Policy, budget_tokens
from agents.sled.request_checks import (
    Limits,
    Refusals,
    check_generate,
    check_names,
    check_rid,
    check_verify,
)
from agents.sled.truncation import dropped_tokens, slide_step, window
from agents.spec.acceptance import verify
from agents.spec.confidence import ConfidenceBuckets
from agents.spec.session import TrackedSession
from agents.spec.sparse import dense_rows


@dataclass
class ServerSession:
    """The server's view of one device conversation."""

    tracked: TrackedSession
    committed: list[int] = field(default_factory=list)


@dataclass
class Pending:
    """A VERIFY waiting in the current batch, or a VERIFY or GENERATE waiting for room."""

    msg: wire.Verify | wire.Generate
    addr: tuple[str, int]
    arrived: float


@dataclass
class Planned:
    """An admitted VERIFY: its session, the committed sequence it implies, what to feed."""

    pending: Pending
    session: ServerSession
    committed: list[int]
    feed: list[int]
    dropped: int = 0  # committed tokens after BOS the target no longer sees (truncation)

    @property
    def msg(self) -> wire.Verify:
        return self.pending.msg


class VerificationServer:
    """Batches VERIFY requests from devices and answers with verdicts."""

    def __init__(
        self,
        engine: Engine,
        sock: socket.socket,
        key: LabKey,
        records: RecordWriter | None = None,
        max_batch: int = 16,
        window_ms: float = 2.0,
        max_sessions: int = 256,
        limits: Limits | None = None,
        pool: KvPool | None = None,
        strategy: Strategy = "arrival",
        seed: int | None = None,
        kv_queue: KvQueue[Pending] | None = None,
    ) -> None:
        """kv_queue: where VERIFYs and GENERATEs that do not fit the pool wait, in one line
        (the `queue` policy); None refuses them at once (the `refuse` policy)."""
        self.engine = engine
        engine.warm_up(max_batch)  # before the first device's round, whose timeout excludes compute
        self.sock = sock
        self.key = key
        self.records = records
        self.max_batch = max_batch
        self.window_s = window_ms / 1000
        self.max_sessions = max_sessions
        self.limits = limits or Limits(vocab_size=engine.vocab_size)
        if self.limits.truncate:
            slide_step(self.limits.max_seq_length, self.limits.max_draft)  # room for a window
        self.strategy = strategy
        self.rng = np.random.default_rng(seed)
        self.confidence = ConfidenceBuckets()
        self.batcher = ContinuousBatcher(engine, max_batch)
        self.pool = pool or KvPool(budget=max_sessions * self.limits.max_seq_length)
        self.kv_queue = kv_queue
        self.epoch = secrets.token_hex(8)
        self.sessions: OrderedDict[tuple[str, str], ServerSession] = OrderedDict()
        self.last_rid: dict[str, int] = {}  # device -> highest authenticated request id
        self.replies: dict[str, tuple[int, bytes]] = {}  # device -> (rid, reply bytes)
        self.refusals = Refusals()
        self.repeats = 0  # retries answered from the reply cache
        self.datagrams = 0  # every datagram received
        self.stopping = False
        self.batches = 0

    # -- datagram handling ---------------------------------------------------------------
    def _send(
        self, msg: wire.Message, addr: tuple[str, int], dev: str | None = None, copies: int = 1
    ) -> None:
        """Send msg (copies times: a lossy link loses all copies less often); remember the
        reply to dev's request, so a retry is answered without recomputing."""
        data = msg.encode(self.key)
        if dev is not None and hasattr(msg, "rid"):
            self.replies[dev] = (msg.rid, data)  # type: ignore[attr-defined]
        for _ in range(copies):
            self._sendto(data, addr)

    def _sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):  # an unreachable device retries; nothing to do
            self.sock.sendto(data, addr)

    def refuse(
        self, code: str, reason: str, addr: tuple[str, int], rid: int = -1, unauth_len: int = 0
    ) -> None:
        """Count a refusal and answer with an Error.

        An unauthenticated datagram (unauth_len > 0: its size) is answered only if the
        answer is no larger, so the server never amplifies a spoofed sender's traffic.
        """
        self.refusals[code] += 1
        reply = wire.Error(rid=rid, reason=reason[:160], code=code).encode(self.key)
        if not unauth_len or len(reply) <= unauth_len:
            self._sendto(reply, addr)

    def _fresh(self, dev: str, rid: int, addr: tuple[str, int]) -> bool:
        """Admit a request id that is newer than the device's last; answer a retry from cache.

        Called only for authenticated datagrams, so only the device can move its counter.
        """
        last = self.last_rid.get(dev)
        if last is not None and rid <= last:
            cached = self.replies.get(dev)
            if rid == last and cached is not None and cached[0] == rid:
                self.repeats += 1
                self._sendto(cached[1], addr)
            elif rid < last:
                self.refusals["replay"] += 1
            return False
        self.last_rid[dev] = rid
        return True

    def handle(self, data: bytes, addr: tuple[str, int], batch: list[Pending]) -> None:
        """Dispatch one datagram; VERIFY requests are queued into batch."""
        try:
            msg = wire.decode(data, self.key)
        except wire.ProtocolError as exc:
            self.refuse(exc.code, str(exc), addr, unauth_len=len(data))
            return
        if isinstance(msg, wire.Verify):
            problem = check_verify(msg, self.limits)
            if problem:
                self.refuse(problem, f"VERIFY refused: {problem}", addr, msg.rid)
            elif self._fresh(msg.dev, msg.rid, addr):
                if msg.epoch != self.epoch:
                    self._stale(msg.dev, msg.rid, addr)
                    return
                batch[:] = [p for p in batch if p.msg.dev != msg.dev]  # a newer rid supersedes
                pending = Pending(msg, addr, clock.monotonic())
                if self.kv_queue is not None and msg.dev in self.kv_queue.entries:
                    self.kv_queue.offer(msg.dev, pending, pending.arrived)  # keeps its place
                else:
                    batch.append(pending)
        elif isinstance(msg, wire.Generate):
            self._generate(msg, addr, batch)
        elif isinstance(msg, wire.Hello):
            problem = check_names(msg.dev) or check_rid(msg.rid)
            if problem:
                self.refuse(problem, f"HELLO refused: {problem}", addr, msg.rid)
            elif self._fresh(msg.dev, msg.rid, addr):
                self._hello(msg, addr)
        elif isinstance(msg, wire.Ping):
            if not (check_names(msg.dev) or check_rid(msg.rid)):
                self._sendto(wire.Pong(msg.rid).encode(self.key), addr)
            else:
                self.refusals["bad_name"] += 1
        elif isinstance(msg, wire.End):
            self._end(msg, addr)
        else:
            self.refusals["unexpected_kind"] += 1  # a reply kind sent to the server

    def _generate(self, msg: wire.Generate, addr: tuple[str, int], batch: list[Pending]) -> None:
        """Centralized mode: queue the prompt for continuous-batched generation. With a wait
        queue it goes through `verify_batch`'s admission, behind any request that waits."""
        problem = check_generate(msg, self.limits)
        key = (msg.dev, msg.sid)
        room = self.limits.max_seq_length - msg.max_new
        if not problem and len(msg.prompt) > room:  # truncate: BOS and the prompt's tail
            msg.prompt = window(msg.prompt, len(msg.prompt) - room)
        if problem:
            self.refuse(problem, f"GENERATE refused: {problem}", addr, msg.rid)
        elif not self._fresh(msg.dev, msg.rid, addr):
            return
        elif msg.epoch != self.epoch:
            self._stale(msg.dev, msg.rid, addr)
        elif self.batcher.has(key):
            self.refusals["already_generating"] += 1
            error = wire.Error(msg.rid, "already generating this session", "already_generating")
            self._send(error, addr, msg.dev)
        elif self.kv_queue is not None:
            batch[:] = [p for p in batch if p.msg.dev != msg.dev]  # a newer rid supersedes
            batch.append(Pending(msg, addr, clock.monotonic()))
        elif self._admit(key, len(msg.prompt) + msg.max_new):
            self.batcher.join(key, msg.rid, addr, msg.prompt, msg.max_new, msg.hold)
        else:
            self._no_room(Pending(msg, addr, clock.monotonic()), clock.monotonic())

    def _start_generation(self, p: Pending, since: float, waiting: bool) -> bool:
        """Admit a GENERATE from the wait line into the batcher, or leave it waiting; returns
        whether a request now waits (later sessions line up behind it)."""
        m = cast(wire.Generate, p.msg)
        key = (m.dev, m.sid)
        if waiting or not self._admit(key, len(m.prompt) + m.max_new):
            return self._no_room(p, since) or waiting
        self.batcher.join(key, m.rid, p.addr, m.prompt, m.max_new, m.hold)
        return waiting

    def generate_step(self) -> None:
        """One continuous-batching step of the centralized generations; answer finished ones."""
        t0 = clock.monotonic()
        try:
            finished, size = self.batcher.step()
        except Exception as exc:  # noqa: BLE001 - one bad step must not stop the server
            print(f"generation failed: {exc!r}", file=sys.stderr)
            for gen in [*self.batcher.running.values(), *self.batcher.waiting]:
                self.refusals["engine_error"] += 1
                error = wire.Error(gen.rid, f"generation failed: {exc}"[:160], "engine_error")
                self._send(error, gen.addr, gen.key[0])
                self.batcher.remove(gen.key)
                self.pool.release(gen.key)
            return
        t1 = clock.monotonic()
        for gen in finished:
            self.pool.release(gen.key)
            dev, sid = gen.key
            reply = wire.Result(gen.rid, sid, gen.out, gen.steps,
                                round(((gen.started or t0) - gen.arrived) * 1000, 3),
                                round((t1 - (gen.started or t0)) * 1000, 3),
                                first_token_ms(gen))  # fmt: skip
            self._send(reply, gen.addr, dev)
            if self.records:
                row = {"t": clock.now(), "dev": dev, "sid": sid, "tokens": len(gen.out),
                       "steps": gen.steps, "queue_ms": reply.queue_ms,
                       "gen_ms": reply.gen_ms}  # fmt: skip
                self.records.write("generations", row)
        if self.records:
            row = {"t": clock.now(), "batch": size, "finished": len(finished),
                   "compute_ms": (t1 - t0) * 1000,
                   "modelled_ms": last_modelled_ms(self.engine)}  # fmt: skip
            self.records.write("ar_steps", row)

    def _stale(self, dev: str, rid: int, addr: tuple[str, int]) -> None:
        reply = wire.Error(rid, "stale epoch: say HELLO again", code="stale_epoch")
        self.refusals["stale_epoch"] += 1
        self._send(reply, addr, dev)

    def _hello(self, msg: wire.Hello, addr: tuple[str, int]) -> None:
        ok = msg.tokenizer == self.engine.tokenizer_hash
        reason = ""
        if not ok:
            self.refusals["tokenizer_mismatch"] += 1
            reason = (
                f"tokenizer mismatch: device {msg.dev} drafts with tokenizer "
                f"{msg.tokenizer[:16]}, server target {self.engine.describe()} has "
                f"{self.engine.tokenizer_hash[:16]}"
            )
        ack = wire.HelloAck(msg.rid, ok, self.engine.tokenizer_hash, reason, self.epoch)
        self._send(ack, addr, msg.dev)

    def _end(self, msg: wire.End, addr: tuple[str, int]) -> None:
        if check_names(msg.dev, msg.sid) or check_rid(msg.rid):
            self.refusals["bad_name"] += 1
        elif not self._fresh(msg.dev, msg.rid, addr):
            return
        elif msg.epoch != self.epoch:
            self.refusals["stale_epoch"] += 1
        else:
            queued = self.kv_queue.entries.get(msg.dev) if self.kv_queue is not None else None
            if queued is not None and queued[0].msg.sid == msg.sid:
                self.kv_queue.discard(msg.dev)  # type: ignore[union-attr]
            elif (msg.dev, msg.sid) not in self.sessions:
                self.refusals["unknown_session"] += 1
            self.drop((msg.dev, msg.sid))

    def drop(self, key: tuple[str, str]) -> None:
        """Forget a session and free its cache and its share of the KV pool."""
        session = self.sessions.pop(key, None)
        self.pool.release(key)
        if session is not None:
            with contextlib.suppress(Exception):
                session.tracked.close()

    def expire_idle(self, keep: tuple[str, str] | None = None) -> None:
        """Drop sessions idle for longer than the pool's idle_s (all but `keep`)."""
        for key in self.pool.idle(clock.monotonic()):
            if key != keep:
                self.refusals["expired_idle"] += 1
                self.drop(key)  # type: ignore[arg-type]

    def _admit(self, key: tuple[str, str], tokens: int) -> bool:
        """Reserve `tokens` of the KV pool for key, expiring idle sessions if it must."""
        if not self.pool.fits(key, tokens):
            self.expire_idle(keep=key)
        if not self.pool.fits(key, tokens):
            return False
        self.pool.hold(key, tokens, clock.monotonic())
        return True

    def _session(self, dev: str, sid: str) -> ServerSession:
        key = (dev, sid)
        session = self.sessions.get(key)
        if session is None:
            while len(self.sessions) >= self.max_sessions:
                self.drop(next(iter(self.sessions)))
            session = ServerSession(TrackedSession(self.engine))
            self.sessions[key] = session
        self.sessions.move_to_end(key)
        return session

    # -- batched verification ------------------------------------------------------------
    def verify_batch(self, batch: list[Pending]) -> None:
        """Admit the queued, then the new requests; group them by the batch strategy, one
        forward per group."""
        t_start = clock.monotonic()
        plan: list[Planned] = []
        candidates = [(p, p.arrived) for p in batch]
        if self.kv_queue is not None:
            for p in self.kv_queue.timed_out(t_start):
                self.refusals["kv_queue_timeout"] += 1
                error = wire.Error(p.msg.rid, "KV pool queue: waited too long", "kv_queue_timeout")
                self._send(error, p.addr, p.msg.dev)
            candidates = [(p, since) for _, p, since in self.kv_queue.take_all()] + candidates
        waiting = False  # an earlier request waits for room: new sessions line up behind it
        for p, since in candidates:
            if isinstance(p.msg, wire.Generate):
                waiting = self._start_generation(p, since, waiting)
                continue
            m = p.msg
            key = (m.dev, m.sid)
            known = self.sessions.get(key)
            have = len(known.committed) if known else 0
            if m.pos > have:  # a session opens only with its full context
                self._send(wire.Resync(m.rid, m.sid, have), p.addr, m.dev)
                continue
            opening = key not in self.pool.tokens
            need = min(m.pos + len(m.ctx) + len(m.draft), self.limits.max_seq_length)
            if (waiting and opening) or not self._admit(key, need):
                waiting = self._no_room(p, since) or waiting
                continue
            session = self._session(m.dev, m.sid)
            committed = session.committed[: m.pos] + m.ctx
            if not committed:
                self.refusals["empty_context"] += 1
                error = wire.Error(m.rid, "empty context: send the prompt first", "empty_context")
                self._send(error, p.addr, m.dev)
                continue
            dropped = 0
            if self.limits.truncate:
                limit, longest = self.limits.max_seq_length, self.limits.max_draft
                dropped = dropped_tokens(len(committed), limit, longest)
            feed = session.tracked.prepare(window(committed, dropped))
            plan.append(Planned(p, session, committed, feed, dropped))
        shapes = [
            Shape(len(x.session.tracked.tokens), len(x.feed) + len(x.msg.draft)) for x in plan
        ]
        for group in plan_groups(shapes, self.strategy, self.max_batch):
            self._forward([plan[i] for i in group], padding_share([shapes[i] for i in group]),
                          t_start)  # fmt: skip

    def _no_room(self, p: Pending, since: float) -> bool:
        """A request that does not fit the pool: queue it (True) or refuse it (False)."""
        m = p.msg
        if self.kv_queue is not None and self.kv_queue.offer(m.dev, p, since):
            return True
        self.refusals["kv_pool_full"] += 1
        error = wire.Error(m.rid, "KV pool full: try again later", "kv_pool_full")
        self._send(error, p.addr, m.dev)
        return False

    def _forward(self, group: list[Planned], padding: float, t_start: float) -> None:
        """One target forward for the group's requests, then a verdict to each device."""
        t_forward = clock.monotonic()
        inputs = {x.session.tracked.sid: x.feed + x.msg.draft for x in group}
        try:
            logits = self.engine.score_batch(inputs)
        except Exception as exc:  # noqa: BLE001 - one bad batch must not stop the server
            self._engine_failed(group, exc)
            return
        compute_ms = (clock.monotonic() - t_forward) * 1000
        self.batches += 1
        for x in group:
            m, session = x.msg, x.session
            rows = logits[session.tracked.sid][len(x.feed) - 1 :]
            if m.temp > 0:  # speculative sampling with the device's own q
                q = dense_rows(m.q_ids, m.q_probs, rows.shape[-1])
                verdict = verify(rows, m.draft, m.temp, q, self.rng)
            else:
                verdict = verify(rows, m.draft)
            session.tracked.record_scored(x.feed + m.draft)
            session.tracked.truncate(len(x.committed) - x.dropped + verdict.accepted)
            session.committed = x.committed + verdict.emitted(m.draft)
            if m.conf:
                self.confidence.add(m.conf, verdict.accepted)
            self.pool.hold((m.dev, m.sid), len(session.tracked.tokens), clock.monotonic())
            queue_ms = (t_forward - x.pending.arrived) * 1000
            reply = wire.Verdict(
                m.rid,
                m.sid,
                verdict.accepted,
                verdict.token,
                len(session.committed),
                batch=len(group),
                queue_ms=round(queue_ms, 3),
                compute_ms=round(compute_ms, 3),
            )
            self._send(reply, x.pending.addr, m.dev, copies=m.copies)
            if self.records:
                self.records.write(
                    "verifications",
                    {
                        "t": clock.now(),
                        "dev": m.dev,
                        "rid": m.rid,
                        "sid": m.sid,
                        "drafted": len(m.draft),
                        "accepted": verdict.accepted,
                        "conf": m.conf,
                        "fed": len(x.feed) + len(m.draft),
                        "dropped": x.dropped,
                        "batch": len(group),
                        "queue_ms": queue_ms,
                        "compute_ms": compute_ms,
                    },
                )
        if self.records:
            self.records.write(
                "batches",
                {
                    "t": clock.now(),
                    "batch": len(group),
                    "strategy": self.strategy,
                    "tokens": sum(len(v) for v in inputs.values()),
                    "padding_share": padding,
                    "wait_ms": (t_forward - t_start) * 1000,
                    "kv_used": self.pool.used,
                    "kv_budget": self.pool.budget,
                    "kv_queued": len(self.kv_queue or ()),
                    "sessions": len(self.sessions),
                    "compute_ms": compute_ms,
                    "modelled_ms": last_modelled_ms(self.engine),
                },
            )

    def _engine_failed(self, group: list[Planned], exc: Exception) -> None:
        """Drop the group's sessions (their caches may be half-fed) and tell each device."""
        print(f"verification failed: {exc!r}", file=sys.stderr)
        for x in group:
            self.drop((x.msg.dev, x.msg.sid))
            self.refusals["engine_error"] += 1
            error = wire.Error(x.msg.rid, f"verification failed: {exc}"[:160], "engine_error")
            self._send(error, x.pending.addr, x.msg.dev)

    def _safe_handle(self, data: bytes, addr: tuple[str, int], batch: list[Pending]) -> None:
        """`handle`, counting (and logging) an unexpected error instead of dying of it."""
        try:
            self.handle(data, addr, batch)
        except Exception:  # noqa: BLE001 - no single datagram may stop the server
            self.refusals["internal_error"] += 1
            traceback.print_exc(file=sys.stderr)

    def write_refusals(self) -> None:
        """Append the refusal counts (cumulative, one record per reason) to the records."""
        if self.records:
            t = clock.now()
            for reason, count in self.refusals.snapshot().items():
                self.records.write("refusals", {"t": t, "reason": reason, "count": count})
            self.records.write("refusals", {"t": t, "reason": "repeat", "count": self.repeats})
            for row in self.confidence.rows():
                self.records.write("confidence", {"t": t, **row})

    def serve(self, until: float | None = None) -> None:
        """Serve until `stopping` is set (by a signal) or the monotonic deadline `until`."""
        self.sock.setblocking(False)
        while not self.stopping and (until is None or clock.monotonic() < until):
            wait = 0.0 if self.batcher.busy else 0.1
            ready, _, _ = select.select([self.sock], [], [], clock.to_real(wait))
            if not ready:
                if self.batcher.busy:
                    self.generate_step()
                else:
                    self.expire_idle()
                if self.kv_queue:
                    self.verify_batch([])
                continue
            batch: list[Pending] = []
            deadline = None
            while True:
                try:
                    data, addr = self.sock.recvfrom(wire.MAX_DATAGRAM)
                    self.datagrams += 1
                    self._safe_handle(data, addr, batch)
                    if batch and deadline is None:
                        deadline = clock.monotonic() + self.window_s
                    if len(batch) >= self.max_batch:
                        break
                except BlockingIOError:
                    if deadline is None:
                        break
                    left = deadline - clock.monotonic()
                    if left <= 0 or not select.select([self.sock], [], [], clock.to_real(left))[0]:
                        break
            if batch or self.kv_queue:
                self.verify_batch(batch)
            if self.batcher.busy:
                self.generate_step()
        self.write_refusals()


def kv_queue(policy: Policy, max_len: int, timeout_s: float) -> KvQueue[Pending] | None:
    """The wait queue the policy asks for (None: refuse at once)."""
    return KvQueue(max_len, timeout_s) if policy == "queue" else None


def build_parser() -> argparse.ArgumentParser:
    """The server's command line."""
    ap = argparse.ArgumentParser(description="SLED verification server (target model).")
    ap.add_argument("--bind", type=parse_address, required=True, help="HOST:PORT to listen on")
    ap.add_argument("--model", required=True, help="target model: HF folder or .gguf")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "llama"])
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", "--max_batch_size", type=int, default=16)
    ap.add_argument(
        "--batch-strategy", "--batch_strategy", choices=["arrival", "best_fit"], default="arrival"
    )
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--key-file", type=Path, required=True, help="the lab secret (one line)")
    ap.add_argument("--max-draft", type=int, default=64, help="longest draft accepted")
    ap.add_argument(
        "--max-seq-length",
        "--max_seq_length",
        type=int,
        help="longest session the target sees (prompt + output; default: the target's "
        "context, else 4096)",
    )
    ap.add_argument(
        "--max-seq-policy",
        "--max_seq_policy",
        choices=["truncate", "refuse"],
        default="truncate",
        help="a longer session: the target keeps BOS and the most recent tokens, or refuses",
    )
    ap.add_argument(
        "--prefill-chunk",
        "--prefill_chunk",
        type=int,
        help="feed a session's new tokens in chunks of at most this many (long contexts)",
    )
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--kv-cache-tokens", type=int, help="KV pool budget in cached tokens")
    budget.add_argument(
        "--kv-cache-mem",
        "--kv_cache_mem",
        type=float,
        help="KV pool budget as a fraction of the target device's memory",
    )
    ap.add_argument(
        "--kv-policy",
        "--kv_policy",
        choices=["refuse", "queue"],
        default="refuse",
        help="a VERIFY or GENERATE that does not fit the KV pool: refused at once, or queued "
        "(FIFO)",
    )
    ap.add_argument("--kv-queue-max", "--kv_queue_max", type=int, default=64)
    ap.add_argument("--kv-queue-timeout-s", "--kv_queue_timeout_s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, help="sampling: the verifier's random seed")
    ap.add_argument("--idle-s", type=float, default=120.0, help="expire sessions idle this long")
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    ap.add_argument("--ready-file", type=Path, help="touched once the server listens")
    add_emulation_option(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.kv_queue_max < 1 or args.kv_queue_timeout_s <= 0:
        ap.error("--kv-queue-max must be >= 1 and --kv-queue-timeout-s > 0")
    if args.prefill_chunk is not None and args.prefill_chunk < 1:
        ap.error("--prefill-chunk must be >= 1")

    emulation = start_emulation(ap, args.emulation)
    key = key_for_agent(args.key_file, "verification server")
    engine = load_engine(
        args.model, args.engine, args.device, args.threads, prefill_chunk=args.prefill_chunk
    )
    engine = emulation.engine(engine, "target")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(args.bind)
    t0 = clock.now()
    power = PowerSampler(args.records, detect_source())
    with RecordWriter(args.records) as records, power:
        max_seq = args.max_seq_length or getattr(engine, "max_positions", None) or 4096
        truncate = args.max_seq_policy == "truncate"
        limits = Limits(engine.vocab_size, args.max_draft, max_seq, truncate=truncate)
        tokens = args.kv_cache_tokens or 256 * max_seq
        if args.kv_cache_mem:
            per_token = getattr(engine, "kv_bytes_per_token", 0)
            tokens = budget_tokens(args.kv_cache_mem, args.device, per_token)
        pool = KvPool(budget=tokens, idle_s=args.idle_s)
        server = VerificationServer(
            engine, sock, key, records, args.max_batch, args.window_ms, limits=limits, pool=pool,
            strategy=args.batch_strategy, seed=args.seed,
            kv_queue=kv_queue(args.kv_policy, args.kv_queue_max, args.kv_queue_timeout_s),
        )  # fmt: skip

        def stop(*_: object) -> None:
            server.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGUSR1, lambda *_: pool.fill())  # a fault: the KV pool full
        signal.signal(signal.SIGUSR2, lambda *_: pool.drain())
        if args.ready_file:
            args.ready_file.write_text(f"{args.bind[0]}:{sock.getsockname()[1]}\n")
        print(f"verification server on {args.bind[0]}:{args.bind[1]} with {engine.describe()}")
        sys.stdout.flush()
        server.serve()
        power.stop()
        for row in pacing_rows({"target": engine}):
            records.write("pacing", row)
        t1 = clock.now()  # the status names no host: the controller knows it by the folder
        status = {"role": "server", "t_start": t0, "t_end": t1, "seconds": t1 - t0}
        (args.records / "status.json").write_text(
            json.dumps({**status, **power.summary.as_status()}) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
