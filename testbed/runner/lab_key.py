"""The lab's protocol key: generated once per lab, placed on every host as `lab.key`.

Agents authenticate every datagram with it (`agents.protocol.auth`). An emulated lab gets a
fresh key in its runtime folder; a physical lab whose inventory holds `lab_protocol_key`
(in Ansible Vault) has it placed by the site playbook, so the runner leaves it alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from agents.protocol.auth import new_key_text
from testbed.hosts.control import HostControl
from testbed.hosts.inventory import InventoryHost

KEY_FILE = "lab.key"


def key_path_on(host: InventoryHost) -> str:
    """Where the agents on host read the key (the site playbook's `testbed_key_file`)."""
    return f"{host.workdir}/{KEY_FILE}"


def ensure_lab_key(folder: Path) -> Path:
    """The lab's key file under folder, created (mode 0600) if it does not exist yet."""
    path = Path(folder) / KEY_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(new_key_text())
    return path


def place_lab_key(hosts: HostControl, lab_hosts: Iterable[InventoryHost], key: Path) -> None:
    """Copy the key to every host whose inventory does not provide one through Ansible."""
    for h in lab_hosts:
        if "lab_protocol_key" not in h.vars:
            hosts.put(h, key, key_path_on(h))
            hosts.run(h, f"chmod 600 {key_path_on(h)}")
