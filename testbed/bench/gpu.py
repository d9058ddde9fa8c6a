"""GPU check of the server side (run on a CUDA machine; no llama.cpp needed).

    python -m testbed.bench.gpu TINY_PAIR_DIR [OUT_JSON]     (or: testbed bench gpu)

1. batched verification of the tiny target on CUDA: time per batch vs batch size;
2. the same for a randomly initialised ~1B-parameter Llama in bfloat16 (A100-class sizes:
   timing only, its outputs are meaningless);
3. AD vs SD of the tiny pair with both models on CUDA, against the analytic bound;
4. the SLED verification server on CUDA over loopback UDP with two device agents (torch
   drafts on the CPU): verified answers must equal the target's greedy answers.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path

import torch

from agents.engines.torch_hf import TorchEngine
from agents.protocol.auth import LabKey, new_key_text
from agents.records import RecordWriter, read_records
from agents.sled.device import DeviceAgent, DeviceConfig
from agents.sled.link import ServerLink
from agents.sled.server import VerificationServer
from agents.spec.decoding import generate_ad
from agents.spec.speedup import run_sd_bench
from agents.workloads.arithmetic import heldout_problems, prompt
from testbed.bench.verify import time_batches


def random_llama(tokenizer_dir: Path, out: Path) -> Path:
    """A random ~1B-parameter Llama folder sharing the tiny tokenizer (timing only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=TorchEngine(tokenizer_dir).vocab_size, hidden_size=2048,
        intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, max_position_embeddings=2048, bos_token_id=0, eos_token_id=1,
        pad_token_id=2,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    shutil.copy(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")
    return out


DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")  # "cpu" to dry-run the script here


def main(pair: Path, out_json: Path | None = None) -> None:
    res: dict[str, object] = {"device": DEVICE, "torch": torch.__version__}
    if DEVICE == "cuda":
        res["gpu"] = torch.cuda.get_device_name(0)
    print(res, flush=True)
    target = TorchEngine(pair / "target", device=DEVICE)
    prompts = [target.tokenize(prompt(p)) for p in heldout_problems(32, seed=3)]
    batches = [1, 2, 4, 8, 16, 32, 64]

    def table(name: str, engine: TorchEngine) -> None:
        rows = []
        for pt in time_batches(engine, prompts, batches, 4):
            rows.append({"batch": pt.batch, "batch_ms": pt.batch_ms, "single_ms": pt.single_ms,
                         "gain": pt.batching_gain,
                         "verified_tok_s": pt.batch * 5 / (pt.batch_ms / 1000)})  # fmt: skip
            print(name, rows[-1], flush=True)
        res[name] = rows

    table(f"verify_tiny_{DEVICE}_f32", target)
    with tempfile.TemporaryDirectory() as tmp:
        if DEVICE != "cuda":
            batches[:] = [1, 2]
        big = TorchEngine(random_llama(pair / "target", Path(tmp) / "big"), device=DEVICE,
                          dtype="bfloat16")  # fmt: skip
        params = sum(p.numel() for p in big.model.parameters())
        res["big_params"] = params
        print("random llama params", params, flush=True)
        table(f"verify_1b_{DEVICE}_bf16", big)
        del big
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    draft = TorchEngine(pair / "draft", device=DEVICE)
    sd = run_sd_bench(draft, target, prompts[:30], 4, 48)
    res[f"sd_{DEVICE}"] = sd.as_dict()
    print(f"sd_{DEVICE}", json.dumps(sd.as_dict()), flush=True)

    # the SLED server on CUDA, two devices drafting on the CPU, over loopback UDP
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    tmp = Path(tempfile.mkdtemp())
    records = RecordWriter(tmp / "server")
    key = LabKey(new_key_text().strip().encode())
    server = VerificationServer(target, sock, key, records, window_ms=5.0)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    items = {f"d{i}": heldout_problems(6, seed=40 + i) for i in range(2)}
    answers: dict[str, list[dict]] = {}

    def device(dev: str) -> None:
        engine = TorchEngine(pair / "draft", device="cpu", threads=1)
        link = ServerLink(sock.getsockname(), key, bind=("127.0.0.1", 0))
        with RecordWriter(tmp / dev) as writer:
            DeviceAgent(engine, link, writer, DeviceConfig(dev, max_new=48)).run(
                [{"id": p.id, "prompt": prompt(p), "reference": p.result} for p in items[dev]]
            )
        answers[dev] = read_records(tmp / dev / "requests.jsonl")

    threads = [threading.Thread(target=device, args=(d,)) for d in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    server.stopping = True
    thread.join(5)
    records.close()
    same = total = 0
    for dev, reqs in answers.items():
        by_id = {p.id: p for p in items[dev]}
        for r in reqs:
            ad = generate_ad(target, target.tokenize(prompt(by_id[r["problem"]])), 48)
            same += r["text"] == target.detokenize(ad.tokens)
            total += 1
    batch_sizes = [b["batch"] for b in read_records(tmp / "server" / "batches.jsonl")]
    res[f"sled_{DEVICE}"] = {"answers": total, "equal_to_target_ad": same,
                        "max_batch": max(batch_sizes), "batches": len(batch_sizes)}  # fmt: skip
    print(f"sled_{DEVICE}", res[f"sled_{DEVICE}"], flush=True)
    if out_json:
        out_json.write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
