"""Typed per-condition tables from agent records, and SQL over one run or every run."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from testbed.cli import app
from testbed.core.files import atomic_replace
from testbed.metrics.schemas import SCHEMAS
from testbed.results.condition_table import write_condition_table
from testbed.results.manifest import model_digests
from testbed.results.query import query, run_folders
from testbed.results.store import ConditionFolder, RunStore
from testbed.results.tables import tables_from_records


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(base: Path, name: str, loss: float, fallback: int) -> Path:
    """A run of one condition: one device, one request of 5 tokens (fallback of them
    unverified), two rounds."""
    store = RunStore(base / name)
    store.create({"run_id": name, "playbook": {"name": "t", "topology": "star"},
                  "conditions": ["c00"]})  # fmt: skip
    staged = store.staging("c00").root
    dev = staged / "hosts" / "d1"
    write_jsonl(dev / "rounds.jsonl", [
        {"dev": "d1", "problem": "p", "round": 0, "t_start": 1.0, "t_end": 1.5,
         "mode": "verified", "drafted": 4, "accepted": 4 - fallback, "tokens": 5 - fallback},
        {"dev": "d1", "problem": "p", "round": 1, "t_start": 1.5, "t_end": 2.0,
         "mode": "fallback", "drafted": 4, "tokens": fallback},
    ])  # fmt: skip
    write_jsonl(dev / "requests.jsonl", [
        {"dev": "d1", "problem": "p", "t_start": 1.0, "t_end": 2.0, "tokens": 5,
         "verified_tokens": 5 - fallback, "fallback_tokens": fallback, "rounds": 2,
         "text": "#### 4", "reference": "4"},
    ])  # fmt: skip
    (dev / "status.json").write_text(json.dumps({"dev": "d1", "t_start": 0.0, "t_end": 2.0}))
    (staged / "link.json").write_text(json.dumps({
        "backend": "nfqueue", "requested": {"rtt_ms": 85.0, "loss": loss},
        "probes": {"d1": {"rtt_ms": {"p50": 85.1}, "loss_up": {"rate": loss},
                          "loss_down": {"rate": loss}, "ok": True}},
    }))  # fmt: skip

    def score(df):
        return df.assign(strict_correct=True, flexible_correct=True, target_text="#### 5")

    metrics = tables_from_records(ConditionFolder(staged), "c00", score)
    store.commit("c00", ConditionFolder(staged), {"condition": "c00", "index": 0, "status": "done",
                                 "values": {"link.loss": loss}, "metrics": metrics})  # fmt: skip
    write_condition_table(store)
    return store.root


@pytest.fixture
def runs(tmp_path):
    return [make_run(tmp_path, "r1", 0.0, 0), make_run(tmp_path, "r2", 0.5, 2)]


def test_condition_tables_are_typed_by_their_schema(runs):
    folder = RunStore(runs[1]).condition_dir("c00")
    for table in ("rounds", "requests", "hosts", "links", "verifications", "batches"):
        schema = pq.read_schema(folder / f"{table}.parquet")
        declared = SCHEMAS[table]
        assert schema.names[: len(declared)] == declared.names, table
        for fld in declared:
            assert schema.field(fld.name).type == fld.type, (table, fld.name)
    conditions = pq.read_schema(runs[1] / "conditions.parquet")
    assert conditions.names[: len(SCHEMAS["conditions"])] == SCHEMAS["conditions"].names
    assert conditions.field("index").type == SCHEMAS["conditions"].field("index").type
    assert "sweep.link.loss" in conditions.names and "strict_ci_low" in conditions.names
    rounds = pq.read_table(folder / "rounds.parquet").to_pydict()
    assert rounds["accepted"] == [2, None] and rounds["condition"] == ["c00", "c00"]


def test_condition_row_separates_verified_and_unverified(runs):
    row = RunStore(runs[1]).journal()[0]["metrics"]
    # span 2 s on the device's clock (agent start 0.0 to answer 2.0)
    assert row["system_verified_tok_s"] == pytest.approx(1.5)
    assert row["system_unverified_tok_s"] == pytest.approx(1.0)
    assert row["system_tok_s"] == pytest.approx(2.5)
    assert row["strict_accuracy"] == 1.0
    assert row["target_strict_accuracy"] == 0.0  # the target said 5, the reference is 4


def test_query_spans_runs(runs, tmp_path):
    headers, rows = query(
        run_folders(tmp_path),
        "SELECT run, sum(tokens) AS tokens, sum(fallback_tokens) AS unverified "
        "FROM requests GROUP BY run ORDER BY run",
    )
    assert headers == ["run", "tokens", "unverified"]
    assert rows == [("r1", 5, 0), ("r2", 5, 2)]
    _, rows = query(runs, "SELECT run, \"sweep.link.loss\", system_verified_tok_s FROM "
                          "conditions ORDER BY run")  # fmt: skip
    assert rows == [("r1", 0.0, 2.5), ("r2", 0.5, 1.5)]
    _, rows = query(runs, "SELECT r.playbook, l.loss_up_measured FROM runs r JOIN links l "
                          "USING (run) ORDER BY run")  # fmt: skip
    assert rows == [("t", 0.0), ("t", 0.5)]


def test_results_commands(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_RESULTS", str(tmp_path))
    runner = CliRunner()
    result = runner.invoke(app, ["results", "ls"])
    assert result.exit_code == 0 and "r1" in result.output and "r2" in result.output
    result = runner.invoke(app, ["results", "query", "all", "SELECT count(*) AS n FROM rounds"])
    assert result.exit_code == 0 and "4" in result.output
    result = runner.invoke(app, ["results", "query", "r1", "SELECT nope FROM rounds"])
    assert result.exit_code == 2 and "query failed" in result.output
    result = runner.invoke(app, ["results", "show", str(runs[0])])
    assert result.exit_code == 0 and "verified tok/s" in result.output
    RunStore(runs[0]).update_manifest(reference=[{
        "host": "a100", "model": "/srv/m/llama", "device": "cuda", "sha256": {"a": "b"},
        "sha256_from": "inventory target_checkpoint.files"}])  # fmt: skip
    result = runner.invoke(app, ["results", "show", str(runs[0])])
    assert "reference answers: on a100 by /srv/m/llama (cuda; sha256 from inventory" in " ".join(
        result.output.split()
    )


def test_a_link_to_a_run_is_not_another_run(runs, tmp_path):
    """The nightly's `last-good` link beside the runs: the runs, the dashboard's and the
    queries' alike, are each listed once."""
    from testbed.report.data import run_folders as dashboard_runs

    (tmp_path / "last-good").symlink_to("r2")
    assert run_folders(tmp_path) == runs
    assert [r.root for r in dashboard_runs(tmp_path)] == runs
    _, rows = query(run_folders(tmp_path), "SELECT count(*) FROM runs")
    assert rows == [(2,)]


def test_atomic_replace_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "t.parquet"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_replace(path) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer crashed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_model_digests_name_every_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "w.bin").write_bytes(b"abc")
    (tmp_path / "d.gguf").write_bytes(b"abc")
    digests = model_digests(str(tmp_path / "m"), str(tmp_path / "d.gguf"), "/nowhere")
    sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert digests[str(tmp_path / "m")] == {"w.bin": sha}
    assert digests[str(tmp_path / "d.gguf")] == {"d.gguf": sha}
    assert digests["/nowhere"] == {}
