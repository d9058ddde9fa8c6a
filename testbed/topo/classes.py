"""Host roles and host classes (Pi 5, Jetson Orin Nano, A100, ...), read from
`topologies/host-classes.yaml`.

A class says what a lab host is: its cores, which engine build it needs and which entry of the
hardware catalogue (`topologies/hardware.yaml`) it stands for. Physical labs use it to
provision hosts (Ansible); emulated labs pace each host's engine calls to its hardware's
modelled time (`testbed.runner.emulation`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from testbed.core.errors import BadInputError
from testbed.core.loading import load_model
from testbed.core.paths import REPO_ROOT

Role = Literal["device", "server", "controller", "middlebox"]
"""What a host does in a run: drafts (device), verifies (server), drives the run (controller) or
carries the impaired links between them (middlebox, on physical labs)."""

Engine = Literal["llama-cpp-cpu", "llama-cpp-cuda", "torch-cpu", "torch-cuda"]
"""The engine build a class needs: llama-cpp-python for GGUF drafts, PyTorch for the verifier."""

HOST_CLASSES_FILE = REPO_ROOT / "topologies" / "host-classes.yaml"


class HostClass(BaseModel):
    """One kind of lab machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    description: str
    cores: int = Field(ge=1, description="CPU cores")
    hardware: str = Field(description="the hardware catalogue entry it stands for")
    engine: Engine
    accelerator: str | None = Field(None, description="GPU, if any")
    roles: tuple[Role, ...] = Field(min_length=1, description="roles this class can take")


class HostClassFile(RootModel[dict[str, HostClass]]):
    """The file: class name -> class."""


@functools.lru_cache(maxsize=4)
def load_host_classes(path: Path = HOST_CLASSES_FILE) -> dict[str, HostClass]:
    """Every host class of the file (errors name the file and the key)."""
    table = load_model(HostClassFile, path).root
    return {name: cls.model_copy(update={"name": name}) for name, cls in table.items()}


def host_classes() -> dict[str, HostClass]:
    """The shipped host classes."""
    return load_host_classes()


DEFAULT_CLASS: dict[Role, str] = {"device": "pi5", "server": "a100", "controller": "controller"}


def host_class(name: str, source: str = "host class") -> HostClass:
    """The class called `name`; BadInputError listing the known ones otherwise."""
    classes = host_classes()
    try:
        return classes[name]
    except KeyError:
        raise BadInputError(
            f"{source}: unknown host class {name!r} (known: {', '.join(classes)})"
        ) from None
