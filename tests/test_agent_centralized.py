"""The centralized baseline: continuous batching gives each request the target's own output."""

from __future__ import annotations

import threading

import pytest
from agent_harness import ServerThread, assert_targets_greedy_output, problems, run_device

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.records import read_records
from agents.sled.central_rounds import centralized_rounds
from agents.sled.centralized import ContinuousBatcher, first_token_ms
from agents.spec.decoding import generate_ad


@pytest.fixture(scope="module")
def target(tiny_pair):
    return TorchEngine(tiny_pair.target_hf, threads=1)


def test_requests_joining_and_leaving_between_steps_get_the_targets_greedy_output(target):
    prompts = [target.tokenize(p["prompt"]) for p in problems(5, seed=31)]
    budgets = [40, 12, 30, 5, 25]
    batcher = ContinuousBatcher(target, max_batch=3)
    out: dict[int, list[int]] = {}
    sizes = []
    joined = 0
    step = 0
    while joined < len(prompts) or batcher.busy:
        if joined < len(prompts) and step % 4 == 0:  # a new request every 4 steps
            batcher.join(joined, 0, ("127.0.0.1", 9), prompts[joined], budgets[joined])
            joined += 1
        finished, size = batcher.step()
        sizes.append(size)
        out.update({g.key: g.out for g in finished})
        step += 1
    for i, p in enumerate(prompts):
        assert out[i] == generate_ad(target, p, budgets[i]).tokens, i
    assert max(sizes) == 3  # capped by max_batch, several at once
    assert len(set(sizes)) > 2  # the batch grew and shrank as requests joined and left


def test_centralized_devices_over_udp_get_the_targets_greedy_output(tmp_path, target, tiny_pair):
    server = ServerThread(target, tmp_path / "server", window_ms=5.0)
    try:
        items = {f"c{i}": problems(2, seed=50 + i) for i in range(3)}
        # loaded here, not in the threads: llama.cpp models are not loaded concurrently
        drafts = {dev: LlamaCppEngine(tiny_pair.draft_gguf, n_threads=1) for dev in items}

        def go(dev: str) -> None:
            run_device(drafts[dev], server.addr, tmp_path / dev, items[dev], dev=dev, max_new=32,
                       mode="centralized")  # fmt: skip

        threads = [threading.Thread(target=go, args=(d,)) for d in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    finally:
        server.stop()
    for dev, its in items.items():
        assert_targets_greedy_output(target, tmp_path / dev, its, 32)
    steps = read_records(tmp_path / "server" / "ar_steps.jsonl")
    assert max(s["batch"] for s in steps) > 1  # devices shared forwards
    assert len(read_records(tmp_path / "server" / "generations.jsonl")) == 6
    for dev in items:  # one round per token, seen as a stream would show them
        rounds = read_records(tmp_path / dev / "rounds.jsonl")
        answers = read_records(tmp_path / dev / "requests.jsonl")
        assert len(rounds) == sum(a["tokens"] for a in answers)
        assert {r["tokens"] for r in rounds} == {1}
        for a in answers:
            ends = [r["t_end"] for r in rounds if r["problem"] == a["problem"]]
            assert ends == sorted(ends) and ends[-1] - ends[0] > 0  # decoding took time
            assert ends[-1] == pytest.approx(a["t_end"], abs=0.05)


def test_a_centralized_answer_is_recorded_as_its_tokens_reached_a_streaming_client():
    rows = centralized_rounds("d0", "p1", 10.0, 12.0, 3, 200.0, {"attempts": 2})
    assert [r["t_end"] for r in rows] == pytest.approx([11.8, 11.9, 12.0])
    assert [r["t_start"] for r in rows] == pytest.approx([10.0, 11.8, 11.9])
    assert rows[0]["attempts"] == 2 and "attempts" not in rows[1]
    # without the decoding time (an older server, or no token) the answer is one round
    (one,) = centralized_rounds("d0", "p1", 10.0, 12.0, 3, None, {"attempts": 1})
    assert (one["t_end"], one["tokens"]) == (12.0, 3)


def test_the_batcher_keeps_the_first_tokens_time(target):
    batcher = ContinuousBatcher(target, max_batch=2)
    batcher.join("a", 0, ("127.0.0.1", 9), target.tokenize("1+1="), 6)
    done: list = []
    while batcher.busy:
        done += batcher.step()[0]
    (gen,) = done
    assert gen.steps == len(gen.out) > 1
    assert 0 < first_token_ms(gen) < (gen.first_token - gen.arrived) * 1000 + 1
