"""What the site playbook left on each host, read back over Fabric.

The Ansible roles write `<workdir>/facts/*.json` on every host they provision:

    host.json     host, role, class, address, Python, architecture, kernel
    netem.json    {"sch_netem": bool, "ifb": bool, "backend": "tc-netem" | "userspace"}
    models.json   drafters: {"draft_model": path, ...}; verifiers: {"target_model": path, ...}

`with_placed_models` turns models.json into the host variables the runner reads
(`draft_model`, `target_model`), so a run on lab kind `inventory` uses the files Ansible placed
and verified rather than paths on the controller.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from testbed.errors import AgentError
from testbed.hosts.control import HostControl, remote_path
from testbed.hosts.group import GroupResult, raise_failures, run_in_threads
from testbed.hosts.inventory import Inventory, InventoryHost

FACTS_DIR = "facts"
MODEL_KEYS = ("draft_model", "target_model")


def read_facts(
    hc: HostControl, name: str, hosts: Iterable[str | InventoryHost] | None = None
) -> GroupResult:
    """`<workdir>/facts/<name>.json` from each host (default: all): host -> dict, or GroupError
    naming each host whose file is missing (not provisioned) or not JSON."""

    def one(h: InventoryHost) -> dict[str, Any]:
        path = f"{h.workdir}/{FACTS_DIR}/{name}.json"
        res = hc.run(h, f"cat {remote_path(path)}", check=False)
        if not res.ok:
            raise AgentError(f"{h.name}: no {path} (run the site playbook on it first)")
        try:
            return dict(json.loads(res.stdout))
        except ValueError as exc:
            raise AgentError(f"{h.name}: {path}: not JSON ({exc})") from exc

    targets = [hc.host(h) for h in (hosts if hosts is not None else hc.inventory.hosts)]
    return raise_failures(f"reading facts/{name}.json", run_in_threads(one, targets))


def with_placed_models(hc: HostControl) -> Inventory:
    """The inventory with each host's `draft_model` / `target_model` set to where Ansible
    placed it (facts/models.json); GroupError naming the hosts that lack the file."""
    facts = read_facts(hc, "models")
    hosts = []
    for h in hc.inventory.hosts:
        placed = {k: v for k, v in facts[h.name].items() if k in MODEL_KEYS}
        hosts.append(h.model_copy(update={"vars": {**h.vars, **placed}}))
    return hc.inventory.model_copy(update={"hosts": tuple(hosts)})
