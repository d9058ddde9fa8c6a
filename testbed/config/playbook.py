"""Experiment playbooks: what to run, on which lab, with which workload, sweeping what.

A playbook is a YAML file validated by `Playbook`. Its `sweep` maps dotted keys of the
playbook (e.g. `link.loss`) to lists of values; the run is the cartesian product of them, one
*condition* per combination, each validated again as a whole playbook so a bad swept value is
named with its key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from testbed.config.loading import read_yaml, validate
from testbed.errors import BadInputError

# Settings fixed for a whole run (the lab, the models, the topology): sweeping them would need
# a new lab or new models per condition, so a sweep naming them is refused.
RUN_WIDE_KEYS = ("name", "sweep", "mode", "topology", "lab", "models.draft", "models.target")


class Strict(BaseModel):
    """Base: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")


class LabSection(Strict):
    kind: Literal["emulated", "inventory"] = "emulated"
    devices: int = Field(2, ge=1, le=64, description="device hosts on the emulated lab")
    inventory: str | None = Field(None, description="Ansible YAML inventory of a physical lab")


class ModelsSection(Strict):
    draft: str = Field("tiny", description="'tiny' or a path to the draft .gguf")
    target: str = Field("tiny", description="'tiny' or a path to the target HF folder")
    server_device: str = Field("cpu", description="torch device of the verifier (cpu, cuda)")


class WorkloadSection(Strict):
    kind: Literal["arithmetic", "gsm8k"] = "arithmetic"
    problems_per_device: int = Field(3, ge=1)
    seed: int = 7
    max_new_tokens: int = Field(48, ge=1, le=4096)
    gsm8k_path: str | None = None


class SledSection(Strict):
    draft_len: int = Field(4, ge=1, le=64)
    timeout_ms: float = Field(200.0, gt=0)
    retries: int = Field(3, ge=0)
    probe_ms: float = Field(200.0, gt=0)
    max_batch: int = Field(16, ge=1)
    window_ms: float = Field(2.0, ge=0)
    server_threads: int = Field(1, ge=1)
    device_threads: int = Field(1, ge=1)


class LinkSection(Strict):
    rtt_ms: float = Field(85.0, ge=0, le=10000)
    jitter_ms: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, le=1, description="per-direction packet loss, 0..1")
    rate_mbit: float | None = Field(None, gt=0)
    backend: Literal["auto", "netem", "nfqueue"] = "auto"
    rtt_tolerance_ms: float = Field(1.0, gt=0, description="max |measured - requested| RTT")
    probe_packets: int = Field(200, ge=10)


class Playbook(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    mode: Literal["sled"] = "sled"
    seed: int = 1
    topology: str | None = Field(None, description="topologies/*.yaml giving devices and link")
    lab: LabSection = LabSection()
    models: ModelsSection = ModelsSection()
    workload: WorkloadSection = WorkloadSection()
    sled: SledSection = SledSection()
    link: LinkSection = LinkSection()
    condition_timeout_s: float = Field(300.0, gt=0)
    sweep: dict[str, list[Any]] = Field(default_factory=dict)

    @field_validator("sweep")
    @classmethod
    def _sweep_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"sweep.{key}: expected a non-empty list of values")
            if any(key == k or key.startswith(k + ".") for k in RUN_WIDE_KEYS):
                raise ValueError(
                    f"sweep.{key}: fixed for the whole run, cannot be swept "
                    f"(run-wide: {', '.join(RUN_WIDE_KEYS)})"
                )
        return v

    @model_validator(mode="after")
    def _sweep_keys_exist(self) -> Playbook:
        data = self.model_dump()
        for key in self.sweep:
            node: Any = data
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    raise ValueError(f"sweep key {key!r} does not name a playbook setting")
                node = node[part]
        return self


class Condition(BaseModel):
    """One point of the sweep: its id, the swept values and the full resolved playbook."""

    id: str
    index: int
    values: dict[str, Any]
    playbook: Playbook


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def condition_id(index: int, values: dict[str, Any]) -> str:
    """Stable, readable id: index plus swept values, e.g. `c01-link.loss=0.1`."""
    label = ",".join(f"{k}={v}" for k, v in values.items()) or "base"
    digest = hashlib.sha1(json.dumps(values, sort_keys=True).encode()).hexdigest()[:6]
    safe = "".join(ch if ch.isalnum() or ch in "._=-," else "_" for ch in label)[:60]
    return f"c{index:02d}-{safe}-{digest}"


def expand(playbook: Playbook, source: str = "playbook") -> list[Condition]:
    """The cartesian product of the sweep, each condition validated as a whole playbook."""
    keys = list(playbook.sweep)
    base = playbook.model_dump()
    out = []
    for index, combo in enumerate(itertools.product(*(playbook.sweep[k] for k in keys))):
        values = dict(zip(keys, combo, strict=False))
        data = copy.deepcopy(base)
        data["sweep"] = {}
        for key, value in values.items():
            _set(data, key, value)
        resolved = validate(Playbook, data, f"{source} (sweep {values})")
        out.append(
            Condition(id=condition_id(index, values), index=index, values=values, playbook=resolved)
        )
    return out


def apply_topology(data: dict[str, Any], source: Path) -> None:
    """Fill `lab.devices` and `link` from the playbook's topology where it does not set them."""
    from testbed.config.topology import load_topology
    from testbed.paths import REPO_ROOT

    name = data["topology"]
    if not isinstance(name, str):
        raise BadInputError(f"{source}: topology: expected a path to a topology file")
    candidates = [source.parent / name, REPO_ROOT / name]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise BadInputError(
            f"{source}: topology: {name} not found (looked in {source.parent} and {REPO_ROOT})"
        )
    topo = load_topology(found)
    for key, defaults in (
        ("lab", {"devices": topo.devices}),
        ("link", topo.links[topo.primary].model_dump(exclude_none=True)),
    ):
        section = data.setdefault(key, {})
        if isinstance(section, dict):
            for k, v in defaults.items():
                section.setdefault(k, v)


def load_playbook(path: str | Path) -> Playbook:
    """Read and validate a playbook file (with its topology's defaults, if it names one)."""
    path = Path(path)
    data = read_yaml(path)
    if isinstance(data, dict) and data.get("topology") is not None:
        apply_topology(data, path)
    pb = validate(Playbook, data, str(path))
    if pb.workload.kind == "gsm8k" and not pb.workload.gsm8k_path:
        raise BadInputError(f"{path}: workload.gsm8k_path: required when workload.kind is gsm8k")
    return pb
