"""The playbook's server knobs reach the verification server as flags it accepts."""

from __future__ import annotations

import shlex

from agents.sled.server import build_parser
from testbed.config.playbook import expand, load_playbook
from testbed.hosts.inventory import InventoryHost
from testbed.runner.agents import server_command

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


def test_every_sled_setting_reaches_the_agent_that_declares_it(tmp_path):
    """Each `sled` setting goes, under its own name, to the agent its declaration names, and
    that agent's parser takes it with the playbook's value (none is listed twice)."""
    from agents.sled.device import build_parser as device_parser
    from testbed.config.playbook import SledSection
    from testbed.runner.agents import agent_flags

    section = SledSection(kv_cache_tokens=4096, max_seq_length=256, prefill_chunk=8,
                          draft_len=5, copies=2, server_threads=2, device_threads=3)  # fmt: skip
    server = vars(build_parser().parse_args(
        ["--bind", "127.0.0.1:1", "--model", "m", "--key-file", "k", "--records", "r",
         *agent_flags(section, "server")]))  # fmt: skip
    device = vars(device_parser().parse_args(
        ["--dev", "d", "--model", "m", "--problems", "p", "--records", "r",
         *agent_flags(section, "device")]))  # fmt: skip
    for name, field in SledSection.model_fields.items():
        agent = field.json_schema_extra["agent"]
        parsed = server if agent == "server" else device
        key = "threads" if name.endswith("_threads") else name
        assert parsed[key] == getattr(section, name), name
