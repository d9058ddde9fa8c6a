"""One BALANCE condition on a lab: users arrive at one hybrid AD/SD server under a memory budget.

The runner writes the condition's users (arithmetic problems with their output lengths,
mixed deadlines and Poisson arrival times) to the server host, where
`agents.balance.server` replays their arrivals through admission control and the
engine loop on the real models; users do not come from the devices over the lab's links. The
same workload goes through the simulator on the controller, driven by the same cost model
(measured on the server host once per run with `testbed profile`, unless `balance.profile`
names one). Stored per condition: `balance_users.parquet` (one row per user: mode,
measured and predicted completion, within deadline, output equal to the target's greedy
output) and the journal's metrics (task throughput, memory against the budget, predicted
against measured).
"""

from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from agents.balance.costmodel import CostModel
from agents.balance.problem import Users, default_service, make_instance, servable_alone
from agents.balance.rescue import MOVED_TO_AD
from agents.balance.serve import ServeResult, Workload, workload_span_s
from agents.records import read_records
from agents.spec.decoding import generate_ad
from agents.workloads.arithmetic import heldout_problems, prompt
from testbed.balance.cost_file import read_cost_model
from testbed.balance.simulator import simulate
from testbed.config.playbook import BalanceSection, Condition, Playbook
from testbed.core.errors import BadInputError
from testbed.core.files import atomic_write_json
from testbed.hosts.inventory import InventoryHost
from testbed.metrics.condition_stats import pacing_figures
from testbed.results.store import ConditionFolder
from testbed.results.tables import pacing_frame, write_parquet, write_typed
from testbed.runner.agents import AGENT_ENV, fetch, model_on, place_emulation, wait_for_exit
from testbed.runner.context import RunContext, condition_dilation
from testbed.runner.emulation import EMULATION_FILE, ConditionTime, emulation_tag

SERVER_FILES = ("served.jsonl", "summary.json", "pacing.jsonl")
COST_MODEL = "cost-model.json"  # in the condition's folder: the cost model it ran with
MIB = 2**20


@functools.lru_cache(maxsize=2)
def _engine(model_dir: str):
    from agents.engines.torch_hf import TorchEngine

    return TorchEngine(model_dir, threads=1)


@functools.lru_cache(maxsize=4096)
def reference_tokens(target: str, question: str, max_new: int) -> tuple[int, ...]:
    """The target's own greedy output for a prompt (computed on the controller, once)."""
    engine = _engine(target)
    return tuple(generate_ad(engine, engine.tokenize(question), max_new).tokens)


def draft_folder(draft: str) -> str:
    """The draft as an HF folder (the server runs both models in PyTorch): the tiny pair's
    when the run resolved `tiny` to its GGUF."""
    if not draft.endswith(".gguf"):
        return draft
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    if Path(draft) == pair.draft_gguf:
        return str(pair.draft_hf)
    raise BadInputError(f"models.draft: balance mode needs an HF folder, not {draft}")


def user_rows(pb: Playbook, target: str) -> list[dict[str, Any]]:
    """The condition's users: held-out arithmetic problems, each asking for the length of the
    target's greedy answer, with a deadline of base + length x a per-token time drawn from the
    playbook's range, arriving as a Poisson process of `balance.rate_per_s` (drawn from
    `seed` + `workload.arrival.seed`, which a repetition shifts)."""
    b = pb.balance
    rng = np.random.default_rng(pb.seed + pb.workload.arrival.seed)
    problems = heldout_problems(b.users, seed=pb.workload.seed)
    max_new = pb.workload.max_new_tokens
    arrivals = np.cumsum(rng.exponential(1 / b.rate_per_s, b.users))
    per_token = rng.uniform(*b.deadline_per_token_s, b.users)
    rows = []
    for i, p in enumerate(problems):
        ref = reference_tokens(target, prompt(p), max_new)
        rows.append(
            {
                "uid": i,
                "problem": p.id,
                "prompt": prompt(p),
                "prompt_tokens": len(_engine(target).tokenize(prompt(p))),
                "max_new": max_new,
                "output_tokens": len(ref),
                "reference": list(ref),
                "deadline_s": b.deadline_base_s + len(ref) * float(per_token[i]),
                "arrival_s": float(arrivals[i]),
            }
        )
    return rows


def workload_of(rows: list[dict[str, Any]]) -> Workload:
    users = Users(
        prompt=np.array([r["prompt_tokens"] for r in rows]),
        output=np.array([r["output_tokens"] for r in rows]),
        deadline=np.array([r["deadline_s"] for r in rows]),
    )
    return Workload(users, np.array([r["arrival_s"] for r in rows]))


def cost_model_on(
    ctx: RunContext, server: InventoryHost, pb: Playbook, staged: ConditionFolder, emulation: str,
    tag: str,
    models: tuple[str, str],
) -> CostModel:  # fmt: skip
    """The run's cost model, on the server host and in `staged/cost-model.json`: the file
    `balance.profile` names, or measured on the server host by `agents.balance.measure` on
    `models` (draft, target) with the server's engines as they run (the emulation file
    `emulation`, whose contents `tag` names)
    the first time a run needs it (kept in the lab's server workdir, which goes with the
    lab)."""
    hosts, b = ctx.hosts, pb.balance
    local = staged.file(COST_MODEL)
    if b.profile is None and (pb.models.draft, pb.models.target) != ("tiny", "tiny"):
        raise BadInputError("balance.profile: required unless both models are tiny")
    if b.profile is not None:
        cost = read_cost_model(Path(b.profile))
        if cost.draft_len != b.draft_len:
            raise BadInputError(
                f"{b.profile}: draft_len {cost.draft_len} differs from balance.draft_len "
                f"{b.draft_len}"
            )
        atomic_write_json(local, cost.as_dict())
        return cost
    remote = (
        f"{server.workdir}/balance/cost-model-g{b.draft_len}-t{b.threads}-r{b.profile_repeats}"
        f"-{tag}.json"
    )
    exists = hosts.run(server, f"test -f {shlex.quote(remote)}", check=False).ok
    if ctx.dry_run or not exists:
        ctx.say(f"profiling the cost model on {server.name} (agents.balance.measure)")
        hosts.run(
            server,
            shlex.join([
                server.python, "-m", "agents.balance.measure", "--out", remote,
                "--draft", models[0], "--target", models[1],
                "--draft-len", str(b.draft_len), "--repeats", str(b.profile_repeats),
                "--threads", str(b.threads), "--device", pb.models.server_device,
                "--emulation", emulation,
            ]),
            env=AGENT_ENV,
        )  # fmt: skip
    if ctx.dry_run:
        return None  # type: ignore[return-value]
    hosts.get(server, remote, local)
    return read_cost_model(local)


def server_command(
    host: InventoryHost, cond: Condition, target: str, draft: str, records: str, cost: str
) -> str:
    """The BALANCE server's command line (its emulation file beside its records)."""
    b = cond.playbook.balance
    return shlex.join([
        host.python, "-m", "agents.balance.server",
        "--users", f"{records}/users.jsonl",
        "--cost", cost,
        "--target", target,
        "--draft", draft,
        "--policy", b.policy,
        "--memory-bytes", str(b.memory_mib * MIB),
        "--fixed-share", str(b.fixed_share),
        "--period-s", str(b.period_s),
        "--threads", str(b.threads),
        "--device", cond.playbook.models.server_device,
        "--records", records,
        "--emulation", f"{records}/{EMULATION_FILE}",
    ])  # fmt: skip


def user_table(
    rows: list[dict[str, Any]], served: list[dict[str, Any]], predicted: ServeResult, cid: str
) -> pd.DataFrame:
    """One row per user: its request, the measured service and the simulator's prediction."""
    by_uid = {s["uid"]: s for s in served}
    out = []
    for r in rows:
        s = by_uid.get(r["uid"], {})
        out.append(
            {
                "condition": cid,
                "uid": r["uid"],
                "problem": r["problem"],
                "arrival_s": r["arrival_s"],
                "deadline_s": r["deadline_s"],
                "prompt_tokens": r["prompt_tokens"],
                "output_tokens": r["output_tokens"],
                "mode": s.get("mode"),
                "admission": s.get("admission"),
                "completion_s": s.get("completion_s"),
                "met": s.get("met"),
                "matches_target": s["tokens"] == r["reference"] if s.get("tokens") else None,
                "predicted_mode": ("unserved", "AD", "SD")[int(predicted.mode[r["uid"]])],
                "predicted_completion_s": float(predicted.finish[r["uid"]] - r["arrival_s"]),
                "predicted_met": bool(predicted.met[r["uid"]]),
            }
        )
    return pd.DataFrame(out)


PREDICTION_DRAWS = 10  # simulated runs per condition, differing in the drafts accepted


def condition_metrics(
    users: pd.DataFrame,
    summary: dict[str, Any],
    predicted: list[ServeResult],
    b: BalanceSection,
    ceiling: int,
) -> dict[str, Any]:
    """The condition's figures: task throughput, memory against the budget, prediction error.

    The simulator draws each SD round's accepted drafts at random, and with a few dozen users
    one draw moves a user across its deadline or an admission: the predicted users in time
    and task throughput are the mean over PREDICTION_DRAWS draws (the per-user predictions
    come from the first). `ceiling`: users some mode could serve in time alone
    (`problem.servable_alone`), which no policy exceeds.
    """
    served = users[users["mode"].isin(["AD", "SD"])]
    both = served.dropna(subset=["completion_s", "predicted_completion_s"])
    error = both["predicted_completion_s"] / both["completion_s"] - 1
    in_time = int(users["met"].fillna(False).astype(bool).sum())
    span = workload_span_s(users["arrival_s"].to_numpy(), users["deadline_s"].to_numpy())
    throughput = in_time / span if span else 0.0
    predicted_throughput = float(np.mean([p.task_throughput for p in predicted]))
    budget = b.memory_mib * MIB
    peak = max(summary["peak_reserved_bytes"], summary["peak_held_bytes"])
    return {
        "policy": b.policy,
        "users": len(users),
        "admitted": len(served),
        "refused": len(users) - len(served),
        "ad_users": int((served["mode"] == "AD").sum()),
        "sd_users": int((served["mode"] == "SD").sum()),
        "moved_to_ad": int(served["admission"].str.contains(MOVED_TO_AD).sum()),
        "served_in_time": in_time,
        "servable_alone": ceiling,
        "late": len(served) - in_time,
        "makespan_s": summary["makespan_s"],
        "loop_behind_max_ms": summary["most_behind_s"] * 1000,
        "steal_ms": summary["steal_ms"],
        "span_s": span,
        "task_throughput": throughput,
        "outputs_equal_target": int(served["matches_target"].fillna(False).sum()),
        "memory_budget_mib": b.memory_mib,
        "peak_reserved_mib": summary["peak_reserved_bytes"] / MIB,
        "peak_held_mib": summary["peak_held_bytes"] / MIB,
        "memory_within_budget": bool(peak <= budget),
        "rss_peak_mib": summary["rss_peak_bytes"] / MIB,
        "rss_growth_mib": (summary["rss_peak_bytes"] - summary["rss_loaded_bytes"]) / MIB,
        "predicted_served_in_time": float(np.mean([p.served_in_time for p in predicted])),
        "predicted_task_throughput": predicted_throughput,
        "predicted_task_throughput_error": predicted_throughput / throughput - 1
        if throughput
        else None,
        "completion_error_mean_abs": float(error.abs().mean()) if len(error) else None,
        "completion_error_median": float(error.median()) if len(error) else None,
        "completion_compared_users": len(error),
    }


def describe(cid: str, b: BalanceSection, m: dict[str, Any]) -> str:
    """One console line: what the condition served and how well the simulator predicted it."""
    err = m["completion_error_mean_abs"]
    return (
        f"{cid}: {b.policy} {m['users']} users {b.memory_mib:g} MiB: {m['served_in_time']} in "
        f"time of {m['servable_alone']} that a mode could serve alone ({m['ad_users']} AD "
        f"({m['moved_to_ad']} moved from SD), {m['sd_users']} SD, {m['refused']} refused, "
        f"{m['late']} late)"
        f", task throughput {m['task_throughput']:.2f}/s (simulated "
        f"{m['predicted_task_throughput']:.2f}/s), peak memory {m['peak_held_mib']:.2f} held / "
        f"{m['peak_reserved_mib']:.2f} reserved of {b.memory_mib:g} MiB, completion-time error "
        + ("-" if err is None else f"{err:.0%}")
        + f"; the loop's periods started up to {m['loop_behind_max_ms']:.0f} ms late"
        + ("" if m["steal_ms"] is None else f" (steal {m['steal_ms']:.0f} ms)")
    )


def run_balance(ctx: RunContext, cond: Condition, staged: ConditionFolder) -> dict[str, Any]:
    """Run one BALANCE condition; returns the journal field `metrics` (raises on failure)."""
    pb, b = cond.playbook, cond.playbook.balance
    if pb.workload.kind != "arithmetic":
        raise BadInputError("workload.kind: balance mode serves arithmetic problems only")
    hosts = ctx.hosts
    server = ctx.lab.inventory().server
    draft = ctx.draft_model if ctx.dry_run else draft_folder(ctx.draft_model)
    records = f"{server.workdir}/runs/{cond.id}"
    hosts.run(server, f"rm -rf {shlex.quote(records)} && mkdir -p {shlex.quote(records)}")
    when = ConditionTime.starting_now(condition_dilation(cond))
    inputs = staged.inputs()
    doc = place_emulation(hosts, server, cond, ctx.lab.emulated, when, inputs, records)
    target = model_on(server, "target_model", ctx.target_model)  # placed by Ansible, if so
    cost = cost_model_on(ctx, server, pb, staged, f"{records}/{EMULATION_FILE}",
                         emulation_tag(doc), (draft, target))  # fmt: skip
    cost_remote = f"{records}/cost-model.json"
    command = server_command(server, cond, target, draft, records, cost_remote)
    if ctx.dry_run:
        ctx.say(f"  write the users and the cost model to {server.name}:{records}")
        hosts.start(server, "balance-server", command, env=AGENT_ENV)
        return {"metrics": {}}
    rows = user_rows(pb, ctx.target_model)
    local = inputs / "users.jsonl"
    # the server gets each request, not the answer it is checked against
    sent = [{k: v for k, v in r.items() if k != "reference"} for r in rows]
    local.write_text("".join(json.dumps(r) + "\n" for r in sent))
    hosts.put(server, local, f"{records}/users.jsonl")
    hosts.put(server, staged.file(COST_MODEL), cost_remote)
    ctx.say(f"{cond.id}: {b.users} users arrive at {server.name} ({b.policy})")
    proc = hosts.start(server, "balance-server", command, env=AGENT_ENV)
    try:
        wait_for_exit(hosts, [proc], when.real_s(pb.condition_timeout_s))
    finally:
        if hosts.is_alive(proc):
            hosts.stop(proc)
    fetched = staged.host(server.name)
    fetch(hosts, server, records, SERVER_FILES, proc, fetched)
    served = read_records(fetched / "served.jsonl")
    summary = json.loads((fetched / "summary.json").read_text())
    service = default_service(cost, b.fixed_share, b.period_s)
    work = workload_of(rows)
    predicted = [
        simulate(cost, work, b.memory_mib * MIB, service, b.policy, seed=pb.seed + k)
        for k in range(PREDICTION_DRAWS)
    ]
    users = user_table(rows, served, predicted[0], cond.id)
    write_parquet(users, staged.table("balance_users"))
    inst = make_instance(cost, work.users, b.memory_mib * MIB, service)
    ceiling = int(servable_alone(inst).sum())
    metrics = condition_metrics(users, summary, predicted, b, ceiling)
    pacing = write_typed("pacing", pacing_frame(staged, cond.id), staged)
    metrics |= pacing_figures(pacing)
    ctx.say(describe(cond.id, b, metrics))
    return {"metrics": metrics}
