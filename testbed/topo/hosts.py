"""Host roles and the one table of host classes (Pi 5, Jetson Orin Nano, A100, ...).

A class says what a lab host is: its cores, memory, relative speed and which engine build it
needs. Physical labs use it to provision hosts (Ansible); emulated labs derive resource limits
from it (a CPU quota and a memory limit per host, see `testbed.lab.limits`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from testbed.errors import BadInputError

Role = Literal["device", "server", "controller", "middlebox"]
"""What a host does in a run: drafts (device), verifies (server), drives the run (controller) or
carries the impaired links between them (middlebox, on physical labs)."""

Engine = Literal["llama-cpp-cpu", "llama-cpp-cuda", "torch-cpu", "torch-cuda"]
"""The engine build a class needs: llama-cpp-python for GGUF drafts, PyTorch for the verifier."""


class HostClass(BaseModel):
    """One kind of lab machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    cores: int = Field(ge=1, description="CPU cores")
    memory_gb: float = Field(gt=0, description="RAM (on Jetsons shared with the GPU)")
    relative_speed: float = Field(
        gt=0,
        description="drafting speed relative to a Raspberry Pi 5 on the same small model "
        "(planning figure; emulated labs scale each host's CPU quota by it)",
    )
    engine: Engine
    accelerator: str | None = Field(None, description="GPU, if any")
    roles: tuple[Role, ...] = Field(description="roles this class can take")


HOST_CLASSES: dict[str, HostClass] = {
    c.name: c
    for c in (
        HostClass(
            name="pi5",
            description="Raspberry Pi 5, 8 GB: 4x Cortex-A76 at 2.4 GHz, llama.cpp on the CPU",
            cores=4,
            memory_gb=8,
            relative_speed=1.0,
            engine="llama-cpp-cpu",
            roles=("device",),
        ),
        HostClass(
            name="jetson-orin-nano",
            description="Jetson Orin Nano 8 GB: 6x Cortex-A78AE, 1024-core Ampere GPU, "
            "llama.cpp built with CUDA",
            cores=6,
            memory_gb=8,
            relative_speed=2.5,
            engine="llama-cpp-cuda",
            accelerator="Ampere 1024 CUDA cores (shared memory)",
            roles=("device",),
        ),
        HostClass(
            name="a100",
            description="edge server with one A100 80 GB: the target model in PyTorch",
            cores=32,
            memory_gb=256,
            relative_speed=20.0,
            engine="torch-cuda",
            accelerator="NVIDIA A100 80 GB",
            roles=("server",),
        ),
        HostClass(
            name="cpu-server",
            description="a CPU-only server (CI, the emulated lab's default server)",
            cores=8,
            memory_gb=32,
            relative_speed=4.0,
            engine="torch-cpu",
            roles=("server", "controller"),
        ),
        HostClass(
            name="controller",
            description="the machine that runs `testbed` (Fabric, Ansible, the results store)",
            cores=2,
            memory_gb=4,
            relative_speed=1.0,
            engine="torch-cpu",
            roles=("controller",),
        ),
    )
}
DEFAULT_CLASS: dict[Role, str] = {"device": "pi5", "server": "a100", "controller": "controller"}


def host_class(name: str, source: str = "host class") -> HostClass:
    """The class called `name`; BadInputError listing the known ones otherwise."""
    try:
        return HOST_CLASSES[name]
    except KeyError:
        raise BadInputError(
            f"{source}: unknown host class {name!r} (known: {', '.join(HOST_CLASSES)})"
        ) from None
