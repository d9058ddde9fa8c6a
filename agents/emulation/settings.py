"""What the controller tells an agent about the machine its host stands for (`--emulation`).

A JSON file:

    {"time_dilation": 2.0,              # every imposed time runs this many times slower
     "clock_epoch": 1764750000.0,       # where real and emulated wall time agree
     "pace": true,                      # sleep out modelled times (false: only predict them)
     "hardware": {...},                 # agents.emulation.stepcost.Hardware fields
     "models": {"draft": {...}, "target": {...}}}   # ModelShape fields per engine role

Every key is optional: no file, or an empty one, is the real clock and unpaced engines.
`Emulation.start()` sets the process's clock; `Emulation.engine(engine, role)` wraps an
engine of that role in a `PacedEngine` when the host stands for hardware and the role names a
model.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agents.emulation import clock
from agents.emulation.pacing import PacedEngine
from agents.emulation.stepcost import Hardware, ModelShape
from agents.engines.base import Engine


class EmulationError(ValueError):
    """The emulation file is not what the controller writes; names the file and the key."""


@dataclass(frozen=True)
class Emulation:
    time_dilation: float = 1.0
    clock_epoch: float | None = None
    pace: bool = False
    hardware: Hardware | None = None
    models: dict[str, ModelShape] = field(default_factory=dict)

    def start(self) -> clock.Clock:
        """Set this process's clock to the emulation's dilation and epoch."""
        return clock.configure(self.time_dilation, self.clock_epoch)

    def engine(self, engine: Engine, role: str) -> Engine:
        """`engine` paced (or predicted) as the role's model on the hardware, if both are
        given; else `engine` itself."""
        shape = self.models.get(role)
        if self.hardware is None or shape is None:
            return engine
        return PacedEngine(engine, self.hardware, shape, pace=self.pace)


def _number(value: Any, where: str, positive: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0):
        raise EmulationError(f"{where}: expected a {'positive ' if positive else ''}number")
    return float(value)


def _record(cls: type, data: Any, where: str) -> Any:
    """A Hardware or ModelShape from a mapping of its fields (numbers checked)."""
    if not isinstance(data, dict):
        raise EmulationError(f"{where}: expected a mapping of {cls.__name__} fields")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise EmulationError(f"{where}.{unknown[0]}: not a {cls.__name__} field")
    values: dict[str, Any] = {}
    for name, f in known.items():
        if name not in data:
            continue
        value = data[name]
        if value is None and "None" in str(f.type):
            pass  # an optional figure left unset
        elif name == "name":
            if not isinstance(value, str):
                raise EmulationError(f"{where}.name: expected a string")
        elif f.type == "bool":
            if not isinstance(value, bool):
                raise EmulationError(f"{where}.{name}: expected true or false")
        elif f.type == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EmulationError(f"{where}.{name}: expected a whole number >= 0")
        else:
            value = _number(value, f"{where}.{name}")
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise EmulationError(f"{where}: {exc}") from None


def parse_emulation(data: Any, source: str) -> Emulation:
    """The emulation a JSON document describes (EmulationError naming source and key)."""
    if data is None:
        return Emulation()
    if not isinstance(data, dict):
        raise EmulationError(f"{source}: expected a JSON object")
    known = {"time_dilation", "clock_epoch", "pace", "hardware", "models"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise EmulationError(f"{source}: {unknown[0]}: unknown key (known: {sorted(known)})")
    dilation = _number(data.get("time_dilation", 1.0), f"{source}: time_dilation", True)
    epoch = data.get("clock_epoch")
    pace = data.get("pace", False)
    if not isinstance(pace, bool):
        raise EmulationError(f"{source}: pace: expected true or false")
    hardware = data.get("hardware")
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise EmulationError(f"{source}: models: expected a mapping of role to model")
    return Emulation(
        time_dilation=dilation,
        clock_epoch=None if epoch is None else _number(epoch, f"{source}: clock_epoch"),
        pace=pace,
        hardware=None if hardware is None else _record(Hardware, hardware, f"{source}: hardware"),
        models={
            str(role): _record(ModelShape, shape, f"{source}: models.{role}")
            for role, shape in models.items()
        },
    )


def load_emulation(path: Path | None) -> Emulation:
    """The emulation in `path` (None: none); EmulationError names the file and the key."""
    if path is None:
        return Emulation()
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EmulationError(f"{path}: no such emulation file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmulationError(f"{path}: not a JSON document ({exc})") from None
    return parse_emulation(data, str(path))


def add_emulation_option(ap: argparse.ArgumentParser) -> None:
    """The `--emulation` option every agent takes."""
    ap.add_argument(
        "--emulation",
        type=Path,
        help="JSON from the controller: time dilation, and the hardware and models this host "
        "stands for (agents.emulation.settings)",
    )


def start_emulation(ap: argparse.ArgumentParser, path: Path | None) -> Emulation:
    """The emulation in `path`, its clock started; a bad file ends the agent with its usage
    error (naming the file and the key)."""
    try:
        emulation = load_emulation(path)
    except EmulationError as exc:
        ap.error(str(exc))
    emulation.start()
    return emulation
