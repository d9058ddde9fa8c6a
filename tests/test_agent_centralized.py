"""The centralized baseline: continuous batching gives each request the target's own output."""

from __future__ import annotations

import threading

import pytest
from agent_harness import ServerThread, assert_targets_greedy_output, problems, run_device

from agents.engines.llama_cpp import LlamaCppEngine
from agents.engines.torch_hf import TorchEngine
from agents.records import read_records
from agents.sled.centralized import ContinuousBatcher
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
