"""What the site playbook left on each host, read back over Fabric.

The Ansible roles write `<workdir>/facts/*.json` on every host they provision:

    host.json     host, role, class, address, Python, architecture, kernel
    netem.json    {"sch_netem": bool, "ifb": bool, "backend": "tc-netem" | "userspace"}, and
                  where the role built the packet holder (no sch_netem, or
                  `netem_build_holder: always`) "holder_path": path, "holder_source_sha256"
    models.json   drafters: {"draft_model": path, ...}; verifiers: {"target_model": path, ...}

`with_provisioned_facts` turns models.json and netem.json into the host variables the lab and
the runner read (`draft_model`, `target_model`, `holder_path`), so a run on lab kind
`inventory` uses the files Ansible placed and verified, and the holder it built on each host,
rather than paths on the controller.
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
HOLDER_VAR = "holder_path"
"""The packet holder's path on a host: its inventory variable and its key in netem.json."""


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


def with_provisioned_facts(hc: HostControl) -> Inventory:
    """The inventory with each host's variables from what the site playbook left there:
    `draft_model` / `target_model` set to where Ansible placed them (facts/models.json), and
    `holder_path` to the packet holder it built (facts/netem.json) unless the host names its
    own; GroupError naming the hosts that lack a file."""
    models, netem = read_facts(hc, "models"), read_facts(hc, "netem")
    hosts = []
    for h in hc.inventory.hosts:
        found = {k: v for k, v in models[h.name].items() if k in MODEL_KEYS}
        built = netem[h.name].get(HOLDER_VAR)
        if built and not h.vars.get(HOLDER_VAR):
            found[HOLDER_VAR] = built
        hosts.append(h.model_copy(update={"vars": {**h.vars, **found}}))
    return hc.inventory.model_copy(update={"hosts": tuple(hosts)})
