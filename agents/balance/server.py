"""The BALANCE server: users' requests arrive from the devices over their links, and each is
served autoregressively (AD) or speculatively (SD) under a memory budget.

    python -m agents.balance.server --bind HOST:PORT --key-file lab.key --users N \\
        --cost cost-model.json --target DIR --draft DIR --policy hybrid \\
        --memory-bytes B --fixed-share S --period-s P --records DIR [--ready-file F]

A receiver thread answers PINGs at once and queues each authenticated ASK (checked against
the server's limits; a bad one is counted and refused with an ERROR, nothing else happens),
acknowledging it at once (an ANSWER with mode "received"), so the device's retry timer
follows the link's RTT, not the server's periods.
The main loop runs the scheduling periods of `agents.balance.serve.Serving` on the real
engines (`agents.balance.engine`, paced to the hardware the host stands for): at the top of a
period the requests that came in are offered to admission, each with what is left of its
deadline once the network's share is taken out (`agents.balance.network`, from the RTT and
loss its device measured); after it, every user whose tokens grew, who finished or was
refused gets an ANSWER with all its tokens so far (a user in service hears at least every
`ANSWER_EVERY_S`, so its device can tell silence from a lost answer). An ASK is idempotent per
(device, user): a repeated one (a retry) is answered with the user's latest state.

On SIGTERM it writes `served.jsonl` (one row per user that asked), `summary.json` (peak
memory held and reserved against the budget, refusals) and its `pacing` records.
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import resource
import signal
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agents.balance.costmodel import load_cost_model
from agents.balance.held_memory import MeasuredExecutor
from agents.balance.modes import MODE_NAMES, UNSERVED
from agents.balance.network import ANSWER_EVERY_S, server_deadline_s
from agents.balance.problem import Users, default_service
from agents.balance.serve import Serving
from agents.emulation import clock
from agents.emulation.pacing import pacing_rows
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.protocol.auth import LabKey, key_for_agent
from agents.protocol.datagram import send_copies
from agents.records import RecordWriter
from agents.sled.request_checks import MAX_COPIES, check_names, check_rid
from agents.steal import steal_ms

MAX_PROMPT = 2048  # tokens of one request's prompt
MAX_OUTPUT = 2048  # tokens one user may ask for
MAX_DEADLINE_MS = 3_600_000.0
RECEIVED = "received"  # the mode of the ANSWER that acknowledges an ASK on arrival


@dataclass(frozen=True)
class AskLimits:
    """What one ASK may ask for."""

    users: int  # user ids are 0..users-1
    vocab_size: int


def check_ask(msg: wire.Ask, limits: AskLimits) -> str | None:
    """The refusal code of an ASK that breaks a limit, or None."""
    problem = check_names(msg.dev) or check_rid(msg.rid)
    if problem:
        return problem
    if not 0 <= msg.uid < limits.users:
        return "unknown_user"
    if not 1 <= len(msg.prompt) <= MAX_PROMPT:
        return "bad_prompt"
    if any(not 0 <= t < limits.vocab_size for t in msg.prompt):
        return "token_out_of_vocab"
    if not 1 <= msg.output <= MAX_OUTPUT:
        return "bad_output"
    numbers = (msg.deadline_ms, msg.age_ms, msg.srtt_ms, msg.loss)
    if not all(math.isfinite(x) and x >= 0 for x in numbers):
        return "bad_timing"
    if not 0 < msg.deadline_ms <= MAX_DEADLINE_MS or msg.loss > 1:
        return "bad_timing"
    if not 1 <= msg.copies <= MAX_COPIES:
        return "bad_copies"
    return None


@dataclass
class Request:
    """One user as the server knows it (times on the server's executor clock)."""

    dev: str
    uid: int
    addr: tuple[str, int]
    rid: int
    copies: int
    arrived: float
    deadline_s: float  # the server's share of the user's deadline, from `arrived`
    told_srtt_ms: float
    told_loss: float
    asks: int = 1
    state: str = "new"  # new, served, refused, done
    reason: str = ""
    finished: float | None = None
    sent_tokens: int = -1  # tokens in the last ANSWER sent (-1: none sent yet)
    final_sent: bool = False
    last_sent: float = -math.inf
    resend: bool = False  # a repeated ASK: answer now, whatever changed

    def row(self, mode: str, tokens: list[int]) -> dict[str, Any]:
        """The user as `served.jsonl` has it."""
        met = self.finished is not None and self.finished - self.arrived <= self.deadline_s
        return {
            "dev": self.dev, "uid": self.uid, "mode": mode, "state": self.state,
            "admission": self.reason, "arrived_s": self.arrived,
            "server_deadline_s": self.deadline_s,
            "completion_s": None if self.finished is None else self.finished - self.arrived,
            "met_at_server": met, "asks": self.asks, "srtt_ms": self.told_srtt_ms,
            "loss": self.told_loss, "tokens": tokens,
        }  # fmt: skip


class BalanceServer:
    """The network side of the BALANCE server around one `Serving` (module docstring)."""

    def __init__(self, sock: socket.socket, key: LabKey, executor: MeasuredExecutor,
                 serving: Serving, limits: AskLimits) -> None:  # fmt: skip
        self.sock, self.key, self.executor, self.serving = sock, key, executor, serving
        self.limits = limits
        self.inbox: queue.Queue[tuple[wire.Ask, tuple[str, int], float]] = queue.Queue()
        self.woken = threading.Event()
        self.stopping = threading.Event()
        self.requests: dict[int, Request] = {}
        self.refusals: Counter[str] = Counter()
        self.answers_sent = 0

    # --- the receiver thread -----------------------------------------------------------------

    def receive_forever(self) -> None:
        """Answer PINGs, queue ASKs, refuse anything else (runs in its own thread)."""
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                data, addr = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                if self.stopping.is_set():
                    return
                continue
            self.handle(data, addr)

    def handle(self, data: bytes, addr: tuple[str, int]) -> None:
        """One datagram: never raises, whatever its bytes."""
        try:
            msg = wire.decode(data, self.key)
        except wire.ProtocolError as exc:
            self.refusals[exc.code] += 1
            return  # unauthenticated or malformed: dropped, never answered
        if isinstance(msg, wire.Ping):
            if check_names(msg.dev) or check_rid(msg.rid):
                self.refusals["bad_name"] += 1
            else:
                self._send(wire.Pong(msg.rid), addr)
        elif isinstance(msg, wire.Ask):
            problem = check_ask(msg, self.limits)
            if problem:
                self.refusals[problem] += 1
                self._send(wire.Error(msg.rid, f"ASK refused: {problem}", problem), addr)
            else:
                self.inbox.put((msg, addr, self.executor.clock()))
                self.woken.set()
                self._send(wire.Answer(msg.rid, msg.uid, [], False, RECEIVED), addr)
        else:
            self.refusals["unexpected_kind"] += 1

    def _send(self, msg: wire.Message, addr: tuple[str, int], copies: int = 1) -> None:
        send_copies(self.sock, msg.encode(self.key), addr, copies)

    # --- the main loop -----------------------------------------------------------------------

    def take_arrivals(self, now: float) -> None:
        """Offer the requests that came in to admission; a repeated ASK asks for a resend."""
        new: dict[int, tuple[int, int, float]] = {}
        at: dict[int, float] = {}
        while True:
            try:
                msg, addr, received = self.inbox.get_nowait()
            except queue.Empty:
                break
            req = self.requests.get(msg.uid)
            if req is not None:
                if req.dev != msg.dev:
                    self.refusals["user_of_another_device"] += 1
                    continue
                req.asks += 1
                req.addr, req.resend = addr, True
                continue
            deadline = server_deadline_s(msg.deadline_ms / 1000, msg.age_ms / 1000,
                                         msg.srtt_ms / 1000, msg.loss, msg.copies)  # fmt: skip
            self.requests[msg.uid] = Request(
                msg.dev, msg.uid, addr, msg.rid, msg.copies, received, deadline,
                msg.srtt_ms, msg.loss,
            )  # fmt: skip
            self.executor.submit(msg.uid, msg.prompt, msg.output)
            new[msg.uid] = (len(msg.prompt), msg.output, max(deadline, 1e-3))
            at[msg.uid] = received
        if not new:
            return
        for uid, decision in self.serving.arrive(list(new), now, at=at, lengths=new).items():
            req = self.requests[uid]
            req.reason = decision.reason
            req.state = "served" if decision.admitted else "refused"

    def tokens(self, uid: int) -> list[int]:
        user = self.executor.users.get(uid)
        return list(user.output) if user is not None else list(self.executor.outputs.get(uid, []))

    def mode_name(self, req: Request) -> str:
        if req.state == "refused":
            return "refused"
        return MODE_NAMES[int(self.serving.mode[req.uid])]

    def note_finished(self, finished: dict[int, float]) -> None:
        for uid, t in finished.items():
            self.requests[uid].finished = t
            self.requests[uid].state = "done"
        held = set(self.serving.loop.members) | set(self.serving.admission.holds)
        for req in self.requests.values():  # admitted with a wait whose window closed
            if req.state == "served" and req.uid not in held:
                req.state = "refused"
                req.reason += "; its start came too late to finish in time (dropped)"

    def answer(self, now: float) -> None:
        """ANSWER every user with news, due a keep-alive, or asking again; a final ANSWER
        (finished or refused) goes out once, in the user's copies, and again on a retry."""
        for req in self.requests.values():
            if req.final_sent and not req.resend:
                continue
            final = req.state in ("done", "refused")
            tokens = self.tokens(req.uid) if req.state != "refused" else []
            quiet = now - req.last_sent < ANSWER_EVERY_S
            if not (final or req.resend) and len(tokens) == req.sent_tokens and quiet:
                continue
            msg = wire.Answer(req.rid, req.uid, tokens, final, self.mode_name(req), req.reason)
            self._send(msg, req.addr, req.copies if final else 1)
            self.answers_sent += 1
            req.sent_tokens, req.final_sent = len(tokens), final
            req.last_sent, req.resend = now, False

    def run(self) -> None:
        """Serve until SIGTERM: periods while anyone is served, else wait for a request."""
        serving = self.serving
        while not self.stopping.is_set():
            now = self.executor.clock()
            self.take_arrivals(now)
            if serving.busy:
                self.note_finished(serving.period(now))
            else:
                self.note_finished({})
            self.answer(self.executor.clock())
            if not serving.busy:
                self.woken.clear()
                if self.inbox.empty():
                    self.woken.wait(clock.to_real(ANSWER_EVERY_S))
                serving.loop.rest()

    def rows(self) -> list[dict[str, Any]]:
        return [r.row(self.mode_name(r), self.tokens(r.uid)) for r in self.requests.values()]


def _peak_rss_bytes() -> int:
    """The most resident memory this process has held so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bind", type=parse_address, required=True, help="HOST:PORT to listen on")
    ap.add_argument("--key-file", type=Path, required=True, help="the lab secret (one line)")
    ap.add_argument("--users", type=int, required=True, help="user ids are 0..N-1")
    ap.add_argument("--cost", type=Path, required=True, help="cost-model JSON")
    ap.add_argument("--target", required=True, help="target HF folder")
    ap.add_argument("--draft", required=True, help="draft HF folder")
    ap.add_argument("--policy", required=True, choices=["ad-only", "sd-only", "hybrid"])
    ap.add_argument("--memory-bytes", type=float, required=True)
    ap.add_argument("--fixed-share", type=float, required=True)
    ap.add_argument("--period-s", type=float, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--records", type=Path, required=True, help="folder for the records")
    ap.add_argument("--ready-file", type=Path, help="written (HOST:PORT) once the server listens")
    add_emulation_option(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    emulation = start_emulation(ap, args.emulation)
    if args.users < 1:
        ap.error("--users: expected at least 1")
    key = key_for_agent(args.key_file, "BALANCE server")
    cost = load_cost_model(args.cost)
    target = emulation.engine(
        TorchEngine(args.target, device=args.device, threads=args.threads), "target"
    )
    draft = emulation.engine(
        TorchEngine(args.draft, device=args.device, threads=args.threads), "draft"
    )
    for engine in (target, draft):
        engine.warm_up(16)
    executor = MeasuredExecutor(target, draft, cost)
    blank = Users(np.zeros(args.users, dtype=int), np.ones(args.users, dtype=int),
                  np.ones(args.users))  # fmt: skip
    service = default_service(cost, args.fixed_share, args.period_s)
    serving = Serving(cost, blank, args.memory_bytes, service, executor, args.policy)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(args.bind)
    server = BalanceServer(sock, key, executor, serving,
                           AskLimits(args.users, target.vocab_size))  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    receiver = threading.Thread(target=server.receive_forever, name="receiver", daemon=True)
    receiver.start()
    rss_loaded = _peak_rss_bytes()
    steal_before = steal_ms()
    if args.ready_file:
        args.ready_file.write_text(f"{args.bind[0]}:{sock.getsockname()[1]}\n")
    server.run()
    receiver.join(timeout=2)
    steal_after = steal_ms()
    result = serving.result()
    with RecordWriter(args.records) as out:
        for row in pacing_rows({"target": target, "draft": draft}):
            out.write("pacing", row)
        for row in server.rows():
            out.write("served", row)
    summary = {
        "users_asked": len(server.requests),
        "refused": sum(r.state == "refused" for r in server.requests.values()),
        "unserved": int((result.mode[list(server.requests)] == UNSERVED).sum())
        if server.requests else 0,
        "peak_reserved_bytes": result.peak_memory_bytes,
        "sd_accepted": executor.accepted,
        "sd_rejections": executor.rejections,
        "peak_held_bytes": executor.peak_held_bytes,
        "memory_budget_bytes": args.memory_bytes,
        "rss_peak_bytes": _peak_rss_bytes(),
        "rss_loaded_bytes": rss_loaded,
        "ad_steps_per_s": service.ad_steps_per_s,
        "sd_rounds_per_s": service.sd_rounds_per_s,
        "most_behind_s": result.most_behind_s,
        "answers_sent": server.answers_sent,
        "refusals": dict(server.refusals),
        "steal_ms": None if None in (steal_before, steal_after) else steal_after - steal_before,
    }  # fmt: skip
    (args.records / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
