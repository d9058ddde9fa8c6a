"""One BALANCE condition on a lab: users on the devices send their requests over their links
to one hybrid AD/SD server under a memory budget.

Its steps, read top to bottom in `run_balance`: the users' problems and their reference
answers (the target's own greedy output, computed on the server host by the model it runs,
`testbed.runner.reference`, as for every mode); the links applied and checked (the
playbook's `link`, or the topology profile `link_profile` names); the cost model (measured on
the server host as its engines run: on an emulated lab paced to the hardware its class stands
for, the memory in the bytes of the catalogue's models; or `balance.profile`); the users
(arithmetic problems, Poisson arrivals, mixed deadlines) written per device, user k on device
k mod N; the server (`agents.balance.server`) and one client per device
(`agents.balance.client`) started, the clients sending at their users' times on the lab's
clock; their records fetched; the tables. The simulator predicts the same users over the same
link (`testbed.balance.over_link`) with the same cost model.

Stored per condition: `balance_users.parquet` (one row per user: what its device saw, what the
server did, what the simulator predicted, whether its tokens equal the target's greedy
output), the cost model, the pacing table and the journal's metrics.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import numpy as np

from agents.balance.costmodel import CostModel
from agents.balance.problem import Users, default_service, make_instance, servable_alone
from agents.balance.serve import workload_span_s
from agents.emulation.stepcost import GB
from agents.records import read_records
from agents.spec.rates import per_token_acceptance
from agents.workloads.arithmetic import Problem, heldout_problems
from testbed.balance.cost_file import read_cost_model
from testbed.balance.over_link import LinkView, over_link
from testbed.balance.simulator import simulate
from testbed.balance.user_figures import condition_metrics, describe, user_table
from testbed.config.playbook import Condition, Playbook
from testbed.core.errors import AgentError, BadInputError
from testbed.core.files import atomic_write_json
from testbed.hosts.inventory import InventoryHost
from testbed.labs.clocks import host_clocks
from testbed.links.plan import condition_links
from testbed.metrics.acceptance_match import acceptance_match
from testbed.metrics.clocks import clock_figures
from testbed.metrics.condition_stats import pacing_figures
from testbed.results.store import ConditionFolder
from testbed.results.tables import pacing_frame, write_parquet, write_typed
from testbed.runner.agents import (
    AGENT_ENV,
    SERVER_PORT,
    fetch,
    model_on,
    place_emulation,
    wait_for_file,
)
from testbed.runner.condition import READY_TIMEOUT_S, fresh_records
from testbed.runner.context import RunContext, condition_devices, condition_dilation
from testbed.runner.draft_choice import choose_draft, stood_for_acceptance
from testbed.runner.emulation import EMULATION_FILE, ConditionTime, emulation_tag
from testbed.runner.lab_key import ensure_lab_key, key_path_on, place_lab_key
from testbed.runner.link_step import condition_link_step
from testbed.runner.reference import Answer, target_answers
from testbed.runner.watch import AgentWatch
from testbed.runner.workload import shaped

SERVER_FILES = ("served.jsonl", "summary.json", "pacing.jsonl")
CLIENT_FILES = ("balance_requests.jsonl", "status.json")
COST_MODEL = "cost-model.json"  # in the condition's folder: the cost model it ran with
CLIENT_LEAD_S = 4.0  # real seconds from starting the clients to their users' time zero
PREDICTION_DRAWS = 10  # simulated runs per condition (accepted drafts and losses drawn)


def draft_folder(draft: str) -> str:
    """The draft as an HF folder (the server runs both models in PyTorch): the tiny pair's
    when the run resolved `tiny` to its GGUF."""
    if not draft.endswith(".gguf"):
        return draft
    from testbed.models.tiny import ensure_tiny_pair

    pair = ensure_tiny_pair()
    for name in pair.draft_names:
        hf, gguf = pair.draft_files(name)
        if Path(draft) == gguf:
            return str(hf)
    raise BadInputError(f"models.draft: balance mode needs an HF folder, not {draft}")


def user_problems(pb: Playbook, tokenizer: str | None) -> list[Problem]:
    """The condition's users' problems: `balance.users` held-out arithmetic problems (each
    shaped as a request of `workload.stands_for` where the playbook names one: its prompt and
    answer lengths those of a stood-for question, `testbed.runner.workload.shaped`)."""
    problems = heldout_problems(pb.balance.users, seed=pb.workload.seed)
    if pb.workload.stands_for:
        problems = shaped(problems, pb.workload, pb.models.target_as, tokenizer)
    return problems


def user_rows(pb: Playbook, problems: list[Problem], reference: dict[str, Answer],
              devices: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """The condition's users, one per problem, each asking for the length of the target's
    greedy answer (`reference`, computed on the server host: its prompt's and its answer's
    token ids), with a deadline of base + length x a per-token time drawn from the playbook's
    range, sent as a Poisson process of `balance.rate_per_s` (drawn from `seed` +
    `workload.arrival.seed`, which a repetition shifts); user k on device k mod N."""
    b = pb.balance
    rng = np.random.default_rng(pb.seed + pb.workload.arrival.seed)
    arrivals = np.cumsum(rng.exponential(1 / b.rate_per_s, b.users))
    per_token = rng.uniform(*b.deadline_per_token_s, b.users)
    rows = []
    for i, p in enumerate(problems):
        ref = reference[p.id]
        rows.append({
            "uid": i, "dev": devices[i % len(devices)], "problem": p.id,
            "prompt": list(ref.prompt_tokens), "output": len(ref.tokens),
            "reference": list(ref.tokens),
            "deadline_s": b.deadline_base_s + len(ref.tokens) * float(per_token[i]),
            "arrive_s": float(arrivals[i]),
        })  # fmt: skip
    return rows


def cost_model_on(
    ctx: RunContext, server: InventoryHost, pb: Playbook, staged: ConditionFolder, emulation: str,
    tag: str, models: tuple[str, str],
) -> CostModel:  # fmt: skip
    """The run's cost model, in `staged/cost-model.json`: the file `balance.profile` names, or
    measured on the server host by `agents.balance.measure` on `models` (draft, target) with
    the server's engines as they run (the emulation file `emulation`, whose contents `tag`
    names) the first time a run needs it (kept in the lab's server workdir)."""
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
                server.agent_python, "-m", "agents.balance.measure", "--out", remote,
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


def server_command(host: InventoryHost, cond: Condition, target: str, draft: str,
                   records: str) -> str:  # fmt: skip
    """The BALANCE server's command line (its emulation file and cost model beside its
    records)."""
    pb, b = cond.playbook, cond.playbook.balance
    return shlex.join([
        host.agent_python, "-m", "agents.balance.server",
        "--bind", f"{host.link_address}:{SERVER_PORT}", "--key-file", key_path_on(host),
        "--users", str(b.users), "--cost", f"{records}/{COST_MODEL}",
        "--target", target, "--draft", draft, "--policy", b.policy,
        "--memory-bytes", str(b.memory_gb * GB), "--fixed-share", str(b.fixed_share),
        "--period-s", str(b.period_s), "--threads", str(b.threads),
        "--device", pb.models.server_device, "--records", records,
        "--ready-file", f"{records}/ready", "--emulation", f"{records}/{EMULATION_FILE}",
    ])  # fmt: skip


def client_command(host: InventoryHost, server: InventoryHost, cond: Condition, records: str,
                   start_at: float) -> str:  # fmt: skip
    """One device's BALANCE client: its users' requests over its link."""
    return shlex.join([
        host.agent_python, "-m", "agents.balance.client",
        "--server", f"{server.link_address}:{SERVER_PORT}", "--dev", host.name,
        "--users", f"{records}/users.jsonl", "--records", records,
        "--key-file", key_path_on(host), "--start-at", repr(start_at),
        "--copies", str(cond.playbook.balance.copies),
        "--emulation", f"{records}/{EMULATION_FILE}",
    ])  # fmt: skip


def predictions(cost: CostModel, rows: list[dict[str, Any]], pb: Playbook) -> list[Any]:
    """The simulator's runs of the condition's users over its link (PREDICTION_DRAWS draws of
    accepted drafts and lost datagrams), each (OverLink, ServeResult)."""
    b = pb.balance
    users = Users(
        prompt=np.array([len(r["prompt"]) for r in rows]),
        output=np.array([r["output"] for r in rows]),
        deadline=np.array([r["deadline_s"] for r in rows]),
    )
    send = np.array([r["arrive_s"] for r in rows])
    service = default_service(cost, b.fixed_share, b.period_s)
    view = LinkView.of(pb.link, b.copies)
    out = []
    for k in range(PREDICTION_DRAWS):
        drawn = over_link(users, send, view, np.random.default_rng(pb.seed + 1000 + k))
        out.append((drawn, simulate(cost, drawn.server, b.memory_gb * GB, service, b.policy,
                                    seed=pb.seed + k)))  # fmt: skip
    return out


def ceiling(cost: CostModel, rows: list[dict[str, Any]], pb: Playbook) -> int:
    """Users some mode could serve in time alone (over the link's expected time), which no
    policy exceeds."""
    b = pb.balance
    drawn = over_link(
        Users(np.array([len(r["prompt"]) for r in rows]), np.array([r["output"] for r in rows]),
              np.array([r["deadline_s"] for r in rows])),
        np.array([r["arrive_s"] for r in rows]), LinkView.of(pb.link, b.copies),
        np.random.default_rng(pb.seed),
    )  # fmt: skip
    service = default_service(cost, b.fixed_share, b.period_s)
    return int(servable_alone(make_instance(cost, drawn.server.users, b.memory_gb * GB,
                                            service)).sum())  # fmt: skip


def run_balance(ctx: RunContext, cond: Condition, staged: ConditionFolder) -> dict[str, Any]:
    """Run one BALANCE condition; returns the journal fields `link` and `metrics`."""
    pb, b = cond.playbook, cond.playbook.balance
    if pb.workload.kind != "arithmetic":
        raise BadInputError("workload.kind: balance mode serves arithmetic problems only")
    hosts, inv = ctx.hosts, ctx.lab.inventory()
    server, devices = inv.server, condition_devices(inv, cond, ctx.lost)
    names = [d.name for d in devices]
    when = ConditionTime.starting_now(condition_dilation(cond))
    links = condition_links(ctx.lab, names, pb, when.dilation)
    ctx.say(f"{cond.id}: link rtt {pb.link.rtt_ms} ms, loss {pb.link.loss}"
            + (f", time dilated x{when.dilation:g}" if when.dilation != 1 else ""))  # fmt: skip
    problems = user_problems(pb, None if ctx.dry_run else ctx.target_model)
    reference = target_answers(ctx, cond, problems, pb.workload.max_new_tokens)
    with condition_link_step(ctx, links, when, staged, pb.impairment) as link:
        records = f"runs/{cond.id}"
        on = {h.name: f"{h.workdir}/{records}" for h in [server, *devices]}
        inputs = staged.inputs()
        for h in [server, *devices]:
            fresh_records(hosts, h, on[h.name])
        clocks = host_clocks(ctx.lab, on)  # each host's emulated epoch and start on its clock
        server_time = when.on_host(clocks[server.name])
        doc = place_emulation(hosts, server, cond, ctx.lab.emulated, server_time, inputs,
                              on[server.name])  # fmt: skip
        draft = ctx.draft_model if ctx.dry_run else draft_folder(
            choose_draft(cond, ctx.draft_model, problems, ctx.say, b.draft_len).path
        )  # fmt: skip
        target = model_on(server, "target_model", ctx.target_model)
        cost = cost_model_on(ctx, server, pb, staged, f"{on[server.name]}/{EMULATION_FILE}",
                             emulation_tag(doc), (draft, target))  # fmt: skip
        place_lab_key(hosts, [server, *devices], ensure_lab_key(ctx.lab.runtime_dir))
        rows = [] if ctx.dry_run else user_rows(pb, problems, reference, names)
        for dev in devices:
            place_emulation(hosts, dev, cond, ctx.lab.emulated, when.on_host(clocks[dev.name]),
                            inputs, on[dev.name])  # fmt: skip
            mine = inputs / f"{dev.name}.users.jsonl"  # the request, not the answer it is
            mine.write_text("".join(  # checked against
                json.dumps({k: v for k, v in r.items() if k not in ("reference", "dev")}) + "\n"
                for r in rows if r["dev"] == dev.name))  # fmt: skip
            hosts.put(dev, mine, f"{on[dev.name]}/users.jsonl")
        if not ctx.dry_run:
            hosts.put(server, staged.file(COST_MODEL), f"{on[server.name]}/{COST_MODEL}")
        ctx.say(f"{cond.id}: {b.users} users on {len(devices)} devices ask {server.name} "
                f"({b.policy}, {b.memory_gb:g} GB)")  # fmt: skip
        proc = hosts.start(server, "balance-server",
                           server_command(server, cond, target, draft, on[server.name]),
                           env=AGENT_ENV)  # fmt: skip
        clients: dict[str, Any] = {}
        try:
            if not ctx.dry_run:
                wait_for_file(hosts, server, f"{on[server.name]}/ready", proc, READY_TIMEOUT_S)
            start_at = when.wall(time.time() + CLIENT_LEAD_S)
            ctx.say(f"{cond.id}: the clients send from {CLIENT_LEAD_S:g} s from now")
            clients = hosts.start_all(
                "balance-client",
                lambda h: client_command(h, server, cond, on[h.name],
                                         clocks[h.name].to_host(start_at)),  # fmt: skip
                devices, env=AGENT_ENV,
            )  # fmt: skip
            if ctx.dry_run:
                return {"link": link.record, "metrics": {}}
            watch = AgentWatch(hosts, cond.id, time.time() + CLIENT_LEAD_S, when.dilation,
                               clocks, ctx.say, ctx.faults)  # fmt: skip
            watch.keep(proc, ends_itself=False)
            watch.keep_all(clients.values(), ends_itself=True)
            watch.wait(when.real_s(pb.condition_timeout_s))
            watch.poll()  # the server must still run as the clients end
            watch.release(proc)
        finally:
            for p in [proc, *clients.values()]:
                if hosts.is_alive(p):
                    hosts.stop(p)
        fetch(hosts, server, on[server.name], SERVER_FILES, proc, staged.host(server.name))
        for dev in devices:
            fetch(hosts, dev, on[dev.name], CLIENT_FILES, clients[dev.name],
                  staged.host(dev.name))  # fmt: skip
        link.close()
    metrics = tables(cond, staged, rows, cost, names, server.name) | clock_figures(clocks.values())
    ctx.say(describe(cond.id, b, metrics))
    return {"link": link.record, "metrics": metrics}


def tables(cond: Condition, staged: ConditionFolder, rows: list[dict[str, Any]], cost: CostModel,
           devices: list[str], server: str) -> dict[str, Any]:  # fmt: skip
    """The condition's user table and figures from the fetched records."""
    pb = cond.playbook
    seen = [r for d in devices for r in read_records(staged.host(d) / "balance_requests.jsonl")]
    summary = json.loads((staged.host(server) / "summary.json").read_text())
    if seen and not summary["users_asked"]:
        raise AgentError(
            f"{cond.id}: the BALANCE server received no request of the {len(seen)} the devices "
            f"sent ({sum(r['attempts'] for r in seen)} datagrams; refused as malformed: "
            f"{summary['refusals'] or 'none'}): see hosts/*/balance-client.log"
        )
    served_file = staged.host(server) / "served.jsonl"  # absent when nobody asked
    served = read_records(served_file) if served_file.exists() else []
    predicted = predictions(cost, rows, pb)
    users = user_table(rows, seen, served, predicted[0], cond.id)
    write_parquet(users, staged.table("balance_users"))
    span = workload_span_s(np.array([r["arrive_s"] for r in rows]),
                           np.array([r["deadline_s"] for r in rows]))  # fmt: skip
    metrics = condition_metrics(users, summary, predicted, pb.balance, ceiling(cost, rows, pb),
                                span)  # fmt: skip
    pacing = write_typed("pacing", pacing_frame(staged, cond.id), staged)
    metrics |= pacing_figures(pacing)
    alpha = per_token_acceptance(summary.get("sd_accepted", 0), summary.get("sd_rejections", 0))
    stood_for = stood_for_acceptance(cond)
    metrics |= {"acceptance_alpha": alpha,
                "acceptance_as": stood_for.per_token if stood_for else None,
                "acceptance_as_source": stood_for.source if stood_for else None}  # fmt: skip
    return metrics | acceptance_match(alpha, metrics["acceptance_as"])
