"""End to end: `testbed run experiments/smoke.yaml`, resume, dry run, and one small experiment
on each lab kind: namespaces, mininet and inventory (over namespace hosts).

These bring up real namespaces, sshd per host, the link emulation and the agents through
Fabric; they need root (CI runs them as root). The link backend is tc netem where the kernel
has sch_netem, else the NFQUEUE holder (`choose_backend`): where a playbook asks for none, the
tests expect the one it chooses on this machine. Runs use lab `erun` on 10.78.5.0/24
(TESTBED_LAB_NAME / TESTBED_LAB_SUBNET), so they share a machine with other labs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import require_root_netns

from agents.workloads.gsm8k import default_path as gsm8k_default
from testbed.labs import EmulatedLab, LabSetup, SystemRunner
from testbed.labs.clean import leftovers
from testbed.labs.physical import describe_namespace_lab
from testbed.links.detect import choose_backend
from testbed.results.store import RunStore
from testbed.runner.run import execute

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
LAB, SUBNET = "erun", "10.78.5.0/24"
# the project's ../shared copy of GSM8K, else the agents' default (TESTBED_GSM8K or /work/shared)
GSM8K_TEST = next(
    (p for p in (REPO.parent / "shared/datasets/gsm8k/test.jsonl", gsm8k_default()) if p.is_file()),
    REPO.parent / "shared/datasets/gsm8k/test.jsonl",
)


@pytest.fixture(scope="module", autouse=True)
def own_lab_name():
    """Every run of this module brings up lab `erun` (the runner reads these variables)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TESTBED_LAB_NAME", LAB)
        mp.setenv("TESTBED_LAB_SUBNET", SUBNET)
        yield


def run_dirs(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if (p / "manifest.json").exists())


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, tiny_pair):
    """One real run of experiments/smoke.yaml, shared by the assertions below."""
    require_root_netns()
    out = tmp_path_factory.mktemp("results")
    proc = subprocess.run(
        [*TESTBED, "run", str(REPO / "experiments" / "smoke.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = run_dirs(out)
    df = pd.read_parquet(run / "conditions.parquet").set_index("sweep.link.loss")
    return run, df, proc.stdout


def test_one_done_row_per_condition(smoke_run):
    run, df, stdout = smoke_run
    assert sorted(df.index) == [0.0, 0.1, 1.0]
    assert (df["status"] == "done").all(), df[["status", "reason"]]
    assert "results:" in stdout and str(run) in stdout.replace("\n", "")
    journal = RunStore(run).journal()
    assert len(journal) == 3 and len({e["condition"] for e in journal}) == 3


def test_link_measures_as_requested(smoke_run):
    _, df, _ = smoke_run
    for loss in (0.0, 0.1):
        assert abs(df.loc[loss, "rtt_measured_ms"] - 85.0) <= 1.0
    assert df.loc[0.0, "loss_up_measured"] <= 0.02
    assert df.loc[0.0, "loss_down_measured"] <= 0.02
    assert 0.02 <= df.loc[0.1, "loss_up_measured"] <= 0.2
    assert 0.02 <= df.loc[0.1, "loss_down_measured"] <= 0.2
    assert df.loc[1.0, "loss_up_measured"] == 1.0
    # the smoke playbook asks for no backend: the one this machine's kernel allows
    assert set(df["backend"]) == {choose_backend("auto", SystemRunner())[0]}


def test_verified_answers_equal_target_greedy_at_zero_loss(smoke_run):
    run, df, _ = smoke_run
    row = df.loc[0.0]
    cond = RunStore(run).condition_dir(row["condition"])
    req = pd.read_parquet(cond / "requests.parquet")
    assert len(req) == 6  # 2 devices x 3 problems
    assert (req["verified_tokens"] == req["tokens"]).all()
    assert req["matches_target"].all(), req[["text", "target_text"]]
    assert row["fallback_share"] == 0 and row["acceptance_rate"] > 0


def test_the_reference_answers_come_from_the_server_host(smoke_run):
    """Computed once, on the server host by the target its server loads (on this lab the
    controller's tiny target, whose digests the manifest already holds), and what every
    condition's `target_text` is."""
    run, df, stdout = smoke_run
    manifest = json.loads((run / "manifest.json").read_text())
    target = manifest["models"]["target"]
    (where,) = manifest["reference"]
    assert where["host"] == "server" and where["model"] == target
    assert where["sha256"] == manifest["models"]["sha256"][target]
    assert where["sha256_from"] == "controller" and where["engine"] == f"torch:{target}"
    book = json.loads((run / "reference_answers.json").read_text())
    (computed,) = book["computed"]  # the three conditions share their problems
    assert computed["problems"] == 6 and computed["max_new"] == 48
    said = " ".join(stdout.split())  # as printed, wrapped to the terminal
    assert said.count("reference answers of 6 problems by the target on server") == 1
    for cond in df["condition"]:
        req = pd.read_parquet(RunStore(run).condition_dir(cond) / "requests.parquet")
        for pid, text in zip(req["problem"], req["target_text"], strict=True):
            assert text == book["answers"][f"{pid}@48"]["text"]


def test_total_loss_completes_on_fallback(smoke_run):
    run, df, _ = smoke_run
    row = df.loc[1.0]
    assert row["fallback_share"] == 1.0
    assert row["system_tok_s"] > 0 and row["tokens"] > 0
    rounds = pd.read_parquet(RunStore(run).condition_dir(row["condition"]) / "rounds.parquet")
    assert (rounds["mode"] == "fallback").all()
    req = pd.read_parquet(RunStore(run).condition_dir(row["condition"]) / "requests.parquet")
    assert len(req) == 6 and (req["fallback_tokens"] == req["tokens"]).all()


def test_manifest_and_tables_are_complete(smoke_run):
    run, df, _ = smoke_run
    manifest = json.loads((run / "manifest.json").read_text())
    for key in ("playbook", "git", "packages", "host", "seeds", "lab", "models"):
        assert key in manifest, key
    assert manifest["playbook"]["name"] == "smoke"
    for cond in df["condition"]:
        folder = RunStore(run).condition_dir(cond)
        for name in ("rounds", "requests", "hosts", "links"):
            assert (folder / f"{name}.parquet").exists(), (cond, name)
        link = json.loads((folder / "link.json").read_text())
        assert link["requested"]["rtt_ms"] == 85.0 and link["backend"]
        assert set(link["probes"]) == {"dev1", "dev2"}
        hosts = pd.read_parquet(folder / "hosts.parquet").set_index("dev")
        assert hosts.loc["dev1", "host_class"] == "pi5"  # from the topology, via the inventory
    assert manifest["lab"]["kind"] == "namespaces" and manifest["lab"]["classes"] == {"pi5": 2}


def test_lab_is_gone_after_the_run(smoke_run):
    assert leftovers(LAB) == []


def test_interrupted_run_resumes_without_loss_or_duplicates(root_netns, tmp_path, tiny_pair):
    playbook = tmp_path / "two.yaml"
    playbook.write_text(
        "name: two\nlab: {devices: 1}\nworkload: {problems_per_device: 1, max_new_tokens: 24}\n"
        "impairment: {probe_packets: 50}\nsweep:\n  link.loss: [0.0, 1.0]\n"
    )
    out = tmp_path / "results"

    def crash(entry: dict) -> None:
        raise KeyboardInterrupt  # the operator presses Ctrl-C after the first condition

    with pytest.raises(KeyboardInterrupt):
        execute(playbook, out=out, say=lambda _m: None, on_condition=crash)
    (run,) = run_dirs(out)
    assert len(RunStore(run).journal()) == 1
    assert leftovers(LAB) == []  # the lab came down on the interrupt

    outcome = execute(None, resume=run, say=lambda _m: None)
    assert (outcome.done, outcome.failed, outcome.skipped) == (1, 0, 1)
    journal = RunStore(run).journal()
    assert [e["status"] for e in journal] == ["done", "done"]
    assert len({e["condition"] for e in journal}) == 2
    assert not list((run / "conditions").glob(".*partial"))
    assert len(pd.read_parquet(run / "conditions.parquet")) == 2
    again = execute(None, resume=run, say=lambda _m: None)
    assert (again.done, again.skipped) == (0, 2)


def test_dry_run_prints_actions_and_changes_nothing(tmp_path):
    proc = subprocess.run(
        [*TESTBED, "run", str(REPO / "experiments" / "smoke.yaml"), "--dry-run",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "COLUMNS": "1000"},  # one command a line
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    for needle in ("ip netns add", "agents.sled.server", "agents.sled.device"):
        assert needle in text, needle
    # the link commands of the backend a dry run chooses on this kernel, and not the other's
    backend, why = choose_backend("auto", SystemRunner(dry_run=True))
    marks = {"netem": " netem limit ", "nfqueue": " -j NFQUEUE "}
    assert marks[backend] in text, (backend, why)
    assert all(mark not in text for name, mark in marks.items() if name != backend), backend
    assert list(tmp_path.iterdir()) == []
    assert leftovers(LAB) == []


def test_a_failed_condition_is_journaled_and_the_sweep_goes_on(root_netns, tmp_path, tiny_pair):
    playbook = tmp_path / "strict.yaml"
    playbook.write_text(
        "name: strict\nlab: {devices: 1}\nworkload: {problems_per_device: 1, max_new_tokens: 16}\n"
        "impairment: {probe_packets: 50}\n"
        # no emulated link holds 85 ms to within a microsecond: the guard must refuse it
        "sweep:\n  impairment.rtt_tolerance_ms: [0.001, 1.0]\n"
    )
    outcome = execute(playbook, out=tmp_path / "results", say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (1, 1)
    first, second = RunStore(outcome.store.root).journal()
    assert first["status"] == "failed"
    assert "link does not measure as requested" in first["reason"]
    assert first["link"]["summary"]["rtt_measured_ms"] > 0  # what was measured is kept
    (tried,) = first["link"]["failed_tries"]  # probed again once before failing
    assert "link does not measure as requested" in tried["problem"]
    assert second["status"] == "done"
    assert leftovers(LAB) == []


SMALL = (
    "name: small\nlab: {devices: 2}\nworkload: {problems_per_device: 1, max_new_tokens: 16}\n"
    "impairment: {probe_packets: 50, backend: nfqueue}\nlink: {rtt_ms: 40, loss: 0.05}\n"
)


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("namespaces", "ip netns add tb-erun-dev2"),
        ("mininet", "addHost dev2"),
        ("inventory", "ip netns exec tb-edry-sw iptables-restore"),  # on the middlebox
        ("inventory-hosts", "root@10.78.6.1 -- 'iptables-restore"),  # on the server itself
    ],
)
def test_dry_run_prints_each_lab_kinds_commands(tmp_path, kind, needle):
    args = ["--lab", kind]
    if kind.startswith("inventory"):
        ns = EmulatedLab.up(
            LabSetup(name="edry", devices=2, subnet="10.78.6.0/24", state_dir=tmp_path / "ns"),
            runner=SystemRunner(dry_run=True, echo=lambda _l: None),
        )
        inv = describe_namespace_lab(ns, ns.inventory_hosts(), tmp_path / "inv.yml",
                                     middlebox=kind == "inventory")  # fmt: skip
        args = ["--inventory", str(inv)]
    (tmp_path / "small.yaml").write_text(SMALL)
    proc = subprocess.run(
        [*TESTBED, "run", str(tmp_path / "small.yaml"), "--dry-run", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "COLUMNS": "1000"},  # one command a line
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert needle in text
    makes_hosts = re.search(r"ip netns (add|attach) tb-erun-dev1", text) is not None
    assert makes_hosts == (kind in ("namespaces", "mininet"))  # an inventory's hosts exist
    held = "--physdev-in p-dev2" if kind != "inventory-hosts" else "-d 10.78.6.3/32 -i eth0"
    assert held in text and "agents.sled.device" in text
    # the reference answers: by the target on the server host, the same path on every kind
    assert re.search(r"\(server\): start reference: .* -m agents\.reference --model ", text)
    assert leftovers(LAB) == []


def test_same_experiment_on_all_three_lab_kinds(root_netns, tmp_path, tiny_pair):
    """The small experiment on lab kinds `namespaces` and `mininet`, then on kind `inventory`
    over namespace hosts (described in an inventory file alone), with a middlebox and with the
    hosts impairing their own links: each completes and records every link's requested and
    measured profile."""
    playbook = tmp_path / "small.yaml"
    playbook.write_text(SMALL)
    outcomes = {
        kind: execute(playbook, out=tmp_path / kind, lab_kind=kind, say=lambda _m: None)
        for kind in ("namespaces", "mininet")
    }
    setup = LabSetup(name="ehosts", devices=2, subnet="10.78.7.0/24", state_dir=tmp_path / "h")
    with EmulatedLab.running(setup) as ns:
        for where, middlebox in (("middlebox", True), ("hosts", False)):
            inv = describe_namespace_lab(
                ns, ns.inventory_hosts(), tmp_path / f"{where}.yml", middlebox=middlebox
            )
            outcomes[f"inventory/{where}"] = execute(
                playbook, out=tmp_path / where, inventory=str(inv), say=lambda _m: None
            )
    for kind, outcome in outcomes.items():
        reasons = [e.get("reason") for e in RunStore(outcome.store.root).journal()]
        assert (outcome.done, outcome.failed) == (1, 0), (kind, reasons)
        manifest = json.loads((outcome.store.root / "manifest.json").read_text())
        assert manifest["lab"]["kind"] == kind.split("/")[0]
        if kind.startswith("inventory/"):
            assert manifest["lab"]["impaired_on"] == ("hosts" if kind.endswith("hosts") else "mb")
        (entry,) = RunStore(outcome.store.root).journal()
        assert entry["link"]["requested"]["rtt_ms"] == 40
        probes = entry["link"]["probes"]
        assert set(probes) == {"dev1", "dev2"}
        # where the hosts hold their own packets (after the kernel stamps them), the holder's
        # release stamps timed every echo, and the guard kept its 1 ms tolerance everywhere
        # (netem on the hosts holds on the sender's egress: kernel stamps time it)
        held = kind == "inventory/hosts" and entry["link"]["backend"] == "nfqueue"
        assert entry["link"]["rtt_tolerance_ms"] == 1.0, kind
        for probe in probes.values():
            assert abs(probe["rtt_ms"]["p50"] - 40) <= 1.0, (kind, probe)
            assert probe["rx_user_space"] == (0 if held else None), (kind, probe)
        # emulated hosts pace every engine to their class's hardware; an inventory's hosts
        # are taken for real hardware: the model's time is only predicted beside each step
        pacing = pd.read_parquet(outcome.store.root / "conditions" / entry["condition"] /
                                 "pacing.parquet")  # fmt: skip
        assert set(pacing["dev"]) == {"server", "dev1", "dev2"}, kind
        assert set(pacing["paced"]) == {not kind.startswith("inventory/")}, kind
        assert (pacing["forwards"] > 0).all() and set(pacing["hardware"]) == {"pi5", "a100-80gb"}
        rounds = pd.read_parquet(outcome.store.root / "conditions" / entry["condition"] /
                                 "rounds.parquet")  # fmt: skip
        assert (rounds["draft_modelled_ms"] > 0).all(), kind
    assert leftovers(LAB) == [] and leftovers("ehosts") == []


def run_text(tmp_path: Path, text: str):
    """`testbed run` (the runner, in process) of the playbook `text`, results under tmp_path."""
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(text)
    return execute(playbook, out=tmp_path / "results", say=lambda _m: None)


def test_every_mode_gives_the_targets_greedy_output_at_zero_loss(root_netns, tmp_path, tiny_pair):
    """SLED with fixed and adaptive drafting and look-ahead, and the centralized baseline, run
    through the runner with the playbook's agent settings: at 0 % loss every answer is the
    target's own greedy answer; a swept device count uses the first N devices of one lab."""
    outcome = run_text(tmp_path, (
        "name: modes\nworkload: {problems_per_device: 2, max_new_tokens: 24}\n"
        "impairment: {probe_packets: 50}\nlink: {rtt_ms: 20}\n"
        "sled: {lookahead: 4, copies: 2}\n"
        "sweep:\n  mode: [sled, centralized]\n  sled.draft_policy: [fixed, adaptive]\n"
        "  lab.devices: [2]\n"
    ))  # fmt: skip
    assert (outcome.done, outcome.failed) == (4, 0)
    for entry in RunStore(outcome.store.root).journal():
        cid, mode = entry["condition"], entry["values"]["mode"]
        cond = outcome.store.root / "conditions" / cid
        requests = pd.read_parquet(cond / "requests.parquet")
        rounds = pd.read_parquet(cond / "rounds.parquet")
        assert len(requests) == 4 and set(requests["dev"]) == {"dev1", "dev2"}, cid
        assert requests["matches_target"].all(), requests[["dev", "text", "target_text"]]
        want = {"centralized"} if mode == "centralized" else {"verified"}
        assert set(rounds["mode"]) == want, cid
        if mode == "centralized":  # one round per token, as a stream shows them: TPOT > 0
            assert (rounds["tokens"] == 1).all() and len(rounds) == requests["tokens"].sum()
            row = pd.read_parquet(outcome.store.root / "conditions.parquet").set_index(
                "condition").loc[cid]  # fmt: skip
            assert row["tpot_p50_ms"] > 0 and row["ttft_p50_ms"] < row["e2e_p50_ms"]
        pacing = pd.read_parquet(cond / "pacing.parquet")  # centralized devices draft nothing
        want_engines = {("server", "target")} | (
            set() if mode == "centralized" else {("dev1", "draft"), ("dev2", "draft")}
        )
        assert set(zip(pacing["dev"], pacing["role"])) == want_engines, cid
        if entry["values"]["sled.draft_policy"] == "adaptive" and mode == "sled":
            assert rounds["draft_len"].between(3, 8).all()
        assert entry["link"]["failovers"] == []  # no backup path, no schedule: one phase
        assert {c["phase"] for c in entry["link"]["changes"]} == {0}
    assert leftovers(LAB) == []


def test_a_swept_device_class_paces_the_devices_to_its_hardware(root_netns, tmp_path, tiny_pair):
    """`lab.device_class` swept over one lab: each condition's devices carry the class in its
    hosts table and draft at that hardware's modelled speed (a Jetson Orin Nano drafts the 1B
    faster than a Pi 5); the server keeps its own class."""
    outcome = run_text(tmp_path, (
        "name: classes\ntopology: topologies/star.yaml\n"
        "models: {draft_as: llama-3.2-1b@q4_0, target_as: llama-3.1-8b@bf16}\n"
        "workload: {problems_per_device: 1, max_new_tokens: 16}\n"
        "impairment: {probe_packets: 30}\nlink: {rtt_ms: 20}\n"
        "sweep:\n  lab.device_class: [pi5, jetson-orin-nano]\n"
    ))  # fmt: skip
    assert (outcome.done, outcome.failed) == (2, 0)
    per_token = {}
    for entry in RunStore(outcome.store.root).journal():
        cls, cond = (
            entry["values"]["lab.device_class"],
            outcome.store.condition_dir(entry["condition"]),
        )
        hosts = pd.read_parquet(cond / "hosts.parquet").set_index("dev")["host_class"]
        assert hosts.to_dict() == {"server": "a100", "dev1": cls, "dev2": cls}, cls
        rounds = pd.read_parquet(cond / "rounds.parquet")
        per_token[cls] = float((rounds["draft_modelled_ms"] / rounds["draft_len"]).median())
    assert per_token["jetson-orin-nano"] < 0.7 * per_token["pi5"], per_token
    assert leftovers(LAB) == []


@pytest.mark.parametrize("kind", ["namespaces", "mininet"])
def test_a_cut_primary_path_moves_a_run_to_the_backup_and_devices_keep_verifying(
    root_netns, tmp_path, tiny_pair, kind
):
    """A topology with a backup path, its primary link cut by a schedule a few seconds in and
    for the rest of the run: the monitor's failover is in the condition's records, and the
    device's rounds after it are verified (over the backup path), none lost to fallback. The
    same on the namespace lab and on Mininet (whose switch namespace carries both bridges)."""
    (tmp_path / "topo.yaml").write_text(
        "name: bk\nserver: {class: a100}\nfleet:\n  - {class: pi5, count: 1}\n"
        "profiles:\n  wifi: {rtt_ms: 20}\n  5g: {rtt_ms: 0}\n"
        "links: {primary: wifi, backup: 5g}\n"
    )
    playbook = tmp_path / "cut.yaml"
    playbook.write_text(
        f"name: cut\ntopology: topo.yaml\nlab: {{kind: {kind}}}\n"
        "workload: {problems_per_device: 30, max_new_tokens: 48}\n"
        "impairment: {probe_packets: 50}\n"
        "link: {rtt_ms: 20, schedule: [{at_s: 6, loss: 1.0}]}\n"
    )
    outcome = execute(playbook, out=tmp_path / "results", say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (1, 0)
    assert outcome.store.manifest()["lab"]["kind"] == kind
    (entry,) = RunStore(outcome.store.root).journal()
    failovers = entry["link"]["failovers"]
    assert [(f["device"], f["to"]) for f in failovers][:1] == [("dev1", "backup")], failovers
    cut_at = [c["at"] for c in entry["link"]["changes"] if c["phase"] == 1]
    assert cut_at and failovers[0]["t"] > min(cut_at)  # the switch follows the cut
    rounds = pd.read_parquet(
        outcome.store.root / "conditions" / entry["condition"] / "rounds.parquet"
    )
    after = rounds[rounds["t_start"] > failovers[0]["t"]]
    assert len(after) > 0 and (after["mode"] == "verified").all()
    changes = pd.read_parquet(
        outcome.store.root / "conditions" / entry["condition"] / "link_changes.parquet"
    )
    assert "failover to backup" in set(changes["note"])
    cut = changes[changes["note"].str.endswith("phase 1")]
    assert len(cut) == 2 and (cut["loss"] == 1.0).all() and (cut["rtt_ms"] == 20.0).all()
    # the cross-host figures: every clock here is the controller's kernel clock (offset 0)
    metrics = entry["metrics"]
    assert (metrics["clock_offset_max_s"], metrics["clock_error_max_s"]) == (0.0, 0.0)
    assert metrics["failover_max_s"] >= failovers[0]["t"] - max(cut_at) > 0
    assert leftovers(LAB) == []


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason=f"no GSM8K test split at {GSM8K_TEST}")
def test_gsm8k_runs_on_the_real_test_split_with_models_given_by_path(
    root_netns, tmp_path, tiny_pair, monkeypatch
):
    """experiments/gsm8k.yaml's set-up with the models named by path (the tiny pair's files):
    real GSM8K test problems, lm-eval's prompt, scored strict and flexible against the
    data set's answers, with the target's own answers beside them."""
    monkeypatch.setenv("TESTBED_LAB_NAME", "egsm")
    monkeypatch.setenv("TESTBED_LAB_SUBNET", "10.78.8.0/24")
    shipped = yaml.safe_load((REPO / "experiments" / "gsm8k.yaml").read_text())
    shipped.update(name="gsm8k-by-path", sweep={}, impairment={"probe_packets": 50})
    shipped["models"] = {"draft": str(tiny_pair.draft_gguf), "target": str(tiny_pair.target_hf)}
    shipped["lab"] = {"kind": "namespaces", "devices": 1}
    shipped["workload"].update(gsm8k_path=str(GSM8K_TEST), problems_per_device=2,
                               max_new_tokens=24)  # fmt: skip
    playbook = tmp_path / "gsm8k.yaml"
    playbook.write_text(yaml.safe_dump(shipped))
    outcome = execute(playbook, out=tmp_path / "results", say=lambda _m: None)
    assert (outcome.done, outcome.failed) == (1, 0)
    (entry,) = RunStore(outcome.store.root).journal()
    requests = pd.read_parquet(
        outcome.store.root / "conditions" / entry["condition"] / "requests.parquet"
    )
    questions = {json.loads(line)["question"] for line in GSM8K_TEST.read_text().splitlines()}
    assert len(requests) == 2
    for _, r in requests.iterrows():
        assert r["reference"] and r["strict_correct"] is not None
        assert r["matches_target"]  # 0 % loss: the target's own greedy answer
    manifest = json.loads((outcome.store.root / "manifest.json").read_text())
    assert manifest["models"]["target"] == str(tiny_pair.target_hf)
    problems = (outcome.store.root / "conditions" / entry["condition"] / "inputs").glob("*.jsonl")
    prompts = [json.loads(x)["prompt"] for f in problems for x in f.read_text().splitlines()]
    assert len(prompts) == 2 and all(p.startswith("Question: ") for p in prompts)
    assert all(any(q in p for q in questions) for p in prompts)
    assert leftovers("egsm") == []
