"""The reference modes through the runner: `device-only` (the draft alone on each device, no
server), `server-ad` and `server-sd` (every device's problems on the server alone).

The real run needs root (namespaces, sshd per host, Fabric); it uses lab `mrun` on
10.91.1.0/24 (TESTBED_LAB_NAME / TESTBED_LAB_SUBNET) so it shares a machine with other labs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from agents.engines.factory import load_engine
from agents.spec.decoding import generate_ad
from testbed.labs import EmulatedLab, LabSetup
from testbed.labs.clean import leftovers
from testbed.labs.physical import describe_namespace_lab
from testbed.metrics.condition_stats import ConditionStats
from testbed.results.store import RunStore
from testbed.results.tables import typed_table
from testbed.runner.run import execute

REPO = Path(__file__).resolve().parent.parent
LAB, SUBNET = "mrun", "10.91.1.0/24"
MODES = ("device-only", "server-ad", "server-sd")
PLAYBOOK = (
    "name: modes\nlab: {devices: 2}\nworkload: {problems_per_device: 2, max_new_tokens: 24}\n"
    "impairment: {probe_packets: 50}\nlink: {rtt_ms: 20}\n"
    f"sweep:\n  mode: [{', '.join(MODES)}]\n"
)


@pytest.fixture(scope="module", autouse=True)
def own_lab_name(tmp_path_factory):
    """Every run of this module brings up lab `mrun` (the runner reads these variables)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESTBED_LAB_NAME", LAB)
        mp.setenv("TESTBED_LAB_SUBNET", SUBNET)
        mp.setenv("TESTBED_RESULTS", str(tmp_path_factory.mktemp("m-results")))
        yield


def draft_greedy_answers(draft: Path, problem_files: list[Path]) -> dict[tuple[str, str], str]:
    """(device, problem id) -> the draft model's own greedy answer (AD with the draft)."""
    engine = load_engine(str(draft), threads=1)
    answers = {}
    for path in problem_files:
        dev = path.name.split(".")[0]
        for line in path.read_text().splitlines():
            p = json.loads(line)
            gen = generate_ad(engine, engine.tokenize(p["prompt"]), 24)
            answers[(dev, str(p["id"]))] = engine.detokenize(gen.tokens)
    return answers


def test_local_rounds_count_as_unverified_drafting():
    """device-only records: `local` rounds are unverified rounds that drafted; no acceptance."""
    rounds = pd.DataFrame(
        [{"condition": "c", "dev": "d1", "problem": "p1", "round": i, "t_start": 10.0 + i,
          "t_end": 10.5 + i, "mode": "local", "drafted": 4, "tokens": n}
         for i, n in enumerate((4, 2))]
    )  # fmt: skip
    requests = pd.DataFrame(
        [{"condition": "c", "dev": "d1", "problem": "p1", "t_start": 10.0, "t_end": 11.5,
          "tokens": 6, "verified_tokens": 0, "fallback_tokens": 6, "rounds": 2}]
    )  # fmt: skip
    s = ConditionStats.from_frames(typed_table("rounds", rounds).to_pandas(), requests)
    assert (s.verified_rounds, s.fallback_rounds, s.unverified_tokens) == (0, 2, 6)
    assert s.fallback_share == s.fallback_round_share == 1.0
    assert s.draft_lengths == {4: 2} and s.acceptance_rate is None


def test_reference_modes_answer_as_their_models(root_netns, tmp_path, tiny_pair):
    """server-ad and server-sd give the target's greedy answers, all verified, per device;
    device-only gives the draft's own greedy answers, every round `local`, all unverified."""
    playbook = tmp_path / "modes.yaml"
    playbook.write_text(PLAYBOOK)
    outcome = execute(playbook, out=tmp_path / "results", say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (3, 0)
    seen = set()
    for entry in RunStore(outcome.store.root).journal():
        cid, mode = entry["condition"], entry["values"]["mode"]
        seen.add(mode)
        cond = outcome.store.root / "conditions" / cid
        requests = pd.read_parquet(cond / "requests.parquet")
        rounds = pd.read_parquet(cond / "rounds.parquet")
        assert len(requests) == 4 and set(requests["dev"]) == {"dev1", "dev2"}, cid
        hosts = {p.name for p in (cond / "hosts").iterdir()}
        pacing = pd.read_parquet(cond / "pacing.parquet")  # each engine paced to its hardware
        engines = {(d, r) for d, r in zip(pacing["dev"], pacing["role"])}
        assert (
            engines
            == {
                "device-only": {("dev1", "draft"), ("dev2", "draft")},
                "server-ad": {("server", "target")},
                "server-sd": {("server", "target"), ("server", "draft")},
            }[mode]
        ), engines
        assert pacing["paced"].all() and (pacing["forwards"] > 0).all()
        if mode == "device-only":
            assert hosts == {"dev1", "dev2"}, hosts  # no server process ran
            assert set(rounds["mode"]) == {"local"}
            assert (requests["fallback_tokens"] == requests["tokens"]).all()
            assert entry["metrics"]["unverified_tokens"] == entry["metrics"]["tokens"] > 0
            want = draft_greedy_answers(
                tiny_pair.draft_gguf, sorted((cond / "inputs").glob("*.problems.jsonl"))
            )
            got = {(d, p): t for d, p, t in zip(requests["dev"], requests["problem"],
                                                requests["text"])}  # fmt: skip
            assert got == want
        else:
            assert hosts == {"server"}, hosts  # no device agent ran
            assert set(rounds["mode"]) == {mode}
            assert (requests["verified_tokens"] == requests["tokens"]).all()
            assert requests["matches_target"].all(), requests[["dev", "text", "target_text"]]
    assert seen == set(MODES)
    assert leftovers(LAB) == []


@pytest.mark.parametrize("kind", ["mininet", "inventory"])
def test_reference_modes_run_on_the_other_lab_kinds(root_netns, tmp_path, tiny_pair, kind):
    """The modes use only host control, so they run on a mininet lab and on an inventory of
    namespace hosts as on the namespaces lab: device-only and server-sd, one small problem."""
    playbook = tmp_path / "kinds.yaml"
    playbook.write_text(
        "name: kinds\nlab: {devices: 1}\nworkload: {problems_per_device: 1, max_new_tokens: 16}\n"
        "impairment: {probe_packets: 30}\nlink: {rtt_ms: 20}\n"
        "sweep:\n  mode: [device-only, server-sd]\n"
    )
    if kind == "mininet":
        outcome = execute(playbook, out=tmp_path / "r", lab_kind=kind, say=lambda _m: None)
    else:
        setup = LabSetup(name="mhosts", devices=1, subnet="10.91.2.0/24", state_dir=tmp_path / "h")
        with EmulatedLab.running(setup) as ns:
            inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml")
            outcome = execute(playbook, out=tmp_path / "r", inventory=str(inv), say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (2, 0), kind
    for entry in RunStore(outcome.store.root).journal():
        cond = outcome.store.root / "conditions" / entry["condition"]
        rounds = pd.read_parquet(cond / "rounds.parquet")
        want = "local" if entry["values"]["mode"] == "device-only" else "server-sd"
        assert set(rounds["mode"]) == {want}, (kind, entry["condition"])
    assert leftovers(LAB) == [] and leftovers("mhosts") == []


def test_dry_run_prints_each_modes_commands(tmp_path):
    """Dry run: device-only starts device agents and no server; server-ad / server-sd start
    one `agents.sled.local` on the server (sd with the draft) and no device agent."""
    (tmp_path / "modes.yaml").write_text(PLAYBOOK)
    proc = subprocess.run(
        [sys.executable, "-m", "testbed.cli", "run", str(tmp_path / "modes.yaml"), "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "COLUMNS": "1000"},  # one command a line
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sections = proc.stdout.split("condition ")[1:]
    assert len(sections) == 3, proc.stdout
    by_mode = {}
    for text in sections:
        mode = next(m for m in MODES if f"mode={m}" in text.splitlines()[0])
        by_mode[mode] = text
    only = by_mode["device-only"]
    assert "--mode device-only" in only and "agents.sled.server" not in only
    for mode, flag in (("server-ad", "--mode ad"), ("server-sd", "--mode sd")):
        text = by_mode[mode]
        assert f"agents.sled.local {flag}" in text, text
        assert ("--draft " in text) == (mode == "server-sd")
        assert "agents.sled.device" not in text and "agents.sled.server" not in text
    assert leftovers(LAB) == []
