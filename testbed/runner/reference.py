"""The target model's own greedy answers, what every output of a run is compared with
(`matches_target`, `=target`, BALANCE's `outputs_equal_target`), computed on the server host by
the model the server runs there.

One mechanism for every mode and every lab kind: `target_answers` writes the problems the
run has no answer for yet to the server host, runs `agents.reference` there through Fabric
(the way the runner starts every agent) on the server's target model (`model_on`: on lab kind
`inventory` the file the site playbook placed; on an emulated lab the controller's), with the
server's torch device and threads, and fetches the answers (text, token ids and the prompt's
token ids). On a lab of real hardware `=target` therefore compares with the model the hosts
run, not with the controller's.

The run keeps every answer in its `reference_answers.json` (`ReferenceBook`), keyed
`<problem id>@<max_new>` (`@<max_new>h` for an answer held to its length) so that a sweep of
the answer length gets its own entries, each
naming the computation it came from: where (`host`), with which model file (`model`, and its
files' sha256 where already known: the controller's digests of the manifest on an emulated
lab, the inventory's `target_checkpoint.files` that the site playbook checked when it placed
them), engine, device, threads and tokenizer. An answer is reused only for the same server
host, model path and device; the run's manifest lists the computations under `reference`.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.workloads.arithmetic import Problem
from testbed.config.playbook import Condition
from testbed.core.errors import AgentError
from testbed.core.files import atomic_write_json
from testbed.hosts.inventory import InventoryHost
from testbed.runner.agents import AGENT_ENV, model_on, wait_for_exit
from testbed.runner.workload import request_item

if TYPE_CHECKING:
    from testbed.runner.context import RunContext

AGENT = "agents.reference"
REMOTE_DIR = "reference"  # under the server's workdir: the problems given, the answers written
LOAD_ALLOWANCE_S = 180.0  # real seconds the agent may take to load the model
PER_TOKEN_S = 0.5  # and per token it may generate (a slow CPU host's 8B model, with margin)
FORMAT = 2  # of reference_answers.json; 1 was a flat {key: text} computed on the controller
WHERE = ("host", "model", "sha256", "sha256_from", "engine", "device", "tokenizer_hash")
"""The fields of a computation the manifest lists (the rest: its size and time)."""


@dataclass(frozen=True)
class Answer:
    """One problem's reference: the target's greedy answer and the ids it was computed from."""

    text: str
    tokens: tuple[int, ...]
    prompt_tokens: tuple[int, ...]


def key(problem: Problem, max_new: int) -> str:
    """A problem's answer's key in reference_answers.json (max_new: the workload's limit, for
    a problem not held to a length of its own)."""
    if problem.max_new is not None:
        return f"{problem.id}@{problem.max_new}h"
    return f"{problem.id}@{max_new}"


@dataclass
class ReferenceBook:
    """The run's reference answers (`path`, its reference_answers.json; None: a dry run,
    nothing kept), the sha256 the controller already computed of its model files
    (`digests`, path -> file -> sha256, as in the manifest) and who is told the list of
    computations each time one is added (`on_computed`, the manifest)."""

    path: Path | None
    digests: dict[str, dict[str, str]] = field(default_factory=dict)
    on_computed: Callable[[list[dict[str, Any]]], None] = lambda _computed: None

    def load(self) -> dict[str, Any]:
        """The file's contents (empty where there is none, or where it has the old form)."""
        empty: dict[str, Any] = {"format": FORMAT, "computed": [], "answers": {}}
        if self.path is None or not self.path.exists():
            return empty
        doc = json.loads(self.path.read_text())
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return empty  # the old controller-side answers: computed again on the server
        return doc

    def save(self, doc: dict[str, Any]) -> None:
        if self.path is not None:
            atomic_write_json(self.path, doc)
        self.on_computed([{k: c.get(k) for k in WHERE} for c in unique_where(doc["computed"])])


def unique_where(computed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The computations, one per distinct place and model (the first of each)."""
    seen, out = set(), []
    for c in computed:
        ident = json.dumps([c.get(k) for k in WHERE], sort_keys=True)
        if ident not in seen:
            seen.add(ident)
            out.append(c)
    return out


def server_threads(cond: Condition) -> int:
    """The torch threads the condition's server loads its target with."""
    pb = cond.playbook
    return pb.balance.threads if pb.mode == "balance" else pb.sled.server_threads


def model_sha256(
    server: InventoryHost, model: str, emulated: bool, digests: dict[str, dict[str, str]]
) -> tuple[dict[str, str] | None, str | None]:
    """The sha256 of the server's model files where already computed, and by whom: the
    controller's (an emulated lab's hosts read the controller's files), or the inventory's
    `target_checkpoint.files` (which the site playbook checked the placed files against);
    (None, None) where neither knows them (not computed again here)."""
    if emulated and digests.get(model):
        return dict(digests[model]), "controller"
    checkpoint = server.vars.get("target_checkpoint")
    files = checkpoint.get("files") if isinstance(checkpoint, dict) else None
    if isinstance(files, dict) and Path(model).name == str(checkpoint.get("name")):
        sha = {str(k): str(v) for k, v in files.items()}
        return sha, "inventory target_checkpoint.files (checked by the site playbook)"
    return None, None


def reference_command(
    host: InventoryHost, model: str, device: str, threads: int, max_new: int, problems: str,
    out: str,
) -> str:  # fmt: skip
    """`agents.reference` on the server host."""
    return shlex.join([
        host.agent_python, "-m", AGENT, "--model", model, "--device", device,
        "--threads", str(threads), "--max-new", str(max_new), "--problems", problems,
        "--out", out,
    ])  # fmt: skip


def target_answers(
    ctx: RunContext, cond: Condition, problems: list[Problem], max_new: int
) -> dict[str, Answer]:
    """problem id -> the target's greedy answer of at most `max_new` tokens (or of exactly a
    held problem's own length), computed on the server host for those the run's book lacks
    (empty in a dry run, which prints the steps)."""
    server = ctx.lab.inventory().server
    model = model_on(server, "target_model", ctx.target_model)
    device = cond.playbook.models.server_device
    book = ctx.references
    doc = book.load()
    same = {
        i for i, c in enumerate(doc["computed"])
        if (c.get("host"), c.get("model"), c.get("device")) == (server.name, model, device)
    }  # fmt: skip
    known = {k: a for k, a in doc["answers"].items() if a.get("by") in same}
    missing = list({p.id: p for p in problems if key(p, max_new) not in known}.values())
    if missing:
        ctx.say(f"{cond.id}: reference answers of {len(missing)} problems by the target on "
                f"{server.name} ({model})")  # fmt: skip
        got = compute_on(ctx, server, model, device, server_threads(cond), missing, max_new)
        if ctx.dry_run:
            return {}
        sha, sha_from = model_sha256(server, model, ctx.lab.emulated, book.digests)
        doc["computed"].append({
            "host": server.name, "hostname": got["host"], "model": model, "sha256": sha,
            "sha256_from": sha_from,
            "engine": got["engine"], "device": device, "threads": got["threads"],
            "tokenizer_hash": got["tokenizer_hash"], "max_new": max_new,
            "problems": len(missing), "seconds": got["seconds"],
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        })  # fmt: skip
        by = len(doc["computed"]) - 1
        by_id = {p.id: p for p in missing}
        for a in got["answers"]:
            k = key(by_id[a["id"]], max_new)
            known[k] = doc["answers"][k] = {
                "text": a["text"], "tokens": a["tokens"], "prompt_tokens": a["prompt_tokens"],
                "by": by,
            }  # fmt: skip
        book.save(doc)
    if ctx.dry_run:
        return {}
    return {
        p.id: Answer(a["text"], tuple(a["tokens"]), tuple(a["prompt_tokens"]))
        for p in problems
        for a in [known[key(p, max_new)]]
    }


def compute_on(
    ctx: RunContext, server: InventoryHost, model: str, device: str, threads: int,
    problems: list[Problem], max_new: int,
) -> dict[str, Any]:  # fmt: skip
    """Run `agents.reference` on the server over `problems`; what it wrote (`{}` in a dry
    run). AgentError, with the agent's log, where it fails or answers other problems."""
    hosts = ctx.hosts
    remote = f"{server.workdir}/{REMOTE_DIR}"
    given, out = f"{remote}/problems-{max_new}.json", f"{remote}/answers-{max_new}.json"
    hosts.run(server, f"mkdir -p {shlex.quote(remote)} && rm -f {shlex.quote(out)}")
    with tempfile.TemporaryDirectory(prefix="reference-") as tmp:
        local = Path(tmp) / "problems.json"
        local.write_text(json.dumps([request_item(p) for p in problems]))
        hosts.put(server, local, given)
        proc = hosts.start(server, "reference",
                           reference_command(server, model, device, threads, max_new, given, out),
                           env=AGENT_ENV)  # fmt: skip
        if ctx.dry_run:
            return {}
        tokens = sum(p.max_new or max_new for p in problems)
        timeout = LOAD_ALLOWANCE_S + PER_TOKEN_S * tokens
        try:
            wait_for_exit(hosts, [proc], timeout)
        finally:
            if hosts.is_alive(proc):
                hosts.stop(proc)
        got = json.loads(hosts.get(server, out, Path(tmp) / "answers.json").read_text())
    asked = [p.id for p in problems]
    answered = [a.get("id") for a in got.get("answers", [])]
    if answered != asked:
        raise AgentError(
            f"{server.name}: {AGENT} answered {len(answered)} problems, not the {len(asked)} "
            f"asked ({out}); see its log {proc.log_file}"
        )
    return got
