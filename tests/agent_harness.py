"""Shared harness of the agent tests: a server thread, a lossy relay, problems, a device run.

The lab key here is a test constant; real labs generate one per lab.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from agents.protocol.auth import LabKey
from agents.records import RecordWriter, read_records
from agents.sled.device import DeviceAgent, DeviceConfig
from agents.sled.link import ServerLink
from agents.sled.server import VerificationServer
from agents.workloads.arithmetic import heldout_problems, prompt

KEY = LabKey(b"test-lab-secret-" * 4)


class ServerThread:
    """A VerificationServer on 127.0.0.1 served from a background thread."""

    def __init__(self, engine, records: Path, window_ms: float = 2.0, **kw) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.addr = self.sock.getsockname()
        self.records = RecordWriter(records)
        self.server = VerificationServer(
            engine, self.sock, KEY, self.records, window_ms=window_ms, **kw
        )
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.stopping = True
        self.thread.join(5)
        self.records.close()
        self.sock.close()


class UdpPeer:
    """A UDP socket on 127.0.0.1 served by a background thread calling `on_datagram`."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.addr = self.sock.getsockname()
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.running:
            try:
                data, addr = self.sock.recvfrom(65535)
            except (TimeoutError, OSError):
                continue
            self.on_datagram(data, addr)

    def on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.running = False
        self.thread.join(2)
        self.sock.close()


class Relay(UdpPeer):
    """Forwards between one client and the server; `lost(way)` ("up"/"down") drops one."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.client: tuple[str, int] | None = None
        super().__init__()

    def lost(self, way: str) -> bool:
        return False

    def on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr == self.server:
            if self.client and not self.lost("down"):
                self.sock.sendto(data, self.client)
        else:
            self.client = addr
            if not self.lost("up"):
                self.sock.sendto(data, self.server)


class LossyRelay(Relay):
    """Drops everything while `down` is set; `dropped` counts the datagrams it dropped."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.down = threading.Event()
        self.dropped = 0
        super().__init__(server)

    def lost(self, way: str) -> bool:
        if self.down.is_set():
            self.dropped += 1
            return True
        return False


def problems(n: int, seed: int = 5) -> list[dict]:
    return [
        {"id": p.id, "prompt": prompt(p), "reference": p.result}
        for p in heldout_problems(n, seed=seed)
    ]


def run_device(draft, addr, records: Path, items, dev="d1", **cfg) -> list[dict]:
    link = ServerLink(addr, KEY, bind=("127.0.0.1", 0))
    with RecordWriter(records) as writer:
        agent = DeviceAgent(draft, link, writer, DeviceConfig(dev, **cfg))
        agent.run(items)
    link.close()
    return read_records(records / "rounds.jsonl")


def run_past_the_limit(tmp_path: Path, target, draft_gguf: Path, room: int, truncate: bool):
    """One problem whose session outgrows a server limit of its prompt + `room` tokens (the
    server truncates or refuses past it); returns (server thread, the device's rounds)."""
    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.sled.request_checks import Limits

    items = problems(1, seed=3)
    n_prompt = len(target.tokenize(items[0]["prompt"]))
    limits = Limits(target.vocab_size, max_draft=8, max_seq_length=n_prompt + room,
                    truncate=truncate)  # fmt: skip
    srv = ServerThread(target, tmp_path / "server", limits=limits)
    try:
        draft = LlamaCppEngine(draft_gguf, n_threads=1)
        rounds = run_device(draft, srv.addr, tmp_path / "dev", items, max_new=40)
    finally:
        srv.stop()
    return srv, rounds


def assert_targets_greedy_output(target, folder: Path, items: list[dict], max_new: int) -> None:
    """Every request a device answered equals the target's own greedy output, all verified."""
    from agents.spec.decoding import generate_ad

    reqs = read_records(folder / "requests.jsonl")
    assert len(reqs) == len(items), folder
    for req in reqs:
        item = next(i for i in items if i["id"] == req["problem"])
        expected = generate_ad(target, target.tokenize(item["prompt"]), max_new).tokens
        assert req["ids"] == expected, (folder, item["id"])
        assert req["verified_tokens"] == req["tokens"] == len(expected)
