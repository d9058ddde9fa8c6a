"""The lab inventory: one Ansible-YAML file read by Ansible and by the Fabric layer.

Layout (the emulated lab writes the same):

    all:
      vars: {ansible_user: root, ...}          # optional, inherited by every host
      children:
        servers:
          vars: {...}                          # optional, inherited by the group's hosts
          hosts:
            server: {ansible_host: 10.77.0.1, workdir: /srv/testbed, ...}
        devices:
          hosts:
            dev1: {ansible_host: 10.77.0.2, workdir: /home/pi/testbed, ...}

Per host (after merging all → group → host vars): `ansible_host` and `workdir` are required;
`ansible_user` (required), `ansible_port` (22), `ansible_ssh_private_key_file`,
`ansible_python_interpreter` (python3), `role` (must match the group), `netns` (emulated only).
A relative key path is taken relative to the inventory file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from testbed.errors import BadInputError

Role = Literal["server", "device"]
GROUPS: dict[str, Role] = {"servers": "server", "devices": "device"}


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
    vars: dict[str, Any] = Field(default_factory=dict)


class Inventory(BaseModel):
    """Every host of a lab, servers first, with the file it came from."""

    model_config = ConfigDict(frozen=True)

    source: str
    hosts: tuple[InventoryHost, ...]
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
        for h in self.hosts:
            if h.name == name:
                return h
        raise BadInputError(
            f"{self.source}: no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )


# Ansible variable -> InventoryHost field
_FIELD_OF = {
    "ansible_host": "address",
    "ansible_user": "user",
    "ansible_port": "port",
    "ansible_ssh_private_key_file": "key_file",
    "ansible_python_interpreter": "python",
    "workdir": "workdir",
    "netns": "netns",
}
_KEY_OF = {v: k for k, v in _FIELD_OF.items()}


def _mapping(value: Any, where: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInputError(f"{source}: {where}: expected a mapping, got {type(value).__name__}")
    return value


def _groups(doc: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(all.vars, {group name: group body}) from `all.children` or top-level groups."""
    if "all" in doc:
        all_ = _mapping(doc["all"], "all", source)
        unknown = set(all_) - {"vars", "children", "hosts"}
        if unknown:
            raise BadInputError(
                f"{source}: all: unexpected key(s) {sorted(unknown)}; "
                "expected vars, children (servers, devices)"
            )
        if all_.get("hosts"):
            raise BadInputError(
                f"{source}: all.hosts: put each host under children.servers or children.devices"
            )
        return _mapping(all_.get("vars"), "all.vars", source), _mapping(
            all_.get("children"), "all.children", source
        )
    return {}, doc


def parse_inventory(doc: Any, source: str = "inventory", base_dir: Path | None = None) -> Inventory:
    """Validate a parsed inventory document; errors name `source`, the host and the key.

    Relative key paths are resolved against `base_dir` (default: the current directory).
    """
    doc = _mapping(doc, "top level", source)
    all_vars, groups = _groups(doc, source)
    seen: dict[str, str] = {}
    hosts: list[InventoryHost] = []
    base_dir = base_dir or Path.cwd()
    for group, body in groups.items():
        role = GROUPS.get(group)
        body = _mapping(body, group, source)
        if role is None:
            continue  # other groups (e.g. middleboxes) are Ansible's business
        gvars = _mapping(body.get("vars"), f"{group}.vars", source)
        for name, hvars in _mapping(body.get("hosts"), f"{group}.hosts", source).items():
            where = f"host {name!r} (group {group})"
            if name in seen:
                raise BadInputError(f"{source}: {where}: also listed in group {seen[name]}")
            seen[name] = group
            merged = {**all_vars, **gvars, **_mapping(hvars, where, source)}
            hosts.append(_host(str(name), role, merged, where, source, base_dir))
    if not any(h.role == "server" for h in hosts):
        raise BadInputError(f"{source}: expected at least one host in group 'servers'")
    hosts.sort(key=lambda h: h.role != "server")  # stable: file order within a role
    return Inventory(source=source, hosts=tuple(hosts), vars=all_vars)


def _host(
    name: str, role: Role, merged: dict[str, Any], where: str, source: str, base_dir: Path
) -> InventoryHost:
    given_role = merged.get("role", role)
    if given_role != role:
        raise BadInputError(
            f"{source}: {where}: role: expected {role!r} (its group), got {given_role!r}"
        )
    fields: dict[str, Any] = {"name": name, "role": role}
    extra: dict[str, Any] = {}
    for key, value in merged.items():
        if key in _FIELD_OF:
            fields[_FIELD_OF[key]] = value
        elif key != "role":
            extra[key] = value
    for required in ("ansible_host", "ansible_user", "workdir"):
        if _FIELD_OF[required] not in fields:
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


def load_inventory(path: Path | str) -> Inventory:
    """Read and validate an Ansible-YAML inventory file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInputError(f"{path}: cannot read inventory ({exc.strerror})") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInputError(f"{path}: not valid YAML: {exc}") from exc
    return parse_inventory(doc, str(path), base_dir=path.resolve().parent)


def inventory_document(inv_hosts: list[InventoryHost], all_vars: dict[str, Any]) -> dict:
    """The Ansible-YAML document for `inv_hosts` (inverse of `parse_inventory`)."""
    children: dict[str, Any] = {}
    for group, role in GROUPS.items():
        members = {}
        for h in inv_hosts:
            if h.role != role:
                continue
            hv: dict[str, Any] = {
                "ansible_host": h.address,
                "ansible_user": h.user,
                "ansible_port": h.port,
                "ansible_python_interpreter": h.python,
                "workdir": h.workdir,
                "role": h.role,
            }
            if h.key_file is not None:
                hv["ansible_ssh_private_key_file"] = str(h.key_file)
            if h.netns is not None:
                hv["netns"] = h.netns
            hv.update(h.vars)
            members[h.name] = hv
        children[group] = {"hosts": members}
    return {"all": {"vars": dict(all_vars), "children": children}}


def dump_inventory(inv_hosts: list[InventoryHost], all_vars: dict[str, Any]) -> str:
    """YAML text of the inventory for `inv_hosts`."""
    return yaml.safe_dump(inventory_document(inv_hosts, all_vars), sort_keys=False)
