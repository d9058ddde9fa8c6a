"""The playbook's `faults` section: faults injected on purpose, at emulated times.

    faults:
      - {name: server-crash, at_s: 5, action: kill, agent: server, restart_after_s: 2}
      - {name: dev-reboot, at_s: 5, action: kill, agent: device, hosts: [dev2],
         restart_after_s: 3}
      - {name: server-stall, at_s: 5, action: freeze, agent: server, duration_s: 3}
      - {name: dev-cut, at_s: 5, action: cut, agent: device, share: 0.5, duration_s: 10}
      - {name: kv-full, at_s: 5, action: fill_kv, duration_s: 5}

`at_s` counts emulated seconds from the devices' start (`lab.time_dilation` stretches it);
`kill` sends `signal` to the agent's process (and starts it again after `restart_after_s`,
if given), `freeze` stops it (SIGSTOP) for `duration_s`, `cut` drops every packet between the
host and the server for `duration_s`, `fill_kv` fills the server's KV pool (no session may
open or grow: every device is refused `kv_pool_full`) for `duration_s`. Which faults a
condition can take is checked against its lab at `testbed validate` (`check_faults`).
"""

from __future__ import annotations

import signal
from typing import Literal

from pydantic import Field, model_validator

from testbed.config.strict import Strict
from testbed.core.errors import BadInputError

INJECTED_IN = ("sled", "centralized", "device-only")
"""The modes whose agents the injector knows (a server and device agents)."""


class FaultSpec(Strict):
    """One injected fault."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="how tables and labels name it")
    at_s: float = Field(ge=0, description="emulated seconds from the devices' start")
    action: Literal["kill", "freeze", "cut", "fill_kv"]
    agent: Literal["server", "device"] = "server"
    hosts: list[str] | None = Field(None, description="device agents: these devices")
    share: float | None = Field(
        None, gt=0, le=1, description="device agents: this share of the devices (the first)"
    )
    signal: str = Field("KILL", description="kill: the signal's name (KILL, TERM, ...)")
    restart_after_s: float | None = Field(
        None, ge=0, description="kill: start the agent again this many emulated seconds later"
    )
    duration_s: float | None = Field(None, gt=0, description="freeze, cut, fill_kv: how long")

    @model_validator(mode="after")
    def _consistent(self) -> FaultSpec:
        if self.agent == "server" and (self.hosts is not None or self.share is not None):
            raise ValueError("hosts / share: name devices; the server is one host (agent: device)")
        if self.agent == "device" and self.hosts is None and self.share is None:
            raise ValueError("agent device: give hosts (device names) or share (of the devices)")
        if self.hosts is not None and self.share is not None:
            raise ValueError("give hosts or share, not both")
        if self.action == "fill_kv" and self.agent != "server":
            raise ValueError("agent: fill_kv fills the server's KV pool (agent: server)")
        if self.action in ("freeze", "cut", "fill_kv") and self.duration_s is None:
            raise ValueError(f"duration_s: action {self.action} needs how long it lasts")
        if self.action != "kill" and self.restart_after_s is not None:
            raise ValueError("restart_after_s: only a kill restarts its agent")
        if self.action == "kill" and self.duration_s is not None:
            raise ValueError("duration_s: a kill lasts until restart_after_s (or the end)")
        if f"SIG{self.signal.upper().removeprefix('SIG')}" not in signal.Signals.__members__:
            raise ValueError(f"signal: {self.signal!r} is not a signal name (KILL, TERM, ...)")
        return self

    @property
    def signal_name(self) -> str:
        return self.signal.upper().removeprefix("SIG")

    def lasts_s(self) -> float:
        """Emulated seconds from `at_s` until the agent (or link) is back."""
        return self.restart_after_s or self.duration_s or 0.0

    def targets(self, devices: list[str], server: str) -> list[str]:
        """The hosts the fault hits among the condition's `devices`."""
        if self.agent == "server":
            return [server]
        if self.hosts is not None:
            return list(self.hosts)
        return devices[: max(1, round(len(devices) * (self.share or 0)))]


def check_faults(
    faults: list[FaultSpec], mode: str, devices: list[str], timeout_s: float, where: str
) -> None:
    """Refuse faults the condition cannot take: a mode without the agents, a host that is not
    one of its devices, a time past the condition's timeout; the error names file and key."""
    for i, f in enumerate(faults):
        key = f"{where}: faults[{i}] ({f.name})"
        if mode not in INJECTED_IN:
            raise BadInputError(f"{key}: mode {mode} cannot take injected faults "
                                f"(modes: {', '.join(INJECTED_IN)})")  # fmt: skip
        if f.agent == "server" and mode == "device-only":
            raise BadInputError(f"{key}.agent: mode device-only runs no server")
        unknown = [h for h in f.hosts or [] if h not in devices]
        if unknown:
            raise BadInputError(f"{key}.hosts: {', '.join(unknown)} not a device of the "
                                f"condition ({', '.join(devices)})")  # fmt: skip
        if f.at_s + f.lasts_s() >= timeout_s:
            raise BadInputError(
                f"{key}.at_s: {f.at_s:g} s (+ {f.lasts_s():g} s) is past the condition's "
                f"end (condition_timeout_s {timeout_s:g} s)"
            )
    names = [f.name for f in faults]
    if len(set(names)) != len(names):
        raise BadInputError(f"{where}: faults: names must differ ({', '.join(names)})")
