"""The device configuration file: the seed's shape, errors naming the key, flags winning."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from agents.sled import device
from agents.sled.device_config import DeviceConfigError, load_device_config

SEED_SHAPE = """
draft_model: /models/draft-q4_0.gguf
quantization: q4_0
speculative_length:
  min: 2
  max: 6
  target_acceptance: 0.8
network:
  retry_timeout: 150
  max_retries: 5
"""


def test_the_seed_shape_maps_to_device_settings(tmp_path):
    path = tmp_path / "device.yaml"
    path.write_text(SEED_SHAPE)
    assert load_device_config(path) == {
        "model": "/models/draft-q4_0.gguf", "draft_policy": "adaptive", "draft_min": 2,
        "draft_max": 6, "target_acceptance": 0.8, "timeout_ms": 150.0, "retries": 5,
    }  # fmt: skip
    as_json = tmp_path / "device.json"
    as_json.write_text(json.dumps({"network": {"max_retries": 0}}))
    assert load_device_config(as_json) == {"retries": 0}


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"speculative_length": {"min": "3"}}, r"key speculative_length\.min: expected an integer"),
        (
            {"speculative_length": {"min": 6, "max": 3}},
            r"key speculative_length: expected min <= max",
        ),
        (
            {"speculative_length": {"target_acceptance": 1.5}},
            r"target_acceptance: expected a number",
        ),
        ({"network": {"retry_timeout": -1}}, r"key network\.retry_timeout"),
        ({"network": {"retries": 3}}, r"unknown key network\.retries"),
        ({"quantization": "q5_k"}, r"key quantization: expected one of"),
        ({"drafts": 4}, r"unknown key 'drafts'"),
        ([1, 2], r"expected a mapping at the top"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, doc, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(DeviceConfigError, match=r"bad\.json: .*" + needle):
        load_device_config(path)


def test_explicit_flags_win_over_the_file(tmp_path):
    path = tmp_path / "device.yaml"
    path.write_text(SEED_SHAPE)
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "Q: 1 + 1"}\n')
    (tmp_path / "k").write_text("k" * 40)
    seen = {}

    def fake_engine(model, **_):
        seen["model"] = model

    def fake_agent(engine, link, records, cfg):
        seen["cfg"] = cfg
        raise SystemExit(0)  # stop before the agent runs

    argv = ["--server", "127.0.0.1:9", "--dev", "d1", "--config", str(path), "--retries", "1",
            "--problems", str(tmp_path / "p.jsonl"), "--records", str(tmp_path / "r"),
            "--key-file", str(tmp_path / "k")]  # fmt: skip
    with (
        mock.patch.object(device, "load_engine", fake_engine),
        mock.patch.object(device, "DeviceAgent", fake_agent),
        pytest.raises(SystemExit),
    ):
        device.main(argv)
    cfg = seen["cfg"]
    assert seen["model"] == "/models/draft-q4_0.gguf"
    assert (cfg.draft_policy, cfg.draft_min, cfg.draft_max) == ("adaptive", 2, 6)
    assert cfg.timeout_ms == 150.0
    assert cfg.retries == 1  # the flag, not the file's 5
