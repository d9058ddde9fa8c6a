"""The one table from a playbook's `mode` to the function that runs a condition of it, used by
real runs, dry runs and pilots alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.config.playbook import Condition, Mode
from testbed.results.store import ConditionFolder
from testbed.runner.balance import run_balance
from testbed.runner.condition import run_condition
from testbed.runner.context import RunContext

ConditionRunner = Callable[[RunContext, Condition, ConditionFolder], dict[str, Any]]

MODE_RUNNERS: dict[Mode, ConditionRunner] = {
    "sled": run_condition,
    "centralized": run_condition,
    "device-only": run_condition,
    "server-ad": run_condition,
    "server-sd": run_condition,
    "balance": run_balance,
}


def condition_runner(cond: Condition) -> ConditionRunner:
    """The function that runs a condition of this mode."""
    return MODE_RUNNERS[cond.playbook.mode]
