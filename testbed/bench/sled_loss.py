"""SLED under loss on loopback: verified-token throughput at 0, 5 and 10 % per-direction loss.

A relay on 127.0.0.1 holds every datagram for half the RTT in each direction and drops each
one with the requested probability (independently per direction, seeded), between real
device agents (llama.cpp draft) and a real verification server (torch target). Each loss
policy runs every loss level side by side, and the figure is each level's throughput as a
share of the same policy's 0 % throughput (goal: >= 95 % at 5 % and 10 %).

Policies: "fixed" is the SLED design's 200 ms timeout with 3 retries; "adaptive" follows the
measured RTT (SRTT + 4 RTTVAR); "redundant" adds a second copy of each VERIFY and verdict,
"redundant3" a third.
"""

from __future__ import annotations

import heapq
import random
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from agents.engines.base import Engine
from agents.protocol.auth import LabKey, new_key_text
from agents.records import RecordWriter, read_records
from agents.sled.device import DeviceAgent, DeviceConfig
from agents.sled.link import ServerLink
from agents.sled.server import VerificationServer
from agents.workloads.arithmetic import heldout_problems, prompt

POLICIES = {
    "fixed": {"timeout_policy": "fixed"},
    "adaptive": {"timeout_policy": "adaptive"},
    "redundant": {"timeout_policy": "adaptive", "copies": 2},
    "redundant3": {"timeout_policy": "adaptive", "copies": 3},
}


class DelayLossRelay:
    """UDP relay: every datagram is held one_way_s, and dropped with probability loss."""

    def __init__(self, server: tuple[str, int], one_way_s: float, loss: float, seed: int) -> None:
        self.server, self.one_way_s, self.loss = server, one_way_s, loss
        self.rng = random.Random(seed)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.001)
        self.addr = self.sock.getsockname()
        self.held: list[tuple[float, int, bytes, tuple[str, int]]] = []
        self.sent = self.dropped = 0
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        n = 0
        last_client: tuple[str, int] | None = None
        while self.running:
            now = time.monotonic()
            while self.held and self.held[0][0] <= now:
                _, _, data, dest = heapq.heappop(self.held)
                self.sock.sendto(data, dest)
            try:
                data, addr = self.sock.recvfrom(65535)
            except (TimeoutError, OSError):
                continue
            if addr == self.server:  # one device per relay: answers go back to it
                dest = last_client
            else:
                dest, last_client = self.server, addr
            if dest is None:
                continue
            self.sent += 1
            if self.rng.random() < self.loss:
                self.dropped += 1
                continue
            n += 1
            heapq.heappush(self.held, (time.monotonic() + self.one_way_s, n, data, dest))

    def stop(self) -> None:
        self.running = False
        self.thread.join(2)
        self.sock.close()


@dataclass
class LossFigure:
    policy: str
    loss: float
    verified_tokens: int
    fallback_tokens: int
    seconds: float
    datagrams_dropped: int
    datagrams: int

    @property
    def verified_tok_s(self) -> float:
        return self.verified_tokens / self.seconds


def run_condition(target: Engine, drafts: list[Engine], policy: str, loss: float,
                  problems: int, rtt_ms: float, seed: int) -> LossFigure:  # fmt: skip
    """One server and one device per draft engine, each behind its own lossy relay.

    The engines are loaded once by the caller (llama.cpp models are not loaded from several
    threads at once)."""
    devices = len(drafts)
    key = LabKey(new_key_text().strip().encode())
    tmp = Path(tempfile.mkdtemp(prefix="sled-loss-"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    records = RecordWriter(tmp / "server")
    server = VerificationServer(target, sock, key, records, window_ms=2.0)
    sthread = threading.Thread(target=server.serve, daemon=True)
    sthread.start()
    relays = [DelayLossRelay(sock.getsockname(), rtt_ms / 2000, loss, seed + i)
              for i in range(devices)]  # fmt: skip
    items = [
        [{"id": f"{i}-{p.id}", "prompt": prompt(p)} for p in heldout_problems(problems, seed + i)]
        for i in range(devices)
    ]

    def device(i: int) -> None:
        engine = drafts[i]
        link = ServerLink(relays[i].addr, key, bind=("127.0.0.1", 0))
        cfg = DeviceConfig(f"d{i}", max_new=48, **POLICIES[policy])  # type: ignore[arg-type]
        with RecordWriter(tmp / f"d{i}") as writer:
            DeviceAgent(engine, link, writer, cfg).run(items[i])
        link.close()

    threads = [threading.Thread(target=device, args=(i,)) for i in range(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.stopping = True
    sthread.join(5)
    records.close()
    sock.close()
    for r in relays:
        r.stop()
    reqs = [r for i in range(devices) for r in read_records(tmp / f"d{i}" / "requests.jsonl")]
    span = max(r["t_end"] for r in reqs) - min(r["t_start"] for r in reqs)
    return LossFigure(policy, loss, sum(r["verified_tokens"] for r in reqs),
                      sum(r["fallback_tokens"] for r in reqs), span,
                      sum(r.dropped for r in relays), sum(r.sent for r in relays))  # fmt: skip
