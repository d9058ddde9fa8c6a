"""Device adaptation: PID draft length and the RTT-following retry timeout."""

from __future__ import annotations

import threading
import time

import pytest
from agent_harness import (
    KEY,
    Relay,
    ServerThread,
    UdpPeer,
    assert_targets_greedy_output,
    problems,
    run_device,
)

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.sled.draft_length import DraftLengthController
from agents.sled.link import ServerLink
from agents.sled.retry import AdaptiveTimeout, FixedTimeout


def run_rounds(ctl: DraftLengthController, rate: float, rounds: int) -> list[int]:
    """Feed rounds in which a fraction `rate` of each draft is accepted; return the lengths."""
    lengths = []
    for _ in range(rounds):
        k = ctl.current
        lengths.append(ctl.observe(round(rate * k), k))
    return lengths


def test_falling_acceptance_shortens_drafts_and_rising_lengthens_them():
    ctl = DraftLengthController()  # 3..8, target 0.75
    high = run_rounds(ctl, 1.0, 20)
    assert high[-1] == 8 and high == sorted(high)  # all accepted: grows to the maximum
    low = run_rounds(ctl, 0.25, 30)
    assert low[-1] == 3 and low[0] > low[-1]  # acceptance falls: length falls to the minimum
    assert ctl.acceptance() == pytest.approx(0.25, abs=0.1)
    again = run_rounds(ctl, 1.0, 30)
    assert again[-1] == 8


def test_acceptance_at_target_holds_the_length():
    ctl = DraftLengthController(min_len=1, max_len=16, target_acceptance=0.5)
    start = ctl.current
    lengths = [ctl.observe(a, 8) for a in [4] * 20]  # exactly 0.5 every round
    assert set(lengths) == {start}


def test_bad_controller_settings_are_refused():
    with pytest.raises(ValueError, match="min <= max"):
        DraftLengthController(min_len=5, max_len=3)
    with pytest.raises(ValueError, match="target acceptance"):
        DraftLengthController(target_acceptance=1.5)


def test_adaptive_timeout_follows_the_rtt_within_bounds():
    policy = AdaptiveTimeout(initial_ms=200, min_ms=20, max_ms=1000)
    assert policy.timeout_ms == 200  # nothing measured yet
    for _ in range(50):
        policy.observe(85.0)
    assert 85.0 <= policy.timeout_ms < 90.0  # SRTT -> 85, RTTVAR -> 0
    for rtt in [85.0, 140.0] * 20:  # jitter widens the margin
        policy.observe(rtt)
    assert policy.timeout_ms > 140.0
    for _ in range(50):
        policy.observe(5000.0)
    assert policy.timeout_ms == 1000  # capped
    for _ in range(200):
        policy.observe(1.0)
    assert policy.timeout_ms == 20  # floored
    assert FixedTimeout(200).timeout_s() == 0.2


def test_a_backoff_timeout_doubles_on_each_expiry_until_a_fresh_sample():
    """RFC 6298 5.5: each unanswered attempt doubles the wait (up to the ceiling); the next
    first-attempt sample brings it back to SRTT + 4 RTTVAR. Without back-off it stays put."""
    policy = AdaptiveTimeout(initial_ms=200, min_ms=20, max_ms=1000, backoff=True)
    policy.observe(10.0)  # the HELLO's round trip: 10 + 4 * 5 = 30 ms
    assert policy.timeout_ms == 30.0
    policy.expired()
    policy.expired()
    assert policy.timeout_ms == 120.0
    for _ in range(10):
        policy.expired()
    assert policy.timeout_ms == 1000  # capped
    policy.observe(40.0)  # a verification answered on its first attempt
    assert policy.timeout_ms == pytest.approx(0.875 * 10 + 0.125 * 40 + 4 * (0.75 * 5 + 0.25 * 30))
    plain = AdaptiveTimeout(initial_ms=200, min_ms=20, max_ms=1000)
    plain.observe(10.0)
    plain.expired()
    assert plain.timeout_ms == 30.0
    fixed = FixedTimeout(200)
    fixed.expired()
    assert fixed.timeout_s() == 0.2


class DelayedPong(UdpPeer):
    """Answers each PING after delay_s; drops the first `drop` PINGs it sees."""

    def __init__(self, delay_s: float, drop: int = 0) -> None:
        self.delay_s, self.drop, self.seen = delay_s, drop, 0
        super().__init__()

    def on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        self.seen += 1
        if self.seen > self.drop:
            msg = wire.decode(data, KEY)
            time.sleep(self.delay_s)
            self.sock.sendto(wire.Pong(msg.rid).encode(KEY), addr)


def test_the_link_backs_off_after_an_unanswered_attempt():
    """A dropped first PING: the link tells the policy, whose next wait is twice as long; the
    retried exchange gives no sample (Karn), so the back-off stays for the next exchange."""
    peer = DelayedPong(0.0, drop=1)
    link = ServerLink(peer.addr, KEY, bind=("127.0.0.1", 0))
    policy = AdaptiveTimeout(initial_ms=100, min_ms=10, max_ms=1000, backoff=True)
    try:
        ex = link.request(wire.Ping("d1", 1), lambda m: isinstance(m, wire.Pong), policy, 3)
        assert ex.attempts == 2 and policy.srtt_ms is None
        assert policy.timeout_ms == 200
    finally:
        link.close()
        peer.stop()


def test_the_link_feeds_first_attempt_rtts_to_the_policy_only():
    """Karn's rule: a retried exchange is no RTT sample."""
    peer = DelayedPong(0.03, drop=1)
    link = ServerLink(peer.addr, KEY, bind=("127.0.0.1", 0))
    policy = AdaptiveTimeout(initial_ms=150, min_ms=10, max_ms=1000)
    try:

        def pong(rid):
            return lambda m: isinstance(m, wire.Pong) and m.rid == rid

        ex = link.request(wire.Ping("d1", 1), pong(1), policy, retries=3)
        assert ex.attempts == 2 and policy.srtt_ms is None  # first one dropped: no sample
        ex = link.request(wire.Ping("d1", 2), pong(2), policy, retries=3)
        assert ex.attempts == 1 and policy.srtt_ms is not None
        assert policy.srtt_ms >= 30.0  # the peer's delay, at least
        assert policy.timeout_ms < 150  # learned: shorter than the initial guess
    finally:
        link.close()
        peer.stop()


def test_an_adaptive_device_stays_lossless_and_records_its_choices(tmp_path, tiny_pair):
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    draft = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
    server = ServerThread(target, tmp_path / "server")
    items = problems(3, seed=11)
    try:
        rounds = run_device(draft, server.addr, tmp_path / "dev", items, max_new=40,
                            draft_policy="adaptive", timeout_policy="adaptive")  # fmt: skip
    finally:
        server.stop()
    assert all(r["mode"] == "verified" and 3 <= r["draft_len"] <= 8 for r in rounds)
    assert all(r["timeout_ms"] < 200.0 for r in rounds)  # learned from loopback (HELLO on)
    assert_targets_greedy_output(target, tmp_path / "dev", items, 40)


class EveryOtherRelay(Relay):
    """Loses the 1st, 3rd, 5th ... datagram of each direction."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.seen = {"up": 0, "down": 0}
        super().__init__(server)

    def lost(self, way: str) -> bool:
        self.seen[way] += 1
        return self.seen[way] % 2 == 1


@pytest.mark.parametrize("copies", [1, 2])
def test_redundant_copies_survive_the_loss_of_one_copy_each_way(tmp_path, tiny_pair, copies):
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    server = ServerThread(target, tmp_path / "server")
    relay = EveryOtherRelay(server.addr)
    link = ServerLink(relay.addr, KEY, bind=("127.0.0.1", 0))
    try:
        ids = target.tokenize("Q: Tom has 3 apples.")
        msg = wire.Verify("d1", 1, "s1", 0, ids, [5], server.server.epoch, copies=copies)
        ex = link.request(msg, lambda m: isinstance(m, wire.Verdict), FixedTimeout(300), 3)
    finally:
        link.close()
        relay.stop()
        server.stop()
    assert isinstance(ex.reply, wire.Verdict)
    if copies == 2:
        assert ex.attempts == 1  # one copy of the request and one of the verdict got through
        assert server.server.batches == 1  # the second copy was not verified again
    else:
        assert ex.attempts > 1  # a single copy needs retries on this link


def test_lookahead_is_reused_and_output_stays_the_targets(tmp_path, tiny_pair):
    """Look-ahead drafted while verdicts are in flight (a 30 ms relay) starts later rounds."""
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    draft = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
    server = ServerThread(target, tmp_path / "server")
    relay = SlowRelay(server.addr, 0.015)
    items = problems(3, seed=13)
    try:
        rounds = run_device(draft, relay.addr, tmp_path / "dev", items, max_new=40,
                            draft_len=4, lookahead=6)  # fmt: skip
    finally:
        relay.stop()
        server.stop()
    assert all(r["mode"] == "verified" for r in rounds)
    assert sum(r["lookahead_drafted"] for r in rounds) > 0
    assert sum(r["lookahead_used"] for r in rounds) > 0  # rounds started from look-ahead
    for before, after in zip(rounds, rounds[1:]):  # what one round kept, the next one used
        kept = min(before["lookahead_kept"], 4) if before["problem"] == after["problem"] else 0
        assert after["lookahead_used"] == kept
    assert_targets_greedy_output(target, tmp_path / "dev", items, 40)


class SlowRelay(Relay):
    """Holds each datagram one_way_s before forwarding it (a thread per datagram)."""

    def __init__(self, server: tuple[str, int], one_way_s: float) -> None:
        self.one_way_s = one_way_s
        super().__init__(server)

    def on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        threading.Timer(self.one_way_s, super().on_datagram, (data, addr)).start()


class FirstVerifyLostRelay(Relay):
    """Loses the first attempt of every VERIFY (its first datagram with a new rid) and keeps
    what each attempt carried."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.seen: set[int] = set()
        self.carried: dict[int, list[list[int]]] = {}
        super().__init__(server)

    def on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr != self.server:
            msg = wire.decode(data, KEY)
            if isinstance(msg, wire.Verify):
                self.carried.setdefault(msg.rid, []).append(msg.draft)
                if msg.rid not in self.seen:
                    self.seen.add(msg.rid)
                    self.client = addr
                    return
        super().on_datagram(data, addr)


def test_a_retry_sends_the_confident_prefix_and_output_stays_the_targets(tmp_path, tiny_pair):
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    draft = LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1)
    server = ServerThread(target, tmp_path / "server")
    relay = FirstVerifyLostRelay(server.addr)
    items = problems(2, seed=17)
    try:
        rounds = run_device(draft, relay.addr, tmp_path / "dev", items, max_new=32, draft_len=6,
                            retry_confidence=0.9, timeout_ms=50)  # fmt: skip
    finally:
        relay.stop()
        server.stop()
    assert all(r["mode"] == "verified" and r["attempts"] == 2 for r in rounds)
    short = [r for r in rounds if r["retry_drafts"] is not None]
    assert short, "no draft had a token below 0.9 confidence"
    for r in rounds:  # the retry carried exactly the drafts down to the first unsure one
        n = next((i for i, c in enumerate(r["conf"]) if c < 0.9), len(r["conf"]))
        assert r["retry_drafts"] == (max(n, 1) if max(n, 1) < r["drafted"] else None)
        assert r["accepted"] <= (r["retry_drafts"] or r["drafted"])
    sent = sorted(relay.carried.values(), key=len)
    assert all(len(attempts) == 2 for attempts in sent)
    assert any(len(a[1]) < len(a[0]) and a[1] == a[0][: len(a[1])] for a in sent)
    assert_targets_greedy_output(target, tmp_path / "dev", items, 32)
