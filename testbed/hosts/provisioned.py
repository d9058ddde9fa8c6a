"""What the site playbook left on each host, read back over Fabric.

The Ansible roles write `<workdir>/facts/*.json` on every host they provision:

    host.json     host, role, class, address, Python, the agents' Python
                  ("testbed_agent_python": the venv the role made), architecture, kernel
    netem.json    {"sch_netem": bool, "ifb": bool, "backend": "tc-netem" | "userspace"}, and
                  where the role built the packet holder (no sch_netem, or
                  `netem_build_holder: always`) "holder_path": path, "holder_source_sha256"
    models.json   drafters: {"draft_model": path, ...}; verifiers: {"target_model": path, ...}

A run on lab kind `inventory` reads these itself: `InventoryLab.up` (testbed.labs.physical)
calls `with_provisioned_facts` for the lab's hosts, which turns models.json and netem.json
into the host variables the lab and the runner read (`draft_model`, `target_model`,
`holder_path`, `testbed_agent_python`), so the agents start on the files Ansible placed and
verified, with the Python it installed them in, and each host runs the holder built there,
rather than paths on the controller. The inventory needs no
rewriting; a variable it sets itself wins over the facts (an engineer who writes a path means
it). The reading is lenient about hosts the playbook did not provision (no facts file: their
variables stay as they are, and the lab says which) and strict about what it finds: a file
that is not a JSON object, or a path that is not a non-empty string, is an error naming the
host, the file and the key. A dry run contacts no host: it prints the reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from testbed.core.errors import AgentError
from testbed.core.fanout import GroupResult, fan_out, raise_failures
from testbed.hosts.control import HostControl, remote_path
from testbed.hosts.inventory import AGENT_PYTHON_VAR, Inventory, InventoryHost

FACTS_DIR = "facts"
MODEL_KEYS = ("draft_model", "target_model")
HOLDER_VAR = "holder_path"
"""The packet holder's path on a host: its inventory variable and its key in netem.json."""
FACT_VARS = {"models": MODEL_KEYS, "netem": (HOLDER_VAR,), "host": (AGENT_PYTHON_VAR,)}
"""Facts file (facts/NAME.json) -> the keys in it that become host variables (paths)."""
NO_FILE = 66
"""Exit status of the read where the facts file is not there."""


def facts_path(host: InventoryHost, name: str) -> str:
    """Where the site playbook leaves facts file `name` on `host`."""
    return f"{host.workdir}/{FACTS_DIR}/{name}.json"


def read_command(path: str) -> str:
    """A shell command printing the file at `path`, exiting NO_FILE where there is none."""
    quoted = remote_path(path)
    return f"test -e {quoted} || exit {NO_FILE}; cat {quoted}"


def parse_facts(host: str, path: str, text: str, paths: Iterable[str] = ()) -> dict[str, Any]:
    """The facts file at `path` on `host` as a dict; AgentError naming the host, the file and
    the key where it is not a JSON object, or gives a key of `paths` a value other than a
    path (a non-empty string)."""
    try:
        facts = json.loads(text)
    except ValueError as exc:
        raise AgentError(f"{host}: {path}: not JSON ({exc})") from exc
    if not isinstance(facts, dict):
        raise AgentError(f"{host}: {path}: expected a JSON object, got {type(facts).__name__}")
    for key in paths:
        value = facts.get(key)
        if key in facts and not (isinstance(value, str) and value):
            raise AgentError(
                f"{host}: {path}: {key}: expected a path (a non-empty string), got {value!r}"
            )
    return facts


def read_facts(
    hc: HostControl,
    name: str,
    hosts: Iterable[str | InventoryHost] | None = None,
    paths: Iterable[str] = (),
) -> GroupResult:
    """`<workdir>/facts/<name>.json` from each host (default: all): host -> dict, or None where
    there is no such file (the site playbook has not provisioned it; in a dry run, every host:
    the read is printed, not done). GroupError naming each host that cannot be reached, whose
    file is not a JSON object, or whose file gives a key of `paths` a value other than a path
    (a non-empty string), with the file and the key."""
    keys = tuple(paths)

    def one(h: InventoryHost) -> dict[str, Any] | None:
        path = facts_path(h, name)
        res = hc.run(h, read_command(path), cwd="/", check=False)
        if hc.dry_run or res.returncode == NO_FILE:
            return None
        if not res.ok:
            raise AgentError(f"{h.name}: cannot read {path}: {res.stderr.strip()[-300:]}")
        return parse_facts(h.name, path, res.stdout, keys)

    targets = [hc.host(h) for h in (hosts if hosts is not None else hc.inventory.hosts)]
    return raise_failures(f"reading facts/{name}.json", fan_out(one, targets))


@dataclass(frozen=True)
class ProvisionedFacts:
    """The inventory with the facts applied, and what was found."""

    inventory: Inventory
    taken: dict[str, dict[str, str]] = field(default_factory=dict)
    """host -> the variables it got from its facts."""
    missing: dict[str, list[str]] = field(default_factory=dict)
    """host -> its facts files that are not there (`facts/models.json`, ...)."""


def with_provisioned_facts(
    hc: HostControl, hosts: Iterable[str | InventoryHost] | None = None
) -> ProvisionedFacts:
    """The inventory with the variables of `hosts` (default: all) from what the site playbook
    left on them: `draft_model` / `target_model` where Ansible placed the models
    (facts/models.json), `holder_path` where it built the packet holder (facts/netem.json),
    each unless the inventory sets it itself. A host without a file keeps its variables and is
    listed in `missing`; in a dry run nothing is read, so nothing is taken or missing. A bad
    file: GroupError (see `read_facts`)."""
    names = [hc.host(h).name for h in (hosts if hosts is not None else hc.inventory.hosts)]
    read = {name: read_facts(hc, name, names, keys) for name, keys in FACT_VARS.items()}
    if hc.dry_run:
        return ProvisionedFacts(hc.inventory)
    taken: dict[str, dict[str, str]] = {}
    missing: dict[str, list[str]] = {}
    updated = []
    for h in hc.inventory.hosts:
        found: dict[str, str] = {}
        for name, keys in FACT_VARS.items():
            facts = read[name].get(h.name)
            if facts is None and h.name in names:
                missing.setdefault(h.name, []).append(f"{FACTS_DIR}/{name}.json")
            elif facts is not None:
                found |= {k: facts[k] for k in keys if k in facts and not h.vars.get(k)}
        if found:
            taken[h.name] = found
        updated.append(h.model_copy(update={"vars": {**h.vars, **found}}) if found else h)
    inventory = hc.inventory.model_copy(update={"hosts": tuple(updated)})
    return ProvisionedFacts(inventory, taken, missing)
