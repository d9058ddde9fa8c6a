"""The agents on the lab's hosts: their command lines, started through Fabric, waited for,
and their records fetched back.

Command lines are derived from the playbook: every `sled` setting is declared once in
`SledSection` with the agent that takes it, and goes to that agent as the flag of its name
(`agent_flags`). Each agent also gets its host's `--emulation` document
(`testbed.runner.emulation`), placed beside its records.
"""

from __future__ import annotations

import json
import shlex
import time
import zlib
from pathlib import Path
from typing import Any, Literal

from testbed.config.playbook import Condition, SledSection
from testbed.core.errors import AgentEnded, AgentError
from testbed.hosts.control import HostControl, RemoteProcess
from testbed.hosts.inventory import InventoryHost
from testbed.runner.emulation import EMULATION_FILE, ConditionTime, host_emulation
from testbed.runner.lab_key import key_path_on

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


def agent_flags(section: SledSection, agent: Literal["device", "server"]) -> list[str]:
    """The flags of every setting `agent` takes (`--draft-len 4 ...`), from the section's own
    declaration of each (`device_setting` / `server_setting`); unset ones are left out."""
    flags: list[str] = []
    for name, field in SledSection.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        value = getattr(section, name)
        if extra.get("agent") == agent and value is not None:
            flags += [str(extra.get("flag") or "--" + name.replace("_", "-")), str(value)]
    return flags


def model_on(host: InventoryHost, key: str, default: str) -> str:
    """A model path on a host: its host variable (on lab kind `inventory`, the file the site
    playbook placed, which the lab took from the host's facts, unless the inventory names
    one) or the controller's."""
    return str(host.vars.get(key, default))


def device_seed(seed: int, device: str) -> int:
    """A device's sampling seed: the playbook's, made distinct per device (stable by name)."""
    return (seed * 1_000_003 + zlib.crc32(device.encode())) % 2**31


def server_command(host: InventoryHost, cond: Condition, model: str, records: str) -> str:
    """The verification server (modes sled, centralized)."""
    pb = cond.playbook
    return shlex.join([
        host.agent_python, "-m", "agents.sled.server",
        "--bind", f"{host.link_address}:{SERVER_PORT}", "--model", model,
        "--device", pb.models.server_device, "--seed", str(pb.seed),
        *agent_flags(pb.sled, "server"),
        "--records", records, "--ready-file", f"{records}/ready",
        "--key-file", key_path_on(host), "--emulation", f"{records}/{EMULATION_FILE}",
    ])  # fmt: skip


def device_command(
    host: InventoryHost, server: InventoryHost, cond: Condition, model: str, records: str
) -> str:
    """One device agent (modes sled, centralized, device-only)."""
    pb = cond.playbook
    args = [
        host.agent_python, "-m", "agents.sled.device",
        "--dev", host.name, "--model", model, "--mode", pb.mode,
        *agent_flags(pb.sled, "device"),
        "--seed", str(device_seed(pb.seed, host.name)),
        "--max-new", str(pb.workload.max_new_tokens),
        "--problems", f"{records}/problems.jsonl", "--records", records,
        "--emulation", f"{records}/{EMULATION_FILE}",
    ]  # fmt: skip
    if pb.mode != "device-only":
        server_at = f"{server.link_address}:{SERVER_PORT}"
        args += ["--server", server_at, "--key-file", key_path_on(host)]
    return shlex.join(args)


def local_command(
    host: InventoryHost, cond: Condition, target: str, draft: str, records: str
) -> str:
    """`agents.sled.local` on the server: every device's problems, AD or SD (server-ad/-sd)."""
    pb = cond.playbook
    mode = SERVER_ALONE[pb.mode]
    args = [
        host.agent_python, "-m", "agents.sled.local",
        "--mode", mode, "--target", target, "--device", pb.models.server_device,
        "--threads", str(pb.sled.server_threads), "--draft-len", str(pb.sled.draft_len),
        "--max-new", str(pb.workload.max_new_tokens),
        "--problems", f"{records}/problems.jsonl", "--records", records,
        "--emulation", f"{records}/{EMULATION_FILE}",
    ]  # fmt: skip
    if mode == "sd":
        args += ["--draft", draft]
    return shlex.join(args)


def place_emulation(
    hosts: HostControl, host: InventoryHost, cond: Condition, paced: bool, when: ConditionTime,
    inputs: Path, remote_dir: str,
) -> dict[str, Any]:  # fmt: skip
    """Write the host's `--emulation` document (testbed.runner.emulation), put it beside its
    records and return what it says."""
    doc = host_emulation(host, cond.playbook, paced, when)
    local = inputs / f"{host.name}.{EMULATION_FILE}"
    local.write_text(json.dumps(doc, indent=1))
    hosts.put(host, local, f"{remote_dir}/{EMULATION_FILE}")
    return doc


def wait_for_file(hosts: HostControl, host: InventoryHost, path: str, proc: RemoteProcess,
                  timeout_s: float) -> None:  # fmt: skip
    """Poll until path exists on host; fail early (with its log) if proc has died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if hosts.run(host, f"test -f {shlex.quote(path)}", check=False).ok:
            return
        if not hosts.is_alive(proc):  # it ended by itself before it was ready: a fault
            code, tail = hosts.exit_code(proc), hosts.log_tail(proc)
            raise AgentEnded(f"{host.name}: {proc.name} exited early ({code}):\n{tail}",
                             host.name, proc.name, code, tail)  # fmt: skip
        time.sleep(0.3)
    raise AgentError(f"{host.name}: {proc.name} not ready after {timeout_s:.0f} s")


def wait_for_exit(hosts: HostControl, procs: list[RemoteProcess], timeout_s: float) -> None:
    """Wait until every process has exited by itself, with exit code 0 (AgentEnded for one
    that did not)."""
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
            tail = hosts.log_tail(p)
            raise AgentEnded(f"{p.host}: {p.name} exited with {code}:\n{tail}", p.host, p.name,
                             code, tail)  # fmt: skip


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
