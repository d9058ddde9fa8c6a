"""Run folders: atomic appends, staging, resume without loss or duplication."""

from __future__ import annotations

import json

import pytest

from testbed.core.files import append_json_line, atomic_write
from testbed.results.store import RunStore


def test_create_refuses_to_overwrite(tmp_path):
    store = RunStore(tmp_path / "run")
    store.create({"run_id": "x"})
    assert store.manifest()["run_id"] == "x"
    with pytest.raises(FileExistsError, match="--resume"):
        store.create({"run_id": "y"})


def test_journal_latest_entry_wins_and_torn_lines_are_skipped(tmp_path):
    store = RunStore(tmp_path)
    append_json_line(store.journal_path, {"condition": "a", "status": "failed", "index": 0})
    append_json_line(store.journal_path, {"condition": "b", "status": "done", "index": 1})
    append_json_line(store.journal_path, {"condition": "a", "status": "done", "index": 0})
    with store.journal_path.open("a") as fh:
        fh.write('{"condition": "c", "sta')  # a crash in the middle of a write
    entries = store.journal()
    assert [(e["condition"], e["status"]) for e in entries] == [("a", "done"), ("b", "done")]
    assert store.finished() == {"a", "b"}


def test_failed_conditions_are_rerun_only_when_asked(tmp_path):
    store = RunStore(tmp_path)
    append_json_line(store.journal_path, {"condition": "a", "status": "failed", "index": 0})
    assert store.finished() == {"a"}
    assert store.finished(retry_failed=True) == set()


def test_staged_condition_appears_only_when_committed(tmp_path):
    store = RunStore(tmp_path)
    store.create({"run_id": "r"})
    staged = store.staging("c00")
    staged.file("rows.json").write_text("[]")
    assert not store.condition_dir("c00").exists()
    # a crash now: the next attempt discards the partial folder and starts clean
    staged = store.staging("c00")
    assert list(staged.root.iterdir()) == []
    staged.file("rows.json").write_text("[1]")
    store.commit("c00", staged, {"condition": "c00", "status": "done", "index": 0})
    assert json.loads((store.condition_dir("c00") / "rows.json").read_text()) == [1]
    assert store.finished() == {"c00"}


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "f.json"
    atomic_write(path, b"old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_resumed_run_expands_to_the_conditions_it_planned(tmp_path):
    """The saved playbook keeps the sweep's key order (it makes the condition ids), and a
    saved playbook that expands to other conditions is refused, not run again under new ids."""
    from testbed.config.playbook import expand, load_playbook, planned_ids
    from testbed.core.errors import BadInputError
    from testbed.runner.run import check_same_conditions, playbook_for_resume, save_playbook

    source = tmp_path / "p.yaml"
    source.write_text(
        "name: order\nmode: sled\nlab: {devices: 1}\nmodels: {draft: tiny, target: tiny}\n"
        "sweep:\n  sled.copies: [1, 2]\n  link.loss: [0.0, 0.1]\n"
    )
    pb = load_playbook(source)
    store = RunStore(tmp_path / "run")
    store.create({"run_id": "r", "conditions": planned_ids(expand(pb))})
    save_playbook(store, pb)
    resumed, _ = playbook_for_resume(store)
    ids = list(expand(resumed).ids())
    assert ids == store.manifest()["conditions"] and ids[0].startswith("c00-sled.copies=1,link")
    check_same_conditions(store, expand(resumed))

    swapped = pb.model_copy(update={"sweep": dict(reversed(pb.sweep.items()))})
    with pytest.raises(BadInputError, match=r"playbook.yaml: expands to other conditions"):
        check_same_conditions(store, expand(swapped))
