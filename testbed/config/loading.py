"""Load YAML into pydantic models with errors that name the file, the key and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed.errors import BadInputError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file, turning missing files and syntax errors into BadInputError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInputError(f"{path}: not valid YAML: {exc}") from None


def describe_errors(source: str, exc: ValidationError) -> str:
    """One line per problem: `source: key.path: message (got value)`."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r:.80})"
        lines.append(f"{source}: {where}: {err['msg']}{shown}")
    return "\n".join(lines)


def validate(model: type[M], data: Any, source: str) -> M:
    """model.model_validate(data) with errors rewritten to name source and key."""
    if not isinstance(data, dict):
        raise BadInputError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadInputError(describe_errors(source, exc)) from None


def load_model(model: type[M], path: Path) -> M:
    """Read and validate one YAML file."""
    return validate(model, read_yaml(path), str(path))
