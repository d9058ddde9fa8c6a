"""The playbook's server knobs reach the verification server as flags it accepts."""

from __future__ import annotations

import shlex

from agents.sled.server import build_parser
from testbed.config.playbook import expand, load_playbook
from testbed.hosts.inventory import InventoryHost
from testbed.runner.sled import server_command

PLAYBOOK = """name: p
sled:
  kv_policy: queue
  kv_queue_max: 3
  kv_queue_timeout_s: 2.5
  prefill_chunk: 16
  max_seq_length: 512
  max_seq_policy: refuse
"""


def test_the_runner_passes_the_kv_policy_prefill_chunk_and_truncation(tmp_path):
    (tmp_path / "pb.yaml").write_text(PLAYBOOK)
    (cond, *_) = expand(load_playbook(tmp_path / "pb.yaml"))
    host = InventoryHost(name="server", role="server", address="10.88.1.1", user="u", workdir="/w")
    argv = shlex.split(server_command(host, cond, "/m/target", "/w/records"))
    assert argv[1:3] == ["-m", "agents.sled.server"]
    args = build_parser().parse_args(argv[3:])
    assert (args.kv_policy, args.kv_queue_max, args.kv_queue_timeout_s) == ("queue", 3, 2.5)
    assert (args.prefill_chunk, args.max_seq_length, args.max_seq_policy) == (16, 512, "refuse")


def test_the_seed_flag_spellings_are_accepted():
    args = build_parser().parse_args(
        ["--bind", "127.0.0.1:1", "--model", "m", "--key-file", "k", "--records", "r",
         "--kv_policy", "queue", "--prefill_chunk", "8", "--max_seq_length", "64",
         "--kv_cache_mem", "0.5", "--batch_strategy", "best_fit", "--max_batch_size", "4"]
    )  # fmt: skip
    assert (args.kv_policy, args.prefill_chunk, args.max_seq_length) == ("queue", 8, 64)
    assert (args.kv_cache_mem, args.batch_strategy, args.max_batch) == (0.5, "best_fit", 4)
