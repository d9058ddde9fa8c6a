"""One SLED condition on a lab: link, agents through Fabric, records back, tables, summary.

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
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from agents.workloads.arithmetic import Problem
from agents.workloads.scoring import score
from testbed.config.playbook import Condition
from testbed.errors import AgentError
from testbed.hosts.control import HostControl, RemoteProcess
from testbed.hosts.inventory import Inventory, InventoryHost
from testbed.lab.backup import (
    backup_profiles,
    failover_log,
    probe_backup,
    read_failovers,
    set_monitor_dilation,
)
from testbed.lab.interface import Lab
from testbed.metrics.clocks import measure_offset
from testbed.metrics.cost import load_cost_table
from testbed.netem.api import apply_each, clear, link_changes
from testbed.netem.probe import ProbeResult, probe_links
from testbed.netem.profile import LOSS_SEMANTICS, LinkProfile
from testbed.netem.schedule import dilate
from testbed.results.atomic import atomic_write_json
from testbed.results.tables import tables_from_records
from testbed.runner.emulation import EMULATION_FILE, ConditionTime, host_emulation
from testbed.runner.lab_key import ensure_lab_key, key_path_on, place_lab_key
from testbed.runner.linkcheck import probe_checked
from testbed.runner.workload import arrivals_for, problems_for, write_problem_file

SERVER_PORT = 7000
AGENT_ENV = {
    "PYTHONUNBUFFERED": "1",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
SERVER_FILES = ("verifications.jsonl", "batches.jsonl", "refusals.jsonl", "confidence.jsonl",
                "generations.jsonl", "ar_steps.jsonl", "status.json", "power.jsonl",
                "pacing.jsonl")  # fmt: skip
DEVICE_FILES = ("rounds.jsonl", "requests.jsonl", "status.json", "power.jsonl", "pacing.jsonl")
SERVER_ALONE = {"server-ad": "ad", "server-sd": "sd"}  # playbook mode -> agents.sled.local mode


@dataclass
class RunContext:
    """What every condition of a run shares."""

    lab: Lab
    hosts: HostControl
    draft_model: str
    target_model: str
    # (problems, max_new) -> problem id -> the target's own greedy answer
    reference: Callable[[list[Problem], int], dict[str, str]]
    say: Callable[[str], None]
    dry_run: bool = False


def model_on(host: InventoryHost, key: str, default: str) -> str:
    """A model path on a host: its host variable (on lab kind `inventory`, the file the site
    playbook placed, which the lab took from the host's facts, unless the inventory names
    one) or the controller's."""
    return str(host.vars.get(key, default))


def server_command(host: InventoryHost, cond: Condition, model: str, records: str) -> str:
    s = cond.playbook.sled
    args = [
        host.python, "-m", "agents.sled.server",
        "--bind", f"{host.address}:{SERVER_PORT}",
        "--model", model,
        "--device", cond.playbook.models.server_device,
        "--threads", str(s.server_threads),
        "--max-batch", str(s.max_batch),
        "--batch-strategy", s.batch_strategy,
        "--window-ms", str(s.window_ms),
        "--idle-s", str(s.idle_s),
        "--max-seq-policy", s.max_seq_policy,
        "--kv-policy", s.kv_policy,
        "--kv-queue-max", str(s.kv_queue_max),
        "--kv-queue-timeout-s", str(s.kv_queue_timeout_s),
        "--seed", str(cond.playbook.seed),
        "--records", records,
        "--ready-file", f"{records}/ready",
        "--key-file", key_path_on(host),
        "--emulation", f"{records}/{EMULATION_FILE}",
    ]  # fmt: skip
    if s.kv_cache_tokens is not None:
        args += ["--kv-cache-tokens", str(s.kv_cache_tokens)]
    if s.max_seq_length is not None:
        args += ["--max-seq-length", str(s.max_seq_length)]
    if s.prefill_chunk is not None:
        args += ["--prefill-chunk", str(s.prefill_chunk)]
    return shlex.join(args)


def device_seed(seed: int, device: str) -> int:
    """A device's sampling seed: the playbook's, made distinct per device (stable by name)."""
    return (seed * 1_000_003 + zlib.crc32(device.encode())) % 2**31


def device_command(
    host: InventoryHost, server: InventoryHost, cond: Condition, model: str, records: str
) -> str:
    s = cond.playbook.sled
    args = [
        host.python, "-m", "agents.sled.device",
        "--dev", host.name,
        "--model", model,
        "--threads", str(s.device_threads),
        "--problems", f"{records}/problems.jsonl",
        "--records", records,
        "--mode", cond.playbook.mode,
        "--draft-len", str(s.draft_len),
        "--draft-policy", s.draft_policy,
        "--draft-min", str(s.draft_min),
        "--draft-max", str(s.draft_max),
        "--target-acceptance", str(s.target_acceptance),
        "--timeout-ms", str(s.timeout_ms),
        "--timeout-policy", s.timeout_policy,
        "--timeout-min-ms", str(s.timeout_min_ms),
        "--timeout-max-ms", str(s.timeout_max_ms),
        "--retries", str(s.retries),
        "--copies", str(s.copies),
        "--retry-confidence", str(s.retry_confidence),
        "--lookahead", str(s.lookahead),
        "--min-confidence", str(s.min_confidence),
        "--temperature", str(s.temperature),
        "--top-k", str(s.top_k),
        "--seed", str(device_seed(cond.playbook.seed, host.name)),
        "--probe-ms", str(s.probe_ms),
        "--max-new", str(cond.playbook.workload.max_new_tokens),
        "--emulation", f"{records}/{EMULATION_FILE}",
    ]  # fmt: skip
    if cond.playbook.mode != "device-only":
        args += ["--server", f"{server.address}:{SERVER_PORT}", "--key-file", key_path_on(host)]
    return shlex.join(args)


def server_alone_command(
    host: InventoryHost, cond: Condition, target: str, draft: str, records: str
) -> str:
    """`agents.sled.local` on the server: every device's problems, AD or SD (server-ad/-sd)."""
    pb = cond.playbook
    mode = SERVER_ALONE[pb.mode]
    args = [
        host.python, "-m", "agents.sled.local",
        "--mode", mode,
        "--target", target,
        "--device", pb.models.server_device,
        "--threads", str(pb.sled.server_threads),
        "--draft-len", str(pb.sled.draft_len),
        "--max-new", str(pb.workload.max_new_tokens),
        "--problems", f"{records}/problems.jsonl",
        "--records", records,
        "--emulation", f"{records}/{EMULATION_FILE}",
    ]  # fmt: skip
    if mode == "sd":
        args += ["--draft", draft]
    return shlex.join(args)


def interleaved(files: list[Path], dev_names: list[str]) -> str:
    """The server-alone input: the devices' problem lines taken in turn, each with its `dev`."""
    per_dev = [
        [{"dev": d, **json.loads(line)} for line in f.read_text(encoding="utf-8").splitlines()]
        for f, d in zip(files, dev_names)
    ]
    rows = [row for turn in itertools.zip_longest(*per_dev) for row in turn if row is not None]
    return "".join(json.dumps(r) + "\n" for r in rows)


def wait_for_file(hosts: HostControl, host: InventoryHost, path: str, proc: RemoteProcess,
                  timeout_s: float) -> None:  # fmt: skip
    """Poll until path exists on host; fail early (with its log) if proc has died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if hosts.run(host, f"test -f {shlex.quote(path)}", check=False).ok:
            return
        if not hosts.is_alive(proc):
            raise AgentError(f"{host.name}: {proc.name} exited early:\n{hosts.log_tail(proc)}")
        time.sleep(0.3)
    raise AgentError(f"{host.name}: {proc.name} not ready after {timeout_s:.0f} s")


def wait_for_exit(hosts: HostControl, procs: list[RemoteProcess], timeout_s: float) -> None:
    """Wait until every process has exited by itself, with exit code 0."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    while pending:
        pending = [p for p in pending if hosts.is_alive(p)]
        if pending and time.monotonic() > deadline:
            names = ", ".join(f"{p.host}/{p.name}" for p in pending)
            raise AgentError(f"agents still running after {timeout_s:.0f} s: {names}")
        if pending:
            time.sleep(0.5)
    for p in procs:
        code = hosts.exit_code(p)
        if code != 0:
            raise AgentError(f"{p.host}: {p.name} exited with {code}:\n{hosts.log_tail(p)}")


def fetch(hosts: HostControl, host: InventoryHost, remote_dir: str, names: tuple[str, ...],
          proc: RemoteProcess | None, local: Path) -> None:  # fmt: skip
    """Copy the agent's record files (those that exist) and its log into local."""
    local.mkdir(parents=True, exist_ok=True)
    listing = hosts.run(host, f"ls {shlex.quote(remote_dir)}", check=False).stdout.split()
    for name in names:
        if name in listing:
            hosts.get(host, f"{remote_dir}/{name}", local / name)
    if proc is not None:
        hosts.get(host, proc.log_file, local / f"{proc.name}.log")


def score_requests(requests: pd.DataFrame, reference: dict[str, str]) -> pd.DataFrame:
    """Add strict/flexible correctness and agreement with the target's greedy answer."""
    if requests.empty:
        return requests
    scored = [score(t, r) for t, r in zip(requests["text"], requests["reference"])]
    requests["strict_correct"] = [s for s, _ in scored]
    requests["flexible_correct"] = [f for _, f in scored]
    requests["target_text"] = requests["problem"].map(reference)
    requests["matches_target"] = requests["text"] == requests["target_text"]
    return requests


def build_tables(
    staged: Path, cond: Condition, reference: dict[str, str], info: list[dict[str, Any]]
) -> dict[str, Any]:
    """Typed Parquet tables from the fetched records; returns the condition's figures (cost
    from the playbook's `costs` file over the default table)."""
    costs = cond.playbook.costs
    return tables_from_records(
        staged, cond.id, lambda r: score_requests(r, reference), cond.playbook.workload.slo,
        hosts_info=info, costs=load_cost_table(Path(costs)) if costs else None,
    )  # fmt: skip


def hosts_info(hosts: HostControl, lab_hosts: Iterable[InventoryHost], server: str,
               server_span: tuple[float, float]) -> list[dict[str, Any]]:  # fmt: skip
    """Per host: role, class and clock offset to the controller (measured over SSH); the
    server's span as timed by the controller."""
    rows = []
    for h in lab_hosts:
        clock = measure_offset(lambda h=h: float(hosts.run(h, "date +%s.%N").stdout), probes=3)
        row = {"dev": h.name, "role": h.role, "host_class": h.host_class,
               "clock_offset_s": clock.offset_s, "clock_offset_err_s": clock.error_s}  # fmt: skip
        if h.name == server:
            row.update(t_start=server_span[0], t_end=server_span[1])
        rows.append(row)
    return rows


def condition_devices(inv: Inventory, cond: Condition) -> list[InventoryHost]:
    """The devices a condition runs on: the first `lab.devices` of the lab (all if unset)."""
    count = cond.playbook.lab.devices
    return list(inv.devices if count is None else inv.devices[:count])


def condition_profiles(devices: list[InventoryHost], cond: Condition) -> dict[str, LinkProfile]:
    """Each device's primary-link profile in this condition: the playbook's `link`, seeded
    with the playbook's seed unless it sets its own."""
    link = cond.playbook.link
    if link.seed is None:
        link = link.model_copy(update={"seed": cond.playbook.seed})
    return {d.name: link for d in devices}


def link_events(
    lab: Lab, since: float, until: float, when: ConditionTime
) -> dict[str, list[dict[str, Any]]]:
    """What happened to the links during a condition: the profile changes the packet holder
    applied (schedules, traces, reloads) and the backup path's failovers, each time-stamped on
    the condition's emulated clock, delays in emulated time."""
    changes = []
    for c in link_changes(lab):
        if since <= float(c.get("at", 0.0)) <= until:
            c = {**c, "at": when.wall(float(c["at"]))}
            for key in ("delay_us", "jitter_us"):
                if isinstance(c.get(key), int | float):
                    c[key] = c[key] / when.dilation
            changes.append(c)
    failovers = [
        {**f.model_dump(), "t": when.wall(f.t)}
        for f in read_failovers(failover_log(lab), since, until)
    ]
    return {"changes": changes, "failovers": failovers}


def condition_dilation(cond: Condition) -> float:
    """The condition's time dilation (the runner resolves `auto` before the condition)."""
    value = cond.playbook.lab.time_dilation
    if value == "auto":
        raise ValueError(f"{cond.id}: lab.time_dilation auto was not resolved before the run")
    return float(value)


def place_emulation(
    hosts: HostControl, host: InventoryHost, cond: Condition, paced: bool, when: ConditionTime,
    inputs: Path, remote_dir: str,
) -> dict[str, Any]:  # fmt: skip
    """Write the host's `--emulation` file (testbed.runner.emulation), put it beside its
    records and return what it says."""
    doc = host_emulation(host, cond.playbook, paced, when)
    local = inputs / f"{host.name}.{EMULATION_FILE}"
    local.write_text(json.dumps(doc, indent=1))
    hosts.put(host, local, f"{remote_dir}/{EMULATION_FILE}")
    return doc


def run_condition(ctx: RunContext, cond: Condition, staged: Path) -> dict[str, Any]:
    """Run one condition; returns the journal fields `link` and `metrics` (raises on failure)."""
    pb = cond.playbook
    lab, hosts = ctx.lab, ctx.hosts
    inv = lab.inventory()
    server = inv.server
    devices = condition_devices(inv, cond)
    when = ConditionTime.starting_now(condition_dilation(cond))
    profiles = condition_profiles(devices, cond)
    applied = {d: dilate(p, when.dilation) for d, p in profiles.items()}
    profile = next(iter(profiles.values()))
    link: dict[str, Any] = {"requested": profile.model_dump(), "loss_semantics": LOSS_SEMANTICS,
                            "time_dilation": when.dilation}  # fmt: skip
    if when.dilation != 1:
        link["applied"] = next(iter(applied.values())).model_dump(mode="json")
    procs: list[RemoteProcess] = []
    t_begin = time.time()
    try:
        ctx.say(f"{cond.id}: link rtt {profile.rtt_ms} ms, loss {profile.loss}"
                + (f", time dilated x{when.dilation:g}" if when.dilation != 1 else ""))  # fmt: skip
        knobs = pb.impairment
        backup = backup_profiles(lab, list(profiles), seed=pb.seed)
        backup_applied = {d: dilate(p, when.dilation) for d, p in backup.items()}
        if backup and lab.emulated:  # the emulated lab's link monitor
            set_monitor_dilation(lab, when.dilation)
        imp = apply_each(lab, applied, backend=knobs.backend, backup=backup_applied)
        link.update(backend=imp.backend, backend_reason=imp.reason, holder=imp.holder)
        if backup:
            link["backup"] = {"requested": {d: p.model_dump() for d, p in backup.items()}}
        if ctx.dry_run:
            ctx.say(f"  probe {len(devices)} device links, {knobs.probe_packets} UDP packets each")
        else:
            n = knobs.probe_packets

            def save_link() -> None:
                atomic_write_json(staged / "link.json", link)

            def primary() -> dict[str, ProbeResult]:
                dilated = applied[next(iter(applied))]
                return probe_links(lab, list(profiles), requested=dilated, count=n)

            probe_checked(link, primary, applied, knobs, save_link, ctx.say,
                          when.dilation, profiles)  # fmt: skip
            if backup:  # over each device's backup interface, while traffic stays on primary
                probe_checked(link["backup"], lambda: probe_backup(lab, backup_applied, count=n),
                              backup_applied, knobs, save_link, ctx.say, when.dilation,
                              backup)  # fmt: skip

        records = f"runs/{cond.id}"
        server_records = f"{server.workdir}/{records}"
        alone = pb.mode in SERVER_ALONE  # the server host answers everything
        uses_server = pb.mode != "device-only"
        tokenizer = None if ctx.dry_run else ctx.target_model
        problems = problems_for(pb.workload, [d.name for d in devices], tokenizer)
        arrivals = arrivals_for(pb.workload, [d.name for d in devices])
        inputs = staged / "inputs"
        inputs.mkdir(parents=True, exist_ok=True)
        for dev in devices:
            write_problem_file(problems[dev.name], inputs / f"{dev.name}.problems.jsonl",
                               arrivals[dev.name])  # fmt: skip
        if uses_server:
            hosts.run(server, f"rm -rf {shlex.quote(server_records)} && mkdir -p {server_records}")
            place_emulation(hosts, server, cond, lab.emulated, when, inputs, server_records)
        target = model_on(server, "target_model", ctx.target_model)
        t_server = time.time()  # the server's span, on the controller's clock
        sproc: RemoteProcess | None = None
        if alone:
            every = inputs / f"{server.name}.problems.jsonl"
            names = [d.name for d in devices]
            lines = interleaved([inputs / f"{n}.problems.jsonl" for n in names], names)
            every.write_text(lines, encoding="utf-8")
            hosts.put(server, every, f"{server_records}/problems.jsonl")
            ctx.say(f"{cond.id}: answering every device's problems on {server.name} ({pb.mode})")
            command = server_alone_command(
                server, cond, target, model_on(server, "draft_model", ctx.draft_model),
                server_records,
            )  # fmt: skip
            workers = {server.name: hosts.start(server, "sled-local", command, env=AGENT_ENV)}
        else:
            if uses_server:
                ctx.say(f"{cond.id}: starting the verification server on {server.name}")
                place_lab_key(hosts, [server, *devices], ensure_lab_key(lab.runtime_dir))
                t_server = time.time()
                sproc = hosts.start(
                    server, "sled-server", server_command(server, cond, target, server_records),
                    env=AGENT_ENV,
                )  # fmt: skip
                procs.append(sproc)
                if not ctx.dry_run:
                    wait_for_file(hosts, server, f"{server_records}/ready", sproc, 120)
            for dev in devices:
                dev_records = f"{dev.workdir}/{records}"
                hosts.run(dev, f"rm -rf {shlex.quote(dev_records)} && mkdir -p {dev_records}")
                own = inputs / f"{dev.name}.problems.jsonl"
                hosts.put(dev, own, f"{dev_records}/problems.jsonl")
                place_emulation(hosts, dev, cond, lab.emulated, when, inputs, dev_records)
            ctx.say(f"{cond.id}: starting {len(devices)} device agents")
            workers = hosts.start_all(
                "sled-device",
                lambda h: device_command(
                    h, server, cond, model_on(h, "draft_model", ctx.draft_model),
                    f"{h.workdir}/{records}",
                ),
                devices,
                env=AGENT_ENV,
            )  # fmt: skip
        procs.extend(workers.values())
        if ctx.dry_run:
            return {"link": link, "metrics": {}}
        wait_for_exit(hosts, list(workers.values()), when.real_s(pb.condition_timeout_s))
        if sproc is not None:
            hosts.stop(sproc)
        procs.clear()
        ran = ([server] if uses_server else []) + ([] if alone else devices)
        span = (when.wall(t_server), when.wall(time.time()))
        info = hosts_info(hosts, ran, server.name, span)
        for h in [server] if alone else devices:
            fetch(hosts, h, f"{h.workdir}/{records}", DEVICE_FILES, workers[h.name],
                  staged / "hosts" / h.name)  # fmt: skip
        if sproc is not None:
            fetch(hosts, server, server_records, SERVER_FILES, sproc,
                  staged / "hosts" / server.name)  # fmt: skip
        link.update(link_events(lab, t_begin, time.time(), when))
        atomic_write_json(staged / "link.json", link)
        answered = [p for ps in problems.values() for p in ps]
        metrics = build_tables(
            staged, cond, ctx.reference(answered, pb.workload.max_new_tokens), info
        )
        return {"link": link, "metrics": metrics}
    finally:
        if procs:
            hosts.stop_all(procs, grace_s=2)
        clear(lab)
        if "changes" not in link:  # a failed condition: what happened to its links so far
            link.update(link_events(lab, t_begin, time.time(), when))
        if not ctx.dry_run and "summary" in link:
            atomic_write_json(staged / "link.json", link)


def describe_condition(entry: dict[str, Any]) -> str:
    """One line for the console after a condition."""
    m = entry.get("metrics") or {}
    s = (entry.get("link") or {}).get("summary") or {}
    parts = [entry["condition"], entry["status"]]
    if s.get("rtt_measured_ms") is not None:
        parts.append(f"rtt {s['rtt_measured_ms']:.2f} ms")
    if s.get("loss_measured") is not None:
        parts.append(f"loss {s['loss_measured']:.3f}")
    if m.get("system_tok_s") is not None:
        parts.append(
            f"verified {m['system_verified_tok_s']:.1f} + unverified "
            f"{m['system_unverified_tok_s']:.1f} tok/s"
        )
    if entry.get("reason"):
        parts.append(entry["reason"].splitlines()[0])
    return json.dumps(parts)[1:-1].replace('"', "")
