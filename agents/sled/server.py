"""SLED verification server: verifies the drafts of many devices in batched target forwards.

A single-threaded UDP loop. The first request to arrive opens a batch window of `window_ms`;
requests arriving within it (up to `max_batch`) are verified together in one `score_batch`
forward of the target. Each (device, session) keeps its committed tokens and a tracked KV
session; a repeated request id is answered from the per-device reply cache without recomputing.
"""

from __future__ import annotations

import argparse
import contextlib
import select
import signal
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from agents.engines.base import Engine
from agents.engines.factory import load_engine
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.records import RecordWriter
from agents.spec.acceptance import verify
from agents.spec.session import TrackedSession


@dataclass
class ServerSession:
    """The server's view of one device conversation."""

    tracked: TrackedSession
    committed: list[int] = field(default_factory=list)


@dataclass
class Pending:
    """A VERIFY waiting in the current batch."""

    msg: wire.Verify
    addr: tuple[str, int]
    arrived: float


class VerificationServer:
    """Batches VERIFY requests from devices and answers with verdicts."""

    def __init__(
        self,
        engine: Engine,
        sock: socket.socket,
        records: RecordWriter | None = None,
        max_batch: int = 16,
        window_ms: float = 2.0,
        max_sessions: int = 256,
    ) -> None:
        self.engine = engine
        self.sock = sock
        self.records = records
        self.max_batch = max_batch
        self.window_s = window_ms / 1000
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[tuple[str, str], ServerSession] = OrderedDict()
        self.replies: dict[str, tuple[int, bytes]] = {}  # device -> (last rid, reply bytes)
        self.stopping = False
        self.batches = 0

    # -- datagram handling ---------------------------------------------------------------
    def _send(self, msg: wire.Message, addr: tuple[str, int], dev: str | None = None) -> None:
        data = msg.encode()
        if dev is not None and hasattr(msg, "rid"):
            self.replies[dev] = (msg.rid, data)  # type: ignore[attr-defined]
        self._sendto(data, addr)

    def _sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        with contextlib.suppress(OSError):  # an unreachable device retries; nothing to do
            self.sock.sendto(data, addr)

    def _cached(self, dev: str, rid: int, addr: tuple[str, int]) -> bool:
        """Answer a repeated request from the cache; True if it was a repeat (or stale)."""
        last = self.replies.get(dev)
        if last is None or rid > last[0]:
            return False
        if rid == last[0]:
            self._sendto(last[1], addr)
        return True

    def handle(self, data: bytes, addr: tuple[str, int], batch: list[Pending]) -> None:
        """Dispatch one datagram; VERIFY requests are queued into batch."""
        try:
            msg = wire.decode(data)
        except wire.ProtocolError as exc:
            self._send(wire.Error(rid=-1, reason=str(exc)), addr)
            return
        if isinstance(msg, wire.Verify):
            if self._cached(msg.dev, msg.rid, addr):
                return
            batch[:] = [p for p in batch if p.msg.dev != msg.dev]  # a newer rid supersedes
            batch.append(Pending(msg, addr, time.monotonic()))
        elif isinstance(msg, wire.Hello):
            self.replies.pop(msg.dev, None)  # a new incarnation of the device numbers afresh
            ok = msg.tokenizer == self.engine.tokenizer_hash
            reason = (
                ""
                if ok
                else (
                    f"tokenizer mismatch: device {msg.dev} drafts with tokenizer "
                    f"{msg.tokenizer[:16]}, server target {self.engine.describe()} has "
                    f"{self.engine.tokenizer_hash[:16]}"
                )
            )
            self._send(wire.HelloAck(msg.rid, ok, self.engine.tokenizer_hash, reason), addr)
        elif isinstance(msg, wire.Ping):
            self._send(wire.Pong(msg.rid), addr)
        elif isinstance(msg, wire.End):
            session = self.sessions.pop((msg.dev, msg.sid), None)
            if session is not None:
                session.tracked.close()

    def _session(self, dev: str, sid: str) -> ServerSession:
        key = (dev, sid)
        session = self.sessions.get(key)
        if session is None:
            while len(self.sessions) >= self.max_sessions:
                _, old = self.sessions.popitem(last=False)
                old.tracked.close()
            session = ServerSession(TrackedSession(self.engine))
            self.sessions[key] = session
        self.sessions.move_to_end(key)
        return session

    # -- batched verification ------------------------------------------------------------
    def verify_batch(self, batch: list[Pending]) -> None:
        """One target forward for every request in batch, then a verdict to each device."""
        t_start = time.monotonic()
        plan = []
        inputs: dict[int, list[int]] = {}
        for p in batch:
            m = p.msg
            session = self._session(m.dev, m.sid)
            if m.pos > len(session.committed):
                self._send(wire.Resync(m.rid, m.sid, len(session.committed)), p.addr, m.dev)
                continue
            committed = session.committed[: m.pos] + m.ctx
            if not committed:
                self._send(wire.Error(m.rid, "empty context: send the prompt first"), p.addr)
                continue
            feed = session.tracked.prepare(committed)
            inputs[session.tracked.sid] = feed + m.draft
            plan.append((p, session, committed, feed))
        if not plan:
            return
        logits = self.engine.score_batch(inputs)
        compute_ms = (time.monotonic() - t_start) * 1000
        self.batches += 1
        for p, session, committed, feed in plan:
            m = p.msg
            rows = logits[session.tracked.sid][len(feed) - 1 :]
            verdict = verify(rows, m.draft)
            session.tracked.record_scored(feed + m.draft)
            session.tracked.truncate(len(committed) + verdict.accepted)
            session.committed = committed + verdict.emitted(m.draft)
            queue_ms = (t_start - p.arrived) * 1000
            reply = wire.Verdict(
                m.rid,
                m.sid,
                verdict.accepted,
                verdict.token,
                len(session.committed),
                batch=len(plan),
                queue_ms=round(queue_ms, 3),
                compute_ms=round(compute_ms, 3),
            )
            self._send(reply, p.addr, m.dev)
            if self.records:
                self.records.write(
                    "verifications",
                    {
                        "t": time.time(),
                        "dev": m.dev,
                        "rid": m.rid,
                        "sid": m.sid,
                        "drafted": len(m.draft),
                        "accepted": verdict.accepted,
                        "fed": len(feed) + len(m.draft),
                        "batch": len(plan),
                        "queue_ms": queue_ms,
                        "compute_ms": compute_ms,
                    },
                )
        if self.records:
            self.records.write(
                "batches",
                {
                    "t": time.time(),
                    "batch": len(plan),
                    "tokens": sum(len(v) for v in inputs.values()),
                    "compute_ms": compute_ms,
                },
            )

    def serve(self, until: float | None = None) -> None:
        """Serve until `stopping` is set (by a signal) or the monotonic deadline `until`."""
        self.sock.setblocking(False)
        while not self.stopping and (until is None or time.monotonic() < until):
            ready, _, _ = select.select([self.sock], [], [], 0.1)
            if not ready:
                continue
            batch: list[Pending] = []
            deadline = None
            while True:
                try:
                    data, addr = self.sock.recvfrom(wire.MAX_DATAGRAM)
                    self.handle(data, addr, batch)
                    if batch and deadline is None:
                        deadline = time.monotonic() + self.window_s
                    if len(batch) >= self.max_batch:
                        break
                except BlockingIOError:
                    if deadline is None:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                        break
            if batch:
                self.verify_batch(batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SLED verification server (target model).")
    ap.add_argument("--bind", type=parse_address, required=True, help="HOST:PORT to listen on")
    ap.add_argument("--model", required=True, help="target model: HF folder or .gguf")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "llama"])
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    ap.add_argument("--ready-file", type=Path, help="touched once the server listens")
    args = ap.parse_args(argv)

    engine = load_engine(args.model, kind=args.engine, device=args.device, threads=args.threads)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(args.bind)
    with RecordWriter(args.records) as records:
        server = VerificationServer(engine, sock, records, args.max_batch, args.window_ms)

        def stop(*_: object) -> None:
            server.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        if args.ready_file:
            args.ready_file.write_text(f"{args.bind[0]}:{sock.getsockname()[1]}\n")
        print(f"verification server on {args.bind[0]}:{args.bind[1]} with {engine.describe()}")
        sys.stdout.flush()
        server.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
