"""The lab's state file: what `up` created, so `down` (from any process) can remove it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from testbed.core.errors import LabError
from testbed.core.files import atomic_write_text
from testbed.labs.setup import LabHost, LabSetup

STATE_FILE = "state.json"


class LabState(BaseModel):
    """Everything needed to use or remove a lab; written before and after each step of `up`."""

    setup: LabSetup
    state_dir: Path
    status: Literal["creating", "up", "failed"] = "creating"
    hosts: list[LabHost]
    support_hosts: list[LabHost] = []
    """Hosts beside the topology's (a rehearsal lab's controller and middlebox)."""
    controller_ip: str
    controller_link: str
    bridge_netns: str
    namespaces: list[str] = []
    links: list[str] = []
    sshd_pid_files: dict[str, Path] = {}
    client_key: Path
    inventory: Path
    created_at: float = 0.0
    up_seconds: float | None = None

    @property
    def path(self) -> Path:
        return self.state_dir / STATE_FILE

    def save(self) -> None:
        """Write atomically (a crash never leaves half a state file)."""
        atomic_write_text(self.path, self.model_dump_json(indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> LabState:
        path = Path(state_dir) / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise LabError(
                f"no lab state in {state_dir} (is the lab up? `testbed lab clean` removes "
                "leftovers of a lab whose state is gone)"
            ) from exc
        except (OSError, ValueError) as exc:
            raise LabError(f"{path}: unreadable lab state: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise LabError(f"{path}: invalid lab state: {exc}") from exc
