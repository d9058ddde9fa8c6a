"""`lab.time_dilation: auto`: the smallest dilation at which a short pilot of a condition has
no forward behind the hardware its host stands for.

A pilot is the condition itself, cut short (one problem per device, at most
`PILOT_MAX_NEW_TOKENS` new tokens; BALANCE: `PILOT_USERS` users; no injected fault), run
through the same pipeline at dilation 1, 2, 4, ... until one has no behind forward. A pilot
is shorter than the condition (fewer and shorter answers, smaller batches), so the whole
condition can still run behind at the chosen dilation; it then runs again at the next one,
until it is faithful or the dilations run out (then it stays marked unfaithful). The pilots'
tables stay in the condition's folder (`pilots/x<N>/`), each whole try that ran behind in
`tries/x<N>/`, and every try in the journal entry, so the choice can be checked afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.config.playbook import Condition, Playbook
from testbed.core.errors import TestbedError
from testbed.results.store import ConditionFolder

DILATIONS = (1, 2, 4, 8, 16, 32, 64)
PILOT_MAX_NEW_TOKENS = 16
PILOT_USERS = 8

RunFn = Callable[[Any, Condition, ConditionFolder], dict[str, Any]]


def pilot_of(cond: Condition, dilation: float) -> Condition:
    """The condition cut short, at `dilation`."""
    pb = cond.playbook
    data = pb.model_dump()
    data["lab"]["time_dilation"] = dilation
    data["workload"]["problems_per_device"] = 1
    data["workload"]["max_new_tokens"] = min(pb.workload.max_new_tokens, PILOT_MAX_NEW_TOKENS)
    data["balance"]["users"] = min(pb.balance.users, PILOT_USERS)
    data["faults"] = []  # a pilot is too short for them; the condition itself takes them
    return cond.model_copy(
        update={"id": f"{cond.id}-pilot-x{dilation:g}", "playbook": Playbook.model_validate(data)}
    )


def at_dilation(cond: Condition, dilation: float) -> Condition:
    """The condition with its dilation fixed."""
    lab = cond.playbook.lab.model_copy(update={"time_dilation": dilation})
    return cond.model_copy(update={"playbook": cond.playbook.model_copy(update={"lab": lab})})


def run_dilated(
    run: RunFn, ctx: Any, cond: Condition, staged: ConditionFolder, say: Callable[[str], None]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`lab.time_dilation: auto`: the condition's result at the smallest dilation whose pilot,
    and then whose whole run, had no more behind forwards than the faithful limit; and every
    try (pilots, then whole runs marked `whole: true`)."""
    dilation, tries = choose_dilation(run, ctx, cond, staged, say)
    while True:
        result = run(ctx, at_dilation(cond, dilation), staged)
        metrics = result.get("metrics") or {}
        if metrics.get("compute_faithful", True) is not False:
            return result, tries
        paced, behind = metrics.get("paced_forwards", 0), metrics.get("behind_forwards", 0)
        tries.append({"time_dilation": dilation, "paced_forwards": paced,
                      "behind_forwards": behind, "whole": True})  # fmt: skip
        later = [n for n in DILATIONS if n > dilation]
        if not later:
            return result, tries
        say(f"{cond.id}: the whole condition at dilation {dilation:g} had {behind} of {paced} "
            f"forwards behind; again at {later[0]}")  # fmt: skip
        staged.set_aside(dilation)
        dilation = float(later[0])


def choose_dilation(
    run: RunFn, ctx: Any, cond: Condition, staged: ConditionFolder, say: Callable[[str], None]
) -> tuple[float, list[dict[str, Any]]]:
    """The smallest of `DILATIONS` whose pilot had no behind forward, and every try's figures
    (dilation, paced and behind forwards); TestbedError when none of them does."""
    tries: list[dict[str, Any]] = []
    for n in DILATIONS:
        metrics = run(ctx, pilot_of(cond, n), staged.pilot(n)).get("metrics") or {}
        paced, behind = metrics.get("paced_forwards", 0), metrics.get("behind_forwards", 0)
        tries.append({"time_dilation": n, "paced_forwards": paced, "behind_forwards": behind})
        say(f"{cond.id}: pilot at dilation {n}: {behind} of {paced} forwards behind")
        if not behind:
            return float(n), tries
    raise TestbedError(
        f"{cond.id}: lab.time_dilation auto: every pilot up to dilation {DILATIONS[-1]} had "
        "forwards behind their modelled time; set a larger lab.time_dilation"
    )
