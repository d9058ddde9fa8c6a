"""Batch planning: best-fit grouping by length against arrival order, padding share, verdicts."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pytest
from agent_harness import KEY

from agents.engines.torch_hf import TorchEngine
from agents.protocol import wire
from agents.records import RecordWriter, read_records
from agents.sled.batching import Shape, padding_share, plan_groups
from agents.sled.server import Pending, VerificationServer
from agents.workloads.arithmetic import heldout_problems, prompt


def test_padding_share_counts_the_empty_key_slots():
    assert padding_share([Shape(10, 5)]) == 0
    # widths: max past 10 + max new 5 = 15; real slots 15 + 5 = 20 of 30
    assert padding_share([Shape(10, 5), Shape(2, 3)]) == pytest.approx(1 - 20 / 30)


def test_arrival_keeps_order_and_best_fit_groups_lengths_within_16():
    shapes = [Shape(p, 5) for p in (100, 3, 50, 10, 104, 60, 12)]
    assert plan_groups(shapes, "arrival", 3) == [[0, 1, 2], [3, 4, 5], [6]]
    groups = plan_groups(shapes, "best_fit", 16)
    assert sorted(i for g in groups for i in g) == list(range(7))
    for g in groups:
        lengths = [shapes[i].length for i in g]
        assert max(lengths) - min(lengths) <= 16
    assert [sorted(shapes[i].past for i in g) for g in groups] == [
        [3, 10, 12],
        [50, 60],
        [100, 104],
    ]
    assert all(len(g) <= 2 for g in plan_groups(shapes, "best_fit", 2))
    with pytest.raises(ValueError, match="batch strategy"):
        plan_groups(shapes, "random", 4)  # type: ignore[arg-type]


def test_best_fit_pads_less_than_arrival_order():
    rng = random.Random(3)
    shapes = [Shape(rng.randrange(10, 400), rng.randrange(1, 9)) for _ in range(32)]

    def padded_slots(groups):
        total = 0.0
        for g in groups:
            width = max(shapes[i].past for i in g) + max(shapes[i].new for i in g)
            total += padding_share([shapes[i] for i in g]) * len(g) * width
        return total

    best = padded_slots(plan_groups(shapes, "best_fit", 16))
    arrival = padded_slots(plan_groups(shapes, "arrival", 16))
    assert best < arrival / 4


class Harness:
    """A server whose batches are fed by hand; replies land on one client socket."""

    def __init__(self, engine, records: Path, **kw) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.client.bind(("127.0.0.1", 0))
        self.client.settimeout(5)
        self.records = RecordWriter(records)
        self.server = VerificationServer(engine, self.sock, KEY, self.records, **kw)

    def verify(self, requests: list[wire.Verify]) -> dict[str, wire.Verdict]:
        addr = self.client.getsockname()
        self.server.verify_batch([Pending(m, addr, time.monotonic()) for m in requests])
        out = {}
        while len(out) < len(requests):
            msg = wire.decode(self.client.recvfrom(wire.MAX_DATAGRAM)[0], KEY)
            assert isinstance(msg, wire.Verdict), msg
            out[msg.sid] = msg
        return out

    def close(self) -> None:
        self.records.close()
        self.sock.close()
        self.client.close()


def test_best_fit_batches_give_the_same_verdicts_as_one_by_one(tmp_path, tiny_pair):
    target = TorchEngine(tiny_pair.target_hf, threads=1)
    rng = random.Random(9)
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(6, seed=21)]
    prompts[1] = prompts[1] + prompts[2]  # lengths far apart: several best-fit groups
    prompts[4] = prompts[4] * 3
    best = Harness(target, tmp_path / "best", strategy="best_fit", max_batch=16)
    single = Harness(target, tmp_path / "single", strategy="arrival", max_batch=1)
    try:
        seqs = {f"s{i}": list(p) for i, p in enumerate(prompts)}
        for rid in range(1, 5):
            requests = {h: [] for h in ("best", "single")}
            for sid, seq in seqs.items():
                draft = [rng.randrange(target.vocab_size) for _ in range(rng.randrange(1, 5))]
                for name, h in (("best", best), ("single", single)):
                    requests[name].append(
                        wire.Verify("d" + sid, rid, sid, 0, seq, draft, h.server.epoch)
                    )
            got_best = best.verify(requests["best"])
            got_single = single.verify(requests["single"])
            for sid in seqs:
                b, s = got_best[sid], got_single[sid]
                assert (b.accepted, b.token, b.length) == (s.accepted, s.token, s.length), sid
                draft = next(r.draft for r in requests["best"] if r.sid == sid)
                seqs[sid] = seqs[sid] + draft[: b.accepted] + [b.token]
                assert len(seqs[sid]) == b.length
    finally:
        best.close()
        single.close()
    best_batches = read_records(tmp_path / "best" / "batches.jsonl")
    single_batches = read_records(tmp_path / "single" / "batches.jsonl")
    assert len(single_batches) == 4 * 6 and all(b["padding_share"] == 0 for b in single_batches)
    assert 4 < len(best_batches) < 4 * 6  # grouped, but not all in one forward
    assert max(b["batch"] for b in best_batches) > 1
    assert all(0 <= b["padding_share"] < 1 for b in best_batches)
