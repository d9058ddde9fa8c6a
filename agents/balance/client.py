"""A device's BALANCE users: each sends its request to the BALANCE server over the device's
own link at its arrival time and receives its answer streamed back over the same link.

    python -m agents.balance.client --server HOST:PORT --dev dev1 --users users.jsonl \\
        --records DIR --key-file lab.key [--start-at T] [--copies 2]

Each line of `--users` is one user: `uid`, `problem`, `prompt` (token ids), `output` (tokens
it wants), `deadline_s` (from its first send to its last token here) and `arrive_s` (after
`--start-at`, a wall-clock time of the lab's clock, so every device's users keep one
schedule). Every request is an authenticated ASK; it is sent again after a timeout that
follows the link's RTT until an ANSWER comes, and again whenever the answer stops growing, so
a lost request or answer costs time, not the user. ANSWERs carry the user's tokens so far, so
a lost one is repaired by the next. The device keeps measuring its link with PINGs (RTT and
loss, each request says what it knows) and records every user, whatever happened to it: done
(in time or late), refused by admission (with the reason), or unanswered when its deadline
has long passed: none is lost without a record.
"""

from __future__ import annotations

import argparse
import json
import math
import select
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.balance.network import ANSWER_EVERY_S
from agents.emulation import clock
from agents.emulation.settings import add_emulation_option, start_emulation
from agents.protocol import wire
from agents.protocol.address import parse_address
from agents.protocol.auth import LabKey, key_for_agent
from agents.protocol.datagram import send_copies
from agents.records import RecordWriter, read_records
from agents.sled.retry import AdaptiveTimeout

PING_EVERY_S = 0.5  # the link's RTT and loss are sampled this often
GIVE_UP_FACTOR = 3.0  # a user with no finished answer this many deadlines after it was sent
LOSS_ALPHA = 0.1  # weight of each ping in the loss estimate (EWMA)


@dataclass
class User:
    """One user of this device and what has happened to it so far (emulated seconds)."""

    uid: int
    problem: str
    prompt: list[int]
    output: int
    deadline_s: float
    arrive_s: float
    sent: float | None = None  # first send
    last_send: float = 0.0
    last_progress: float = 0.0  # the last send or answer that brought news
    attempts: int = 0
    tokens: list[int] = field(default_factory=list)
    first_token: float | None = None
    finished: float | None = None
    mode: str = ""
    reason: str = ""
    outcome: str = ""  # done, refused (admission), rejected (server checks), unanswered

    def record(self, dev: str, start: float) -> dict[str, Any]:
        """The user as the `balance_requests` table has it (times in seconds after `start`,
        the schedule's origin, on this device's clock)."""
        elapsed = None if self.finished is None or self.sent is None else self.finished - self.sent

        def rel(t: float | None) -> float | None:
            return None if t is None else t - start

        return {
            "dev": dev, "uid": self.uid, "problem": self.problem, "t_send": rel(self.sent),
            "t_first_token": rel(self.first_token), "t_done": rel(self.finished),
            "deadline_s": self.deadline_s, "outcome": self.outcome, "mode": self.mode,
            "reason": self.reason, "tokens": len(self.tokens), "ids": self.tokens,
            "attempts": self.attempts, "output": self.output,
            "met": bool(self.outcome == "done" and elapsed is not None
                        and elapsed <= self.deadline_s),
        }  # fmt: skip


class LinkEstimate:
    """What the device knows of its link: an RTT timer fed by PINGs, and the share of PINGs
    lost (per direction: a round trip survives with (1 - p)^2)."""

    def __init__(self) -> None:
        self.timer = AdaptiveTimeout(initial_ms=500.0, min_ms=20.0, max_ms=5000.0)
        self.round_trip_loss = 0.0
        self.pings: dict[int, float] = {}  # rid -> sent

    @property
    def srtt_s(self) -> float:
        return (self.timer.srtt_ms or 0.0) / 1000

    @property
    def loss(self) -> float:
        """Per-direction loss from the round trips lost."""
        return 1 - math.sqrt(max(0.0, 1 - self.round_trip_loss))

    def sent(self, rid: int, now: float) -> None:
        self.pings[rid] = now

    def answered(self, rid: int, now: float) -> None:
        sent = self.pings.pop(rid, None)
        if sent is not None:
            self.timer.observe((now - sent) * 1000)
            self.round_trip_loss *= 1 - LOSS_ALPHA

    def expire(self, now: float) -> None:
        """Pings older than the timeout count as lost."""
        for rid, sent in list(self.pings.items()):
            if now - sent > max(2 * self.timer.timeout_s(), 1.0):
                del self.pings[rid]
                self.round_trip_loss = (1 - LOSS_ALPHA) * self.round_trip_loss + LOSS_ALPHA


class BalanceClient:
    """Sends this device's users' requests at their times and follows their answers."""

    def __init__(self, dev: str, server: tuple[str, int], key: LabKey, users: list[User],
                 copies: int = 1) -> None:  # fmt: skip
        self.dev, self.server, self.key, self.copies = dev, server, key, copies
        self.users = {u.uid: u for u in users}
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.setblocking(False)
        self.link = LinkEstimate()
        self.rid = 0
        self.asked: dict[int, int] = {}  # request id -> the user it asked for
        self.next_ping = 0.0
        self.stopping = False

    def _send(self, msg: wire.Message, copies: int = 1) -> None:
        send_copies(self.sock, msg.encode(self.key), self.server, copies)

    def _ask(self, u: User, now: float) -> None:
        if u.sent is None:
            u.sent = now
        u.attempts += 1
        u.last_send = u.last_progress = now
        self.rid += 1
        self.asked[self.rid] = u.uid
        self._send(wire.Ask(
            self.dev, self.rid, u.uid, u.prompt, u.output, u.deadline_s * 1000,
            age_ms=(now - u.sent) * 1000, srtt_ms=self.link.srtt_s * 1000,
            loss=self.link.loss, copies=self.copies,
        ), self.copies)  # fmt: skip

    def _ping(self, now: float) -> None:
        self.rid += 1
        self.link.sent(self.rid, now)
        self._send(wire.Ping(self.dev, self.rid))
        self.next_ping = now + PING_EVERY_S

    def _receive(self, now: float) -> None:
        while True:
            try:
                data, _ = self.sock.recvfrom(wire.MAX_DATAGRAM)
            except OSError:  # nothing more queued (or an ICMP error: the next send retries)
                return
            try:
                msg = wire.decode(data, self.key)
            except wire.ProtocolError:
                continue
            if isinstance(msg, wire.Pong):
                self.link.answered(msg.rid, now)
            elif isinstance(msg, wire.Answer) and msg.uid in self.users:
                self._answered(self.users[msg.uid], msg, now)
            elif isinstance(msg, wire.Error) and msg.rid in self.asked:
                u = self.users[self.asked[msg.rid]]
                if not u.outcome:  # the server's checks refused the request itself
                    u.outcome, u.reason, u.finished = "rejected", msg.reason, now

    def _answered(self, u: User, msg: wire.Answer, now: float) -> None:
        if u.outcome:
            return
        u.last_progress = now  # any answer: the server has it and keeps in touch
        if msg.tokens and u.first_token is None:
            u.first_token = now
        if len(msg.tokens) >= len(u.tokens):
            u.tokens = list(msg.tokens)
        u.mode, u.reason = msg.mode, msg.reason or u.reason
        if msg.done:
            u.finished = now
            u.outcome = "refused" if msg.mode == "refused" else "done"

    def _due(self, u: User, now: float, start: float) -> float:
        """When user u next needs attention (a send or a give-up), on this device's clock."""
        if u.sent is None:
            return start + u.arrive_s
        rto = self.link.timer.timeout_s()
        wait = rto if not u.mode else rto + 2 * ANSWER_EVERY_S  # the server keeps in touch
        return min(u.last_progress + wait, u.sent + GIVE_UP_FACTOR * u.deadline_s + 1.0)

    def run(self, start: float, records: RecordWriter) -> int:
        """Serve every user from `start` (monotonic, emulated); returns how many finished."""
        while not self.stopping:
            now = clock.monotonic()
            open_users = [u for u in self.users.values() if not u.outcome]
            if not open_users:
                break
            if now >= self.next_ping:
                self._ping(now)
            self.link.expire(now)
            for u in open_users:
                if now < self._due(u, now, start):
                    continue
                if u.sent is not None and now >= u.sent + GIVE_UP_FACTOR * u.deadline_s + 1.0:
                    u.outcome = "unanswered"
                    u.reason = u.reason or f"no finished answer in {u.attempts} requests"
                else:
                    self._ask(u, now)
            nxt = min([self.next_ping] + [self._due(u, now, start) for u in open_users
                                           if not u.outcome])  # fmt: skip
            wait = max(0.0, nxt - clock.monotonic())
            if select.select([self.sock], [], [], clock.to_real(wait))[0]:
                self._receive(clock.monotonic())
        for u in self.users.values():
            records.write("balance_requests", u.record(self.dev, start))
        return sum(u.outcome == "done" for u in self.users.values())


def load_users(path: Path) -> list[User]:
    """The device's users (one JSON object a line); ValueError naming the line otherwise."""
    users = []
    for n, row in enumerate(read_records(path), 1):
        try:
            users.append(User(int(row["uid"]), str(row["problem"]), [int(t) for t in row["prompt"]],
                              int(row["output"]), float(row["deadline_s"]),
                              float(row["arrive_s"])))  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{n}: not a user ({exc!r})") from None
    return users


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="A device's BALANCE users (requests over its link).")
    ap.add_argument("--server", type=parse_address, required=True, help="BALANCE server HOST:PORT")
    ap.add_argument("--dev", required=True, help="this device's name")
    ap.add_argument("--users", type=Path, required=True, help="this device's users (JSON lines)")
    ap.add_argument("--records", type=Path, required=True, help="folder for record files")
    ap.add_argument("--key-file", type=Path, required=True, help="the lab secret (one line)")
    ap.add_argument("--start-at", type=float, help="lab wall-clock time the arrivals count from")
    ap.add_argument("--copies", type=int, default=1, choices=range(1, 5),
                    help="sends of each request, and of each answer asked for")  # fmt: skip
    add_emulation_option(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    start_emulation(ap, args.emulation)
    try:
        users = load_users(args.users)
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    client = BalanceClient(args.dev, args.server, key_for_agent(args.key_file, args.dev), users,
                           args.copies)  # fmt: skip

    def stop(*_: object) -> None:
        client.stopping = True

    signal.signal(signal.SIGTERM, stop)
    wait = 0.0 if args.start_at is None else max(0.0, args.start_at - clock.now())
    t0 = clock.now()
    with RecordWriter(args.records) as records:
        start = clock.monotonic() + wait
        done = client.run(start, records)
        t1 = clock.now()
        status = {"dev": args.dev, "answered": done, "t_start": t0, "t_end": t1,
                  "seconds": t1 - t0}  # fmt: skip
        (args.records / "status.json").write_text(json.dumps(status) + "\n")
    print(f"device {args.dev}: {done} of {len(users)} users answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
