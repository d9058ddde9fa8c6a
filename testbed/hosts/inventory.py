"""The lab inventory: one Ansible-YAML file read by Ansible and by the Fabric layer.

It is read through ansible-core's own inventory API (InventoryManager + VariableManager), so
every form Ansible accepts works: nested groups, host ranges (`pi5-[1:8]`), `group_vars/` and
`host_vars/` beside the file, Jinja in variables and Ansible-Vault-encrypted values.

Groups with a meaning to the testbed (any nesting below them is fine):

    verifiers     the edge server(s) holding the target model   -> role "server"
    drafters      edge devices (children by class: pi5, jetson_orin_nano) -> role "device"
    middleboxes   optional hosts on the path that apply impairment -> role "middlebox"
    controller    where `testbed` runs (Ansible's business only)

Per host, after Ansible's variable precedence: `ansible_user` and `workdir` are required;
`ansible_host` (the host name), `ansible_port` (22), `ansible_ssh_private_key_file`,
`ansible_python_interpreter` (python3), `host_class` (e.g. pi5), `netns` (emulated labs) are
optional; everything else lands in `InventoryHost.vars`. Two of those the harness reads too:
`link_ip`, the host's address on the device <-> server link where that is not `ansible_host`
(hosts managed over a wired LAN and linked over Wi-Fi, or through a middlebox on another
segment), and `testbed_agent_python`, the Python the agents run with (the site playbook's
venv, read from the host's facts; default `ansible_python_interpreter`). A relative key path
is taken relative to the inventory file's folder. Vault passwords come from
`vault_password_file` or, as for Ansible, `$ANSIBLE_VAULT_PASSWORD_FILE`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from testbed.core.errors import BadInputError
from testbed.topo.classes import Role

ROLE_GROUPS: dict[str, Role] = {
    "verifiers": "server",
    "drafters": "device",
    "middleboxes": "middlebox",
}
"""Inventory group -> the role its hosts play (a host may be in only one of them)."""
GROUP_OF: dict[Role, str] = {role: group for group, role in ROLE_GROUPS.items()}
LINK_IP_VAR = "link_ip"
AGENT_PYTHON_VAR = "testbed_agent_python"


class InventoryHost(BaseModel):
    """One host as the controller sees it: how to reach it and where it works."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    role: Role
    address: str = Field(min_length=1)
    user: str = Field(min_length=1)
    port: int = Field(22, ge=1, le=65535)
    key_file: Path | None = None
    python: str = "python3"
    workdir: str = Field(min_length=1)
    netns: str | None = None
    host_class: str | None = None
    vars: dict[str, Any] = Field(default_factory=dict)

    @property
    def link_address(self) -> str:
        """Its address on the device <-> server link: `link_ip`, else its address."""
        return str(self.vars.get(LINK_IP_VAR) or self.address)

    @property
    def agent_python(self) -> str:
        """The Python its agents run with: `testbed_agent_python`, else its `python`."""
        return str(self.vars.get(AGENT_PYTHON_VAR) or self.python)


class Inventory(BaseModel):
    """Every testbed host of a lab (servers first, then devices), and the optional middleboxes."""

    model_config = ConfigDict(frozen=True)

    source: str
    hosts: tuple[InventoryHost, ...]
    middleboxes: tuple[InventoryHost, ...] = ()
    vars: dict[str, Any] = Field(default_factory=dict)

    @property
    def servers(self) -> list[InventoryHost]:
        return [h for h in self.hosts if h.role == "server"]

    @property
    def devices(self) -> list[InventoryHost]:
        return [h for h in self.hosts if h.role == "device"]

    @property
    def server(self) -> InventoryHost:
        return self.servers[0]

    def host(self, name: str) -> InventoryHost:
        for h in (*self.hosts, *self.middleboxes):
            if h.name == name:
                return h
        names = ", ".join(h.name for h in (*self.hosts, *self.middleboxes))
        raise BadInputError(f"{self.source}: no host {name!r} (hosts: {names})")


# Ansible variable -> InventoryHost field (the rest goes to `vars`)
FIELD_OF = {
    "ansible_host": "address",
    "ansible_user": "user",
    "ansible_port": "port",
    "ansible_ssh_private_key_file": "key_file",
    "ansible_python_interpreter": "python",
    "workdir": "workdir",
    "netns": "netns",
    "host_class": "host_class",
}
_KEY_OF = {v: k for k, v in FIELD_OF.items()}
_REQUIRED = ("ansible_user", "workdir")


def load_inventory(path: Path | str, vault_password_file: Path | str | None = None) -> Inventory:
    """Read and validate an Ansible inventory (file or folder); errors name file, host, key.

    ansible-core reads it in a child process (`testbed.hosts.ansible_vars`): importing it
    patches interpreter globals (`sys.intern`) that break a later `import torch` here.
    """
    path = Path(path)
    source = str(path)
    if not path.exists():
        raise BadInputError(f"{source}: cannot read inventory (no such file or folder)")
    argv = [sys.executable, "-m", "testbed.hosts.ansible_vars", str(path)]
    if vault_password_file:
        argv += ["--vault-password-file", str(vault_password_file)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    try:
        read = json.loads(proc.stdout)
    except ValueError:
        raise BadInputError(
            f"{source}: ansible-core could not read it: {proc.stderr[-2000:]}"
        ) from None
    if "error" in read:
        raise BadInputError(read["error"])
    base_dir = path.resolve().parent if path.is_file() else path.resolve()
    hosts = [
        _host(h["name"], h["role"], h["vars"], f"host {h['name']!r} (group {GROUP_OF[h['role']]})",
              source, base_dir)
        for h in read["hosts"]
    ]  # fmt: skip
    return _inventory(source, hosts, read["all_vars"])


def _host(
    name: str, role: Role, merged: dict[str, Any], where: str, source: str, base_dir: Path
) -> InventoryHost:
    fields: dict[str, Any] = {"name": name, "role": role, "address": name}
    extra: dict[str, Any] = {}
    for key, value in merged.items():
        if key in FIELD_OF:
            fields[FIELD_OF[key]] = value
        else:
            extra[key] = value
    for required in _REQUIRED:
        if FIELD_OF[required] not in fields:
            raise BadInputError(f"{source}: {where}: missing {required}")
    key = fields.get("key_file")
    if isinstance(key, str):
        path = Path(key).expanduser()
        fields["key_file"] = path if path.is_absolute() else (base_dir / path).resolve()
    fields["vars"] = extra
    try:
        return InventoryHost(**fields)
    except ValidationError as exc:
        e = exc.errors()[0]
        field = str(e["loc"][0]) if e["loc"] else "?"
        key_name = _KEY_OF.get(field, field)
        raise BadInputError(
            f"{source}: {where}: {key_name}: {e['msg']} (got {e.get('input')!r})"
        ) from exc


def _inventory(source: str, hosts: list[InventoryHost], all_vars: dict[str, Any]) -> Inventory:
    if not any(h.role == "server" for h in hosts):
        raise BadInputError(f"{source}: expected at least one host in group 'verifiers'")
    order: dict[Role, int] = {"server": 0, "device": 1, "middlebox": 2}
    hosts.sort(key=lambda h: order[h.role])  # stable: file order within a role
    return Inventory(
        source=source,
        hosts=tuple(h for h in hosts if h.role != "middlebox"),
        middleboxes=tuple(h for h in hosts if h.role == "middlebox"),
        vars=all_vars,
    )


def inventory_document(
    inv_hosts: Iterable[InventoryHost],
    all_vars: Mapping[str, Any],
    controller: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Ansible-YAML document for `inv_hosts` (what `load_inventory` reads back).

    Devices with a `host_class` are also members of a child group of `drafters` named after
    it (`jetson-orin-nano` -> `jetson_orin_nano`); `controller` (its variables) adds the
    `controller` group's one host, `ctl`.
    """
    children: dict[str, Any] = {}
    for role, group in GROUP_OF.items():
        members = [h for h in inv_hosts if h.role == role]
        if not members and role == "middlebox":
            continue
        body: dict[str, Any] = {"hosts": {h.name: _host_vars(h) for h in members}}
        for h in members:  # class groups list their members (file order stays the host order)
            if role == "device" and h.host_class:
                sub = body.setdefault("children", {}).setdefault(_class_group(h.host_class), {})
                sub.setdefault("hosts", {})[h.name] = None
        children[group] = body
    if controller is not None:
        children["controller"] = {"hosts": {"ctl": dict(controller)}}
    return {"all": {"vars": dict(all_vars), "children": children}}


def _class_group(host_class: str) -> str:
    return host_class.replace("-", "_")


def _host_vars(h: InventoryHost) -> dict[str, Any]:
    hv: dict[str, Any] = {
        "ansible_host": h.address,
        "ansible_user": h.user,
        "ansible_port": h.port,
        "ansible_python_interpreter": h.python,
        "workdir": h.workdir,
    }
    if h.key_file is not None:
        hv["ansible_ssh_private_key_file"] = str(h.key_file)
    if h.netns is not None:
        hv["netns"] = h.netns
    if h.host_class is not None:
        hv["host_class"] = h.host_class
    hv.update(h.vars)
    return hv


def dump_inventory(
    inv_hosts: Iterable[InventoryHost],
    all_vars: Mapping[str, Any],
    controller: Mapping[str, Any] | None = None,
) -> str:
    """YAML text of the inventory for `inv_hosts` (see `inventory_document`)."""
    return yaml.safe_dump(inventory_document(inv_hosts, all_vars, controller), sort_keys=False)
