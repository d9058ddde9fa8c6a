"""A BALANCE cost-model file read on the controller: the agents' parser, its errors as the
controller's (`BadInputError`, exit code 2, naming the file and the key)."""

from __future__ import annotations

from pathlib import Path

from agents.balance.costmodel import CostModel, CostModelError, load_cost_model
from testbed.core.errors import BadInputError


def read_cost_model(path: Path) -> CostModel:
    """The cost model in `path`; BadInputError naming the file and the key otherwise."""
    try:
        return load_cost_model(path)
    except CostModelError as exc:
        raise BadInputError(f"{exc} (a profile of this version: `testbed profile`)") from None
