"""Reference answers: `agents.reference` on the tiny pair (what it answers, and the errors of a
malformed problems file), and the runner's one mechanism around it
(`testbed.runner.reference.target_answers`: run on the server host for the problems the run
lacks, kept in reference_answers.json by answer length and by the model that answered),
through a stand-in for HostControl that runs each command on this machine."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents import reference as agent
from agents.engines.factory import load_engine
from agents.spec.decoding import generate_ad
from agents.workloads.arithmetic import heldout_problems, prompt
from testbed.config.playbook import Condition, Playbook
from testbed.core.command import CommandResult
from testbed.hosts.control import RemoteProcess
from testbed.hosts.inventory import Inventory, InventoryHost
from testbed.runner.context import RunContext
from testbed.runner.reference import ReferenceBook, target_answers

REPO = Path(__file__).resolve().parent.parent


def write(path: Path, obj: object) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


# --- the agent ------------------------------------------------------------------------------


def test_the_agent_answers_with_the_targets_own_greedy_output(tmp_path, tiny_pair):
    problems = heldout_problems(3, seed=7)
    given = write(tmp_path / "p.json", [{"id": p.id, "prompt": prompt(p)} for p in problems])
    out = tmp_path / "sub" / "answers.json"
    argv = ["--model", str(tiny_pair.target_hf), "--problems", str(given), "--max-new", "12",
            "--out", str(out)]  # fmt: skip
    assert agent.main(argv) == 0
    doc = json.loads(out.read_text())
    engine = load_engine(tiny_pair.target_hf, threads=1)
    assert [a["id"] for a in doc["answers"]] == [p.id for p in problems]
    for p, a in zip(problems, doc["answers"], strict=True):
        ids = engine.tokenize(prompt(p))
        tokens = generate_ad(engine, ids, 12).tokens
        assert a["prompt_tokens"] == ids and a["tokens"] == tokens
        assert a["text"] == engine.detokenize(tokens) and 0 < len(tokens) <= 12
    assert doc["model"] == str(tiny_pair.target_hf) and doc["max_new"] == 12
    assert doc["engine"] == f"torch:{tiny_pair.target_hf}" and doc["device"] == "cpu"
    assert doc["tokenizer_hash"] == engine.tokenizer_hash and doc["host"]
    assert not list(out.parent.glob("*.partial"))


def test_an_empty_list_gets_no_answers(tmp_path, tiny_pair):
    out = tmp_path / "answers.json"
    argv = ["--model", str(tiny_pair.target_hf), "--problems", str(write(tmp_path / "p.json", [])),
            "--max-new", "4", "--out", str(out)]  # fmt: skip
    assert agent.main(argv) == 0
    assert json.loads(out.read_text())["answers"] == []


BAD = [
    ("{not json", "not JSON"),
    ({"id": "a", "prompt": "Q"}, "expected a JSON list of problems, got dict"),
    (["Q: 1+1"], "problems[0]: expected an object, got str"),
    ([{"id": "a", "prompt": "Q"}, {"id": "b"}], "problems[1]: lacks the field 'prompt'"),
    ([{"prompt": "Q"}], "problems[0]: lacks the field 'id'"),
    ([{"id": 3, "prompt": "Q"}], "problems[0].id: expected a string, got int 3"),
    ([{"id": "a", "prompt": ["Q"]}], "problems[0].prompt: expected a string, got list"),
    ([{"id": "", "prompt": "Q"}], "problems[0].id: empty"),
    ([{"id": "a", "prompt": "Q"}, {"id": "a", "prompt": "R"}], "problems[1].id: 'a' appears twice"),
]


@pytest.mark.parametrize(("content", "says"), BAD, ids=[s for _, s in BAD])
def test_a_malformed_problems_file_is_named_with_its_field(tmp_path, capsys, content, says):
    """Refused before any model is loaded (the model path here does not exist)."""
    given = write(tmp_path / "problems.json", content)
    argv = ["--model", str(tmp_path / "no-model"), "--problems", str(given), "--max-new", "4",
            "--out", str(tmp_path / "a.json")]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        agent.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"{given}: " in err and says in err
    assert not (tmp_path / "a.json").exists()


def test_a_missing_problems_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        agent.main(["--model", "m", "--problems", str(tmp_path / "none.json"), "--max-new", "4",
                    "--out", str(tmp_path / "a.json")])  # fmt: skip
    assert f"{tmp_path / 'none.json'}: cannot read the problems file" in capsys.readouterr().err


def test_the_agent_runs_as_a_module_and_exits_2_on_bad_input(tmp_path):
    given = write(tmp_path / "problems.json", [{"id": "a"}])
    res = subprocess.run(
        [sys.executable, "-m", "agents.reference", "--model", "m", "--problems", str(given),
         "--max-new", "4", "--out", str(tmp_path / "a.json")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert f"{given}: problems[0]: lacks the field 'prompt'" in res.stderr


# --- the runner's mechanism -----------------------------------------------------------------


class LocalHosts:
    """HostControl's calls that `target_answers` makes, run on this machine: every "host" is
    a folder here; `start` runs the agent to its end at once."""

    dry_run = False

    def __init__(self) -> None:
        self.started: list[str] = []

    def run(self, host, command, check=True, **_):
        res = subprocess.run(command, shell=True, cwd=host.workdir, capture_output=True,
                             text=True)  # fmt: skip
        assert res.returncode == 0 or not check, res.stderr
        return CommandResult(command, res.returncode, res.stdout, res.stderr, host.name)

    def put(self, host, local, remote):
        shutil.copy(local, remote)

    def get(self, host, remote, local):
        shutil.copy(remote, local)
        return Path(local)

    def start(self, host, name, command, env=None):
        """The agent's command line, run in this process to its end (its log: what it said)."""
        self.started.append(command)
        argv = shlex.split(command)
        assert argv[:3] == [host.python, "-m", "agents.reference"], argv
        log = Path(host.workdir) / f"{name}.log"
        with log.open("w") as fh, redirect_stdout(fh), redirect_stderr(fh):
            try:
                rc = agent.main(argv[3:])
            except SystemExit as exc:
                rc = exc.code
            except Exception as exc:  # as the process would end
                print(f"{type(exc).__name__}: {exc}", file=fh)
                rc = 1
        (Path(host.workdir) / f"{name}.rc").write_text(str(rc))
        return RemoteProcess(host.name, name, 1, host.workdir, "", str(log),
                             f"{host.workdir}/{name}.rc")  # fmt: skip

    def is_alive(self, proc):
        return False

    def exit_code(self, proc):
        return int(Path(proc.rc_file).read_text())

    def log_tail(self, proc, lines=40):
        return Path(proc.log_file).read_text()


def lab_of(tmp_path: Path, target: str, **server_vars) -> SimpleNamespace:
    server = InventoryHost(name="a100", role="server", address="10.0.0.1", user="edge",
                           workdir=str(tmp_path / "a100"), python=sys.executable,
                           vars={"target_model": target, **server_vars})  # fmt: skip
    Path(server.workdir).mkdir()
    inventory = Inventory(source="test", hosts=(server,))
    return SimpleNamespace(inventory=lambda: inventory, emulated=False)


def condition(max_new: int = 10, mode: str = "sled") -> Condition:
    pb = Playbook.model_validate({"name": "r", "mode": mode,
                                  "workload": {"max_new_tokens": max_new}})  # fmt: skip
    return Condition(id=f"c-{max_new}", index=0, values={}, playbook=pb)


def test_the_runner_computes_missing_answers_on_the_server_once_per_length(tmp_path, tiny_pair):
    target = str(tiny_pair.target_hf)
    sha = {"config.json": "ab" * 32}
    told: list[list[dict]] = []
    book = ReferenceBook(tmp_path / "reference_answers.json", {}, told.append)
    hosts = LocalHosts()
    lab = lab_of(tmp_path, target, target_checkpoint={"name": Path(target).name, "files": sha})
    ctx = RunContext(lab, hosts, "d", "/controller/target", book, lambda _m: None)
    problems = heldout_problems(3, seed=11)

    first = target_answers(ctx, condition(10), problems[:2], 10)
    assert len(hosts.started) == 1 and f"--model {target}" in hosts.started[0]
    again = target_answers(ctx, condition(10), problems, 10)  # only the third is missing
    assert len(hosts.started) == 2 and again[problems[0].id] == first[problems[0].id]
    shorter = target_answers(ctx, condition(4), problems, 4)  # its own entries
    assert len(hosts.started) == 3 and "--max-new 4" in hosts.started[2]
    target_answers(ctx, condition(4), problems, 4)
    assert len(hosts.started) == 3  # all known

    engine = load_engine(target, threads=1)
    for answers, n in ((again, 10), (shorter, 4)):
        for p in problems:
            ids = engine.tokenize(prompt(p))
            assert answers[p.id].prompt_tokens == tuple(ids)
            assert answers[p.id].tokens == tuple(generate_ad(engine, ids, n).tokens)
    doc = json.loads(book.path.read_text())
    assert set(doc["answers"]) == {f"{p.id}@{n}" for p in problems for n in (10, 4)}
    assert [(c["max_new"], c["problems"]) for c in doc["computed"]] == [(10, 2), (10, 1), (4, 3)]
    where = doc["computed"][0]
    assert where["host"] == "a100" and where["model"] == target and where["sha256"] == sha
    assert where["sha256_from"].startswith("inventory target_checkpoint.files")
    assert told[-1] == [{k: where[k] for k in told[-1][0]}]  # the manifest: one place, one model


def test_another_model_is_asked_again_and_an_old_file_is_replaced(tmp_path, tiny_pair):
    book = ReferenceBook(tmp_path / "reference_answers.json")
    book.path.write_text(json.dumps({"h0@10": "computed on the controller"}))  # the old form
    hosts = LocalHosts()
    ctx = RunContext(lab_of(tmp_path, str(tiny_pair.target_hf)), hosts, "d", "t", book, print)
    problems = heldout_problems(1, seed=3)
    target_answers(ctx, condition(), problems, 10)
    assert len(hosts.started) == 1
    doc = json.loads(book.path.read_text())
    assert doc["format"] == 2 and doc["computed"][0]["sha256"] is None
    doc["computed"][0]["model"] = "/elsewhere/other-target"  # as if another model answered
    book.path.write_text(json.dumps(doc))
    target_answers(ctx, condition(), problems, 10)
    assert len(hosts.started) == 2


def test_a_failing_agent_stops_the_condition_with_its_log(tmp_path):
    book = ReferenceBook(tmp_path / "reference_answers.json")
    ctx = RunContext(lab_of(tmp_path, str(tmp_path / "no-model")), LocalHosts(), "d", "t", book,
                     print)  # fmt: skip
    with pytest.raises(Exception, match="reference exited with 1") as exc:
        target_answers(ctx, condition(), heldout_problems(1, seed=3), 10)
    assert "no-model" in str(exc.value)
    assert not book.path.exists()
