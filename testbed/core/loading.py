"""Load YAML into pydantic models with errors that name the file, the key and what was expected.

Whatever a file holds (not UTF-8, binary, huge, deeply nested, an alias bomb, values of the
wrong type), reading it ends in a model or a `BadInputError` naming the file: never a
traceback. Input files are small by nature, so a file over `MAX_BYTES`, or whose YAML would
expand (aliases followed) past `MAX_NODES` values, is refused before it is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from testbed.core.errors import BadInputError

M = TypeVar("M", bound=BaseModel)

MAX_BYTES = 1 << 20  # 1 MiB
MAX_NODES = 100_000


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """A small UTF-8 text file's contents, or BadInputError saying why it cannot be one."""
    try:
        size = path.stat().st_size
        if path.is_dir():
            raise BadInputError(f"{path}: is a folder, expected a YAML file")
        if size > max_bytes:
            raise BadInputError(f"{path}: {size:,} bytes, more than the {max_bytes:,} allowed")
        data = path.read_bytes()
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except OSError as exc:
        raise BadInputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(
            f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    if "\x00" in text:
        raise BadInputError(f"{path}: not a text file (contains NUL bytes)")
    return text


def expanded_size(node: yaml.Node, memo: dict[int, int] | None = None) -> int:
    """How many values the node builds, aliases followed (shared nodes counted per use)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a recursive alias counts once instead of looping
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(expanded_size(n, memo) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(expanded_size(k, memo) + expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = size
    return size


def parse_yaml(text: str, source: str, max_nodes: int = MAX_NODES) -> Any:
    """YAML text -> Python data (safe loader), refusing alias bombs and runaway nesting."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return None
        size = expanded_size(node)
        if size > max_nodes:
            raise BadInputError(
                f"{source}: YAML expands to {size:,} values (aliases followed), more than the "
                f"{max_nodes:,} allowed"
            )
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BadInputError(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise BadInputError(f"{source}: YAML nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an impossible !!timestamp
        raise BadInputError(f"{source}: not valid YAML: {exc}") from None


def read_yaml(path: Path) -> Any:
    """Read and parse a YAML file; every problem is a BadInputError naming the file."""
    return parse_yaml(read_text(path), str(path))


def describe_errors(source: str, exc: ValidationError) -> str:
    """One line per problem: `source: key.path: message (got value)`."""
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, (dict, list)) else f" (got {repr(got)[:80]})"
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
    except RecursionError:
        raise BadInputError(f"{source}: values nested too deeply") from None


def load_model(model: type[M], path: Path) -> M:
    """Read and validate one YAML file."""
    return validate(model, read_yaml(path), str(path))
