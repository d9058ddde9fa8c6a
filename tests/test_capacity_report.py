"""Capacity searches keep each probe's faithfulness and dilation, and the dashboard's index
lists every search with the paper's figure. The probes' runs are stand-ins here
(tests/capacity_stand_in.py); tests/test_capacity_e2e.py runs real ones."""

from __future__ import annotations

import json

import pytest
from capacity_stand_in import FAITHFUL_UP_TO, probe_run

from testbed.core.errors import BadInputError
from testbed.metrics.capacity import deciding_counts
from testbed.report.capacity_searches import capacity_rows, capacity_searches, found
from testbed.report.dashboard import index_page
from testbed.runner import capacity as capacity_module


@pytest.fixture
def searched(tmp_path, monkeypatch):
    monkeypatch.setattr(capacity_module, "execute", probe_run)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(
        "name: cap\ntopology: topologies/star.yaml\npaper:\n  source: a paper\n  figures:\n"
        "    - {label: capacity, metric: capacity, value: 7, where: {mode: sled},"
        " why: 'a measured reason'}\n"
    )
    results = tmp_path / "results"
    result = capacity_module.run_capacity(
        playbook, 7.0, results / "capacity-pb-1", 1, 32, say=lambda _: None
    )
    return results, result


def test_capacity_json_keeps_every_probe_with_its_faithfulness_and_dilation(searched):
    results, result = searched
    saved = json.loads((results / "capacity-pb-1" / "capacity.json").read_text())
    assert saved["capacity"] == result.capacity == 14
    by_n = {p["devices"]: p for p in saved["probes"]}
    assert set(by_n) == set(result.measured)
    assert by_n[8]["faithful"] and not by_n[14]["faithful"]
    assert saved["faithful"] is False  # the probes that decide it (14 and 15) ran behind
    assert {p["time_dilation"] for p in saved["probes"]} == {2.0}
    assert (results / "capacity-pb-1" / by_n[14]["run"] / "journal.jsonl").is_file()


def test_index_lists_capacity_searches_beside_the_paper(searched):
    results, _ = searched
    searches = capacity_searches(results)
    [row] = capacity_rows(searches)
    assert row[:5] == ["capacity-pb-1", "sled", "7", "14", "no"]
    assert "14: 7.1 (unfaithful)" in row[5] and "8: 12.5," in row[5]
    assert row[6:] == ["7", "2.00", "a measured reason"]
    page = index_page([], [], searches)
    assert "<h2>Capacity searches</h2>" in page and "a measured reason" in page


def test_a_broken_capacity_file_is_named(tmp_path):
    (tmp_path / "capacity-x").mkdir()
    (tmp_path / "capacity-x" / "capacity.json").write_bytes(b"\xff\x00{")
    with pytest.raises(BadInputError, match="capacity-x/capacity.json"):
        capacity_searches(tmp_path)
    (tmp_path / "capacity-x" / "capacity.json").write_text("[1, 2]")
    with pytest.raises(BadInputError, match="expected keys rate, capacity and mode"):
        capacity_searches(tmp_path)


def test_a_probe_behind_far_from_the_capacity_does_not_decide_it(tmp_path, monkeypatch):
    monkeypatch.setitem(FAITHFUL_UP_TO, "n", 16)  # only the 32-device probe runs behind
    monkeypatch.setattr(capacity_module, "execute", probe_run)
    playbook = tmp_path / "pb.yaml"
    playbook.write_text("name: cap\ntopology: topologies/star.yaml\n")
    result = capacity_module.run_capacity(playbook, 7.0, tmp_path / "c", 1, 32, say=print)
    saved = json.loads((tmp_path / "c" / "capacity.json").read_text())
    assert result.capacity == 14 and not {p["devices"]: p for p in saved["probes"]}[32]["faithful"]
    assert saved["faithful"] is True  # 14 keeps and 15 does not, both faithful


def test_deciding_counts_are_the_capacity_and_the_count_above():
    assert deciding_counts(14, [1, 32, 16, 8, 12, 14, 15]) == [14, 15]
    assert deciding_counts(0, [4]) == [4]
    assert deciding_counts(32, [1, 32]) == [32]


def test_a_search_whose_smallest_probe_failed_says_fewer_than_it():
    assert found(0, [{"devices": 8}]) == "< 8"
    assert found(0, [{"devices": 1}]) == "0"
    assert found(14, [{"devices": 1}, {"devices": 14}]) == "14"
