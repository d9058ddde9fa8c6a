"""One condition of the SLED family on a lab, as named steps, read top to bottom in
`run_condition`: its problems and their reference answers (the target's own, computed on the
server host by `testbed.runner.reference` where the run has none yet), its links (applied and
checked), its inputs, its agents, their records collected, and its tables.

The mode decides which agents start: `sled` and `centralized` a verification server and one
device agent per device; `device-only` the device agents alone (draft only, no server);
`server-ad` / `server-sd` one `agents.sled.local` on the server host that answers every
device's problems (each keeps its device's name), and no device agent.
"""

from __future__ import annotations

import itertools
import json
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from agents.workloads.arithmetic import Problem
from agents.workloads.scoring import score
from testbed.config.costs import load_cost_table
from testbed.config.playbook import Condition
from testbed.hosts.control import HostControl, RemoteProcess
from testbed.hosts.inventory import InventoryHost
from testbed.labs.backup import monitor_running
from testbed.labs.clocks import host_clocks
from testbed.links.plan import condition_links
from testbed.metrics.acceptance_match import acceptance_match
from testbed.metrics.clocks import ClockOffset
from testbed.metrics.recovery import fault_recovery, recovery_figures, request_figures
from testbed.results.store import ConditionFolder
from testbed.results.tables import tables_from_records
from testbed.runner.agents import (
    AGENT_ENV,
    DEVICE_FILES,
    SERVER_ALONE,
    SERVER_FILES,
    device_command,
    fetch,
    local_command,
    model_on,
    place_emulation,
    server_command,
    wait_for_file,
)
from testbed.runner.context import RunContext, condition_devices, condition_dilation
from testbed.runner.draft_choice import DraftChoice, choose_draft, stood_for_acceptance
from testbed.runner.emulation import ConditionTime
from testbed.runner.inject import Injector, Slot
from testbed.runner.lab_key import ensure_lab_key, place_lab_key
from testbed.runner.link_step import condition_link_step
from testbed.runner.reference import Answer, target_answers
from testbed.runner.watch import AgentWatch, unasked
from testbed.runner.workload import arrivals_for, problems_for, write_problem_file

READY_TIMEOUT_S = 120.0  # a server loads its model and listens within this (real time)


@dataclass
class Agents:
    """The condition's agents: where each writes, and the processes started."""

    server: InventoryHost
    devices: list[InventoryHost]
    records: str  # the records folder, relative to each host's workdir
    draft: str  # the draft model file the condition runs (testbed.runner.draft_choice)
    workers: dict[str, RemoteProcess] = field(default_factory=dict)  # host -> agent answering
    server_proc: RemoteProcess | None = None  # the verification server, if one runs
    commands: dict[str, str] = field(default_factory=dict)  # host -> its agent's command
    earlier: list[RemoteProcess] = field(default_factory=list)  # replaced by injected restarts
    started: float = field(default_factory=time.time)  # the server's span starts here
    answering: float = field(default_factory=time.time)  # the devices (or answerer) start here
    clocks: dict[str, ClockOffset] = field(default_factory=dict)  # host -> offset, at start

    def on(self, host: InventoryHost) -> str:
        return f"{host.workdir}/{self.records}"

    def running(self, mode: str) -> list[InventoryHost]:
        """The hosts whose agents run in `mode`: the server (but in device-only), and the
        devices (but in the server-alone modes)."""
        server = [self.server] if mode != "device-only" else []
        return server + ([] if mode in SERVER_ALONE else self.devices)


def run_condition(ctx: RunContext, cond: Condition, folder: ConditionFolder) -> dict[str, Any]:
    """Run one condition; returns the journal fields `link` and `metrics` (raises on failure)."""
    pb = cond.playbook
    ctx.faults[:] = unasked(ctx.faults)  # an earlier try's injected faults are not this one's
    devices = condition_devices(ctx.lab.inventory(), cond, ctx.lost)
    when = ConditionTime.starting_now(condition_dilation(cond))
    links = condition_links(ctx.lab, [d.name for d in devices], pb, when.dilation)
    profile = links.requested
    ctx.say(f"{cond.id}: link rtt {profile.rtt_ms} ms, loss {profile.loss}"
            + (f", time dilated x{when.dilation:g}" if when.dilation != 1 else ""))  # fmt: skip
    problems = problems_for(pb.workload, [d.name for d in devices],
                            None if ctx.dry_run else ctx.target_model,
                            pb.models.target_as)  # fmt: skip
    every = [p for name in problems for p in problems[name]]
    reference = target_answers(ctx, cond, every, pb.workload.max_new_tokens)
    choice = (DraftChoice(ctx.draft_model, None, None, stood_for_acceptance(cond)) if ctx.dry_run
              else choose_draft(cond, ctx.draft_model, every, ctx.say))  # fmt: skip
    with condition_link_step(ctx, links, when, folder, pb.impairment) as link:
        write_inputs(cond, problems, folder)
        agents = Agents(ctx.lab.inventory().server, devices, f"runs/{cond.id}", choice.path)
        try:
            start_agents(ctx, cond, agents, folder, when)
            if ctx.dry_run:
                return {"link": link.record, "metrics": {}}
            watch = watch_agents(ctx, cond, agents, when, links.backup)
            injector = fault_injector(ctx, cond, agents, watch, when)
            injector.start()
            try:
                watch.wait(when.real_s(pb.condition_timeout_s), holds=injector.busy)
            finally:
                injector.stop()
            info = collect(ctx, cond, agents, folder, when, watch)
        finally:
            stop_agents(ctx.hosts, agents)
        link.close()
    metrics = tables(cond, folder, reference, info) | choice.columns()
    metrics |= recovery(ctx, cond, agents, folder, problems, when)
    metrics |= acceptance_match(metrics.get("acceptance_alpha"), metrics["acceptance_as"])
    return {"link": link.record, "metrics": metrics}


# --- the steps ------------------------------------------------------------------------------


def write_inputs(cond: Condition, problems: dict[str, list[Problem]],
                 folder: ConditionFolder) -> None:  # fmt: skip
    """Each device's problems (and arrival times) in the condition's inputs."""
    arrivals = arrivals_for(cond.playbook.workload, list(problems))
    for name, mine in problems.items():
        write_problem_file(mine, folder.inputs() / f"{name}.problems.jsonl", arrivals[name])


def start_agents(ctx: RunContext, cond: Condition, agents: Agents, folder: ConditionFolder,
                 when: ConditionTime) -> None:  # fmt: skip
    """Measure the clock of each host that runs an agent, place each agent's inputs on its host
    (its emulated clock's epoch on its own clock) and start it: the server (waited for until
    it listens) and the devices, or the server alone answering every device's problems."""
    pb, hosts, server = cond.playbook, ctx.hosts, agents.server
    inputs = folder.inputs()
    agents.clocks = host_clocks(ctx.lab, [h.name for h in agents.running(pb.mode)])
    if pb.mode != "device-only":
        fresh_records(hosts, server, agents.on(server))
        server_time = when.on_host(agents.clocks[server.name])
        place_emulation(hosts, server, cond, ctx.lab.emulated, server_time, inputs,
                        agents.on(server))  # fmt: skip
    target = model_on(server, "target_model", ctx.target_model)
    agents.started = time.time()
    if pb.mode in SERVER_ALONE:
        names = [d.name for d in agents.devices]
        every = inputs / f"{server.name}.problems.jsonl"
        every.write_text(interleaved([inputs / f"{n}.problems.jsonl" for n in names], names))
        hosts.put(server, every, f"{agents.on(server)}/problems.jsonl")
        ctx.say(f"{cond.id}: answering every device's problems on {server.name} ({pb.mode})")
        draft = model_on(server, "draft_model", agents.draft)
        command = local_command(server, cond, target, draft, agents.on(server))
        agents.commands[server.name] = command
        agents.answering = time.time()
        agents.workers[server.name] = hosts.start(server, "sled-local", command, env=AGENT_ENV)
        return
    if pb.mode != "device-only":
        ctx.say(f"{cond.id}: starting the verification server on {server.name}")
        place_lab_key(hosts, [server, *agents.devices], ensure_lab_key(ctx.lab.runtime_dir))
        agents.started = time.time()
        command = server_command(server, cond, target, agents.on(server))
        agents.commands[server.name] = command
        agents.server_proc = hosts.start(server, "sled-server", command, env=AGENT_ENV)
        if not ctx.dry_run:
            wait_for_file(hosts, server, f"{agents.on(server)}/ready", agents.server_proc,
                          READY_TIMEOUT_S)  # fmt: skip
    for dev in agents.devices:
        fresh_records(hosts, dev, agents.on(dev))
        hosts.put(dev, inputs / f"{dev.name}.problems.jsonl", f"{agents.on(dev)}/problems.jsonl")
        place_emulation(hosts, dev, cond, ctx.lab.emulated, when.on_host(agents.clocks[dev.name]),
                        inputs, agents.on(dev))  # fmt: skip
    ctx.say(f"{cond.id}: starting {len(agents.devices)} device agents")
    for h in agents.devices:
        model = model_on(h, "draft_model", agents.draft)
        agents.commands[h.name] = device_command(h, server, cond, model, agents.on(h))
    agents.answering = time.time()
    agents.workers = hosts.start_all("sled-device", lambda h: agents.commands[h.name],
                                     agents.devices, env=AGENT_ENV)  # fmt: skip


def watch_agents(ctx: RunContext, cond: Condition, agents: Agents, when: ConditionTime,
                 backup: bool) -> AgentWatch:  # fmt: skip
    """Every agent started, watched (testbed.runner.watch): the server must run until the
    runner stops it, the others may end by themselves, and an emulated lab's failover monitor
    must run throughout; times count from the devices' start."""
    watch = AgentWatch(ctx.hosts, cond.id, agents.answering,
                       when.dilation, agents.clocks, ctx.say, ctx.faults)  # fmt: skip
    if agents.server_proc is not None:
        watch.keep(agents.server_proc, ends_itself=False)
    watch.keep_all(agents.workers.values(), ends_itself=True)
    if backup and ctx.lab.emulated:
        name = ctx.lab.name
        watch.keep_check("controller", "failover-monitor", lambda: monitor_running(name))
    return watch


def fault_injector(ctx: RunContext, cond: Condition, agents: Agents, watch: AgentWatch,
                   when: ConditionTime) -> Injector:  # fmt: skip
    """The injector of the condition's `faults` (none: one that does nothing); a restarted
    agent replaces its predecessor in `agents`."""
    slots = {h.name: Slot(h, proc, agents.commands[h.name], AGENT_ENV, True, agents.on(h))
             for h in agents.devices if (proc := agents.workers.get(h.name))}  # fmt: skip
    server = agents.server
    if agents.server_proc is not None:
        slots[server.name] = Slot(server, agents.server_proc, agents.commands[server.name],
                                  AGENT_ENV, False, agents.on(server),
                                  f"{agents.on(server)}/ready")  # fmt: skip

    def restarted(slot: Slot) -> None:
        agents.earlier.append(slot.earlier[-1])
        if slot.host.name == server.name and agents.server_proc is not None:
            agents.server_proc = slot.proc
        else:
            agents.workers[slot.host.name] = slot.proc

    return Injector(ctx.hosts, watch, cond.playbook.faults, slots, server, when.dilation,
                    restarted)  # fmt: skip


def recovery(
    ctx: RunContext, cond: Condition, agents: Agents, folder: ConditionFolder,
    problems: dict[str, list[Problem]], when: ConditionTime,
) -> dict[str, Any]:  # fmt: skip
    """With injected faults: each one's recovery (testbed.metrics.recovery), written into the
    run's faults, and the condition's recovery figures."""
    if not cond.playbook.faults:
        return {}
    rounds, requests = (pd.read_parquet(folder.table(t)) if folder.table(t).exists()
                        else pd.DataFrame() for t in ("rounds", "requests"))  # fmt: skip
    ctx.faults[:] = [fault_recovery(f, rounds, agents.clocks, when.wall) if f.injected else f
                     for f in ctx.faults]  # fmt: skip
    asked = {name: [str(p.id) for p in mine] for name, mine in problems.items()}
    return recovery_figures(ctx.faults) | request_figures(asked, requests)


def collect(ctx: RunContext, cond: Condition, agents: Agents, folder: ConditionFolder,
            when: ConditionTime, watch: AgentWatch) -> list[dict[str, Any]]:  # fmt: skip
    """Stop the server (a last look first: it must still run), fetch every agent's records
    into the condition's `hosts/`, and return what the controller knows of each host that
    ran (`hosts_info`)."""
    hosts, server = ctx.hosts, agents.server
    if agents.server_proc is not None:
        watch.poll()
        watch.release(agents.server_proc)
        hosts.stop(agents.server_proc)
    span = (when.wall(agents.started), when.wall(time.time()))
    alone = cond.playbook.mode in SERVER_ALONE
    info = hosts_info(agents.running(cond.playbook.mode), server.name, span, agents.clocks)
    for h in [server] if alone else agents.devices:
        fetch(hosts, h, agents.on(h), DEVICE_FILES, agents.workers[h.name], folder.host(h.name))
    if agents.server_proc is not None:
        fetch(hosts, server, agents.on(server), SERVER_FILES, agents.server_proc,
              folder.host(server.name))  # fmt: skip
    for proc in agents.earlier:  # the logs of agents an injected restart replaced
        hosts.get(proc.host, proc.log_file, folder.host(proc.host) / f"{proc.name}.log")
    return info


def tables(cond: Condition, folder: ConditionFolder, reference: dict[str, Answer],
           info: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """Typed Parquet tables from the fetched records; returns the condition's figures (cost
    from the playbook's `costs` file over the default table)."""
    costs = cond.playbook.costs
    return tables_from_records(
        folder, cond.id, lambda r: score_requests(r, reference), cond.playbook.workload.slo,
        hosts_info=info, costs=load_cost_table(Path(costs)) if costs else None,
    )  # fmt: skip


# --- helpers --------------------------------------------------------------------------------


def fresh_records(hosts: HostControl, host: InventoryHost, path: str) -> None:
    """An empty records folder on the host."""
    hosts.run(host, f"rm -rf {shlex.quote(path)} && mkdir -p {shlex.quote(path)}")


def stop_agents(hosts: HostControl, agents: Agents) -> None:
    """Stop whatever agent still runs (a failed or interrupted condition)."""
    procs = [*agents.workers.values(), *([agents.server_proc] if agents.server_proc else [])]
    running = [p for p in procs if hosts.dry_run or hosts.is_alive(p)]
    if running:
        hosts.stop_all(running, grace_s=2)


def interleaved(files: list[Path], dev_names: list[str]) -> str:
    """The server-alone input: the devices' problem lines taken in turn, each with its `dev`."""
    per_dev = [
        [{"dev": d, **json.loads(line)} for line in f.read_text(encoding="utf-8").splitlines()]
        for f, d in zip(files, dev_names)
    ]
    rows = [row for turn in itertools.zip_longest(*per_dev) for row in turn if row is not None]
    return "".join(json.dumps(r) + "\n" for r in rows)


def score_requests(requests: pd.DataFrame, reference: dict[str, Answer]) -> pd.DataFrame:
    """Add strict/flexible correctness and agreement with the target's greedy answer: token
    for token (every token of an answer held past EOS included), or by text where the records
    carry no ids."""
    if requests.empty:
        return requests
    scored = [score(t, r) for t, r in zip(requests["text"], requests["reference"])]
    requests["strict_correct"] = [s for s, _ in scored]
    requests["flexible_correct"] = [f for _, f in scored]
    answers = [reference.get(p) for p in requests["problem"]]
    requests["target_text"] = [a.text if a else None for a in answers]
    ids = requests["ids"] if "ids" in requests else [None] * len(requests)
    requests["matches_target"] = [
        a is not None and (tuple(int(t) for t in i) == a.tokens if i is not None else t == a.text)
        for a, i, t in zip(answers, ids, requests["text"])
    ]
    return requests


def hosts_info(lab_hosts: Iterable[InventoryHost], server: str, server_span: tuple[float, float],
               clocks: dict[str, ClockOffset]) -> list[dict[str, Any]]:  # fmt: skip
    """Per host: role, class and the clock offset to the controller measured as the condition
    began (`clocks`, which the condition's cross-host figures use); the server's span as
    timed by the controller."""
    rows = []
    for h in lab_hosts:
        row = {"dev": h.name, "role": h.role, "host_class": h.host_class,
               **clocks[h.name].columns()}  # fmt: skip
        if h.name == server:
            row.update(t_start=server_span[0], t_end=server_span[1])
        rows.append(row)
    return rows
