"""Python NFQUEUE packet holder: the fallback when the C holder cannot be compiled.

Same command line and behaviour as `holder.c`:

    python holder_py.py [--tag TAG] [--seed N] [--maxlen N] [--rt-prio N]
        QNUM:DELAY_US:JITTER_US ...

Runs as a standalone script (no `testbed` imports) inside the bridge namespace. Like the C
holder, it counts the hold from the packet's kernel arrival timestamp and arms its wake-ups early
by the running mean of its own lateness.
"""

from __future__ import annotations

import argparse
import collections
import random
import select
import signal
import socket
import sys
import time
from typing import Any

from testbed.netem.realtime import set_realtime

MAX_EARLY_NS = 1_000_000


class WakeLateness:
    """Running mean of how late releases happen; new dues are moved earlier by it."""

    def __init__(self) -> None:
        self.mean_ns = 0

    def update(self, late_ns: int) -> None:
        self.mean_ns = min(MAX_EARLY_NS, self.mean_ns + (late_ns - self.mean_ns) // 16)


def arrival_ns(pkt: Any, now: int) -> int:
    """Monotonic arrival time from the packet's kernel timestamp (`now` if absent/implausible)."""
    stamp = pkt.get_timestamp()
    if not stamp:
        return now
    at = int(stamp * 1e9) - (time.time_ns() - time.monotonic_ns())
    return at if 0 <= now - at <= 100_000_000 else now


class HeldQueue:
    """One bound queue: a FIFO of (due time, packet)."""

    def __init__(
        self, num: int, delay_us: int, jitter_us: int, rng: random.Random, late: WakeLateness
    ) -> None:
        self.num = num
        self.delay_ns = delay_us * 1000
        self.jitter_ns = jitter_us * 1000
        self.rng = rng
        self.late = late
        self.fifo: collections.deque[tuple[int, Any]] = collections.deque()
        self.last_due = 0
        self.n_in = self.n_out = 0

    def on_packet(self, pkt: Any) -> None:
        self.n_in += 1
        now = time.monotonic_ns()
        due = arrival_ns(pkt, now) + self.delay_ns - min(self.late.mean_ns, self.delay_ns)
        if self.jitter_ns:
            due += self.rng.randint(-self.jitter_ns, self.jitter_ns)
        due = max(due, self.last_due)  # FIFO: no reordering
        self.last_due = due
        self.fifo.append((due, pkt))

    def release(self, everything: bool = False) -> int | None:
        """Accept what is due; return the earliest due time still held."""
        now = time.monotonic_ns()
        while self.fifo and (everything or self.fifo[0][0] <= now):
            due, pkt = self.fifo.popleft()
            if not everything:
                self.late.update(now - due)
            pkt.accept()
            self.n_out += 1
        return self.fifo[0][0] if self.fifo else None


def parse_spec(text: str) -> tuple[int, int, int]:
    try:
        num, delay, jitter = (int(x) for x in text.split(":"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected QNUM:DELAY_US:JITTER_US, got {text!r}") from exc
    return num, delay, jitter


def main(argv: list[str] | None = None) -> int:
    from netfilterqueue import COPY_META, NetfilterQueue

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tag", default="")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--maxlen", type=int, default=65536)
    ap.add_argument("--rt-prio", type=int, default=0)
    ap.add_argument("queues", nargs="+", type=parse_spec)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    set_realtime(args.rt_prio)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stamps = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # kernel rx timestamps on
    stamps.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMP", 29), 1)
    late = WakeLateness()
    bound: list[tuple[Any, HeldQueue]] = []
    for num, delay, jitter in args.queues:
        held = HeldQueue(num, delay, jitter, rng, late)
        nfq = NetfilterQueue()
        nfq.bind(num, held.on_packet, max_len=args.maxlen, mode=COPY_META, sock_len=16 << 20)
        bound.append((nfq, held))
    by_fd = {nfq.get_fd(): nfq for nfq, _ in bound}
    print("ready", flush=True)
    sys.stdout.close()
    while not stop:
        dues = [d for _, h in bound if (d := h.release()) is not None]
        timeout = max(0.0, (min(dues) - time.monotonic_ns()) / 1e9) if dues else 0.5
        try:
            ready, _, _ = select.select(list(by_fd), [], [], timeout)
        except InterruptedError:
            continue
        for fd in ready:
            by_fd[fd].run(block=False)
    for nfq, held in bound:
        held.release(everything=True)
        print(f"queue={held.num} in={held.n_in} out={held.n_out} full=0", file=sys.stderr)
        nfq.unbind()
    return 0


if __name__ == "__main__":
    sys.exit(main())
