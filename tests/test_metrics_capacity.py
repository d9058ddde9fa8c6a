"""`testbed capacity`: each probe is a run of the playbook at one device count (runs faked
here: a shared server of 100 verified tok/s), the capacity read from their condition rows.
With the runs faked, the bisection goes between the ends (test_capacity_e2e.py makes real runs
at both ends of a small range)."""

from __future__ import annotations

import json

import pytest
from capacity_stand_in import probe_run

from testbed.core.errors import BadInputError
from testbed.runner import capacity as capacity_module


def test_capacity_probes_runs_at_each_device_count(tmp_path, monkeypatch):
    monkeypatch.setattr(capacity_module, "execute", probe_run)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: cap\ntopology: topologies/star.yaml\n")
    result = capacity_module.run_capacity(
        playbook, 7.0, tmp_path / "cap", 1, 32, say=lambda _: None
    )
    assert result.capacity == 14
    assert result.measured[14] == pytest.approx(100 / 14)
    saved = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert saved["capacity"] == 14
    probes = sorted(p.name for p in (tmp_path / "cap" / "runs").iterdir())
    assert "cap-n14" in probes and "cap-n15" in probes


def test_a_rate_the_lowest_count_misses_is_capacity_0_after_that_probe(tmp_path, monkeypatch):
    monkeypatch.setattr(capacity_module, "execute", probe_run)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: cap\n")
    result = capacity_module.run_capacity(
        playbook, 101.0, tmp_path / "cap", 1, 32, say=lambda _: None
    )
    assert (result.capacity, result.measured) == (0, {1: 100.0})
    assert json.loads((tmp_path / "cap" / "capacity.json").read_text())["capacity"] == 0
    assert [p.name for p in (tmp_path / "cap" / "runs").iterdir()] == ["cap-n1"]


def test_capacity_refuses_a_sweep(tmp_path):
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: cap\nsweep:\n  link.loss: [0, 0.1]\n")
    with pytest.raises(BadInputError, match="2 conditions"):
        capacity_module.run_capacity(playbook, 1.0, tmp_path / "cap")
