"""Reads an Ansible inventory with ansible-core's own API; run as a child process by
`testbed.hosts.inventory.load_inventory` (importing ansible-core patches interpreter globals).

    python -m testbed.hosts.ansible_vars INVENTORY [--vault-password-file FILE]

prints one JSON object: {"hosts": [{"name", "role", "vars"}], "all_vars": {...}} with each
testbed host's variables after Ansible's precedence, vault decryption and Jinja templating,
or {"error": "..."} (naming the file, host and key) and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.vault import EncryptedString, VaultHelper, VaultLib, get_file_vault_secret
from ansible.template import Templar
from ansible.vars.manager import VariableManager

from testbed.core.errors import BadInputError
from testbed.hosts.inventory import FIELD_OF, GROUP_OF, ROLE_GROUPS
from testbed.topo.classes import Role

# Variables Ansible adds to every host itself (not set by the lab).
_MAGIC_VARS = frozenset(
    {
        "ansible_check_mode",
        "ansible_config_file",
        "ansible_diff_mode",
        "ansible_facts",
        "ansible_forks",
        "ansible_inventory_sources",
        "ansible_playbook_python",
        "ansible_run_tags",
        "ansible_skip_tags",
        "ansible_verbosity",
        "ansible_version",
        "environment",
        "group_names",
        "groups",
        "hostvars",
        "inventory_dir",
        "inventory_file",
        "inventory_hostname",
        "inventory_hostname_short",
        "omit",
        "playbook_dir",
        "role_names",
        "vars",
    }
)


def read(path: Path, vault_password_file: str | None = None) -> dict[str, Any]:
    """The testbed hosts of the inventory at `path` with their variables (see the docstring)."""
    source = str(path)
    loader = DataLoader()
    secrets = _vault_secrets(loader, vault_password_file, source)
    loader.set_vault_secrets(secrets)
    try:
        if path.is_file():
            loader.load_from_file(str(path))  # syntax errors with line and column
        manager = InventoryManager(loader=loader, sources=[str(path)])
        variables = VariableManager(loader=loader, inventory=manager)
    except AnsibleError as exc:
        raise BadInputError(f"{source}: not a valid Ansible inventory: {exc.message}") from exc
    vault = _Decrypter(secrets, source)
    hosts = []
    for host in manager.get_hosts():
        role = _role_of(host.name, [g.name for g in host.get_groups()], source)
        if role is None:
            continue  # controller and other groups are Ansible's business
        where = f"host {host.name!r} (group {GROUP_OF[role]})"
        merged = vault.value(dict(variables.get_vars(host=host, include_hostvars=False)), where)
        hosts.append(
            {"name": host.name, "role": role, "vars": _render(loader, merged, where, source)}
        )
    all_vars = _plain_tree(vault.value(dict(manager.groups["all"].get_vars()), "group all"))
    return {"hosts": hosts, "all_vars": all_vars}


def _vault_secrets(loader: Any, password_file: Path | str | None, source: str) -> list:
    """Vault secrets from the password file (a file or, as for Ansible, an executable)."""

    password_file = password_file or os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if not password_file:
        return []
    try:
        secret = get_file_vault_secret(
            filename=str(password_file), vault_id="default", loader=loader
        )
        secret.load()
    except AnsibleError as exc:
        raise BadInputError(
            f"{source}: vault password file {password_file}: {exc.message}"
        ) from exc
    return [("default", secret)]


class _Decrypter:
    """Replaces Ansible-Vault-encrypted strings in a value by their plain text."""

    def __init__(self, secrets: list, source: str) -> None:

        self.vault = VaultLib(secrets)
        self.source = source

    def value(self, value: Any, where: str, key: str = "") -> Any:
        from ansible.errors import AnsibleError

        if isinstance(value, EncryptedString):
            try:
                text = self.vault.decrypt(VaultHelper.get_ciphertext(value, with_tags=True))
            except AnsibleError as exc:
                raise BadInputError(
                    f"{self.source}: {where}: {key}: cannot decrypt the vaulted value "
                    f"({exc.message}); "
                    "give the vault password file (--vault-password-file or "
                    "$ANSIBLE_VAULT_PASSWORD_FILE)"
                ) from exc
            return text.decode()
        if isinstance(value, Mapping):
            return {str(k): self.value(v, where, k or key) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v, where, key) for v in value]
        return value  # still tagged: Ansible templates only what it read from trusted files


def _native(value: Any) -> Any:
    """A plain bool/int/float/str for Ansible's tagged scalars; other values unchanged."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _render(loader: Any, merged: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    """Template Jinja in the host's variables (`workdir: /home/{{ ansible_user }}/w`)."""

    templar = Templar(loader=loader, variables=merged)
    out: dict[str, Any] = {}
    for key, value in merged.items():
        if key in _MAGIC_VARS:
            continue
        try:
            out[key] = _plain_tree(templar.template(value))
        except AnsibleError as exc:
            if key in FIELD_OF:
                raise BadInputError(f"{source}: {where}: {key}: {exc.message}") from exc
            out[key] = value  # e.g. needs facts: Ansible templates it on the host
    return out


def _plain_tree(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_tree(v) for v in value]
    return _native(value)


def _role_of(name: str, groups: Iterable[str], source: str) -> Role | None:
    roles = {ROLE_GROUPS[g]: g for g in groups if g in ROLE_GROUPS}
    if len(roles) > 1:
        listed = " and ".join(sorted(roles.values()))
        raise BadInputError(f"{source}: host {name!r}: in {listed}; a host plays one role")
    return next(iter(roles), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inventory", type=Path)
    ap.add_argument("--vault-password-file")
    args = ap.parse_args(argv)
    try:
        out = read(args.inventory, args.vault_password_file)
    except BadInputError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
