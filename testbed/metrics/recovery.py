"""Recovery from injected faults, from a condition's rounds and requests.

For each injected fault with a time its agent (or link) was back: the emulated seconds from
then until every device it hit (the server: every device still answering) has its next
verified round, and the tokens those devices kept unverified from the fault until then. Over
the condition: requests lost (asked, never answered) or duplicated (answered twice), and
whether every answer made of verified tokens alone equals the target's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd

from testbed.metrics.clocks import CONTROLLER, ClockOffset
from testbed.metrics.schemas import FaultRecord


def _on_controller(rounds: pd.DataFrame, clocks: dict[str, ClockOffset]) -> pd.DataFrame:
    """Rounds with `t_end_c`: their end on the controller's clock."""
    if rounds.empty:
        return rounds.assign(t_end_c=pd.Series(dtype=float))
    t_end = [
        clocks.get(d, CONTROLLER).to_controller(t) for d, t in zip(rounds["dev"], rounds["t_end"])
    ]
    return rounds.assign(t_end_c=t_end)


def fault_recovery(
    fault: FaultRecord,
    rounds: pd.DataFrame,
    clocks: dict[str, ClockOffset],
    emulated: Callable[[float], float],
) -> FaultRecord:
    """The fault with `recovery_s` and `unverified_tokens` (None where its agent never came
    back, or a device it hit never verified again). `emulated` takes a controller time to
    the emulated clock the records keep."""
    if fault.back_t is None or rounds.empty:
        return fault
    r = _on_controller(rounds, clocks)
    start, back = emulated(fault.t), emulated(fault.back_t)
    hit = r if fault.host not in set(r["dev"]) else r[r["dev"] == fault.host]
    returns: list[float] = []
    for _dev, own in hit.groupby("dev"):
        if own["t_end_c"].max() <= back:
            continue  # it had finished before the agent was back
        verified = own[(own["mode"] == "verified") & (own["t_end_c"] > back)]
        if verified.empty:
            return dataclasses.replace(fault, recovery_s=None, unverified_tokens=None)
        returns.append(float(verified["t_end_c"].min()))
    if not returns:
        return fault
    until = max(returns)
    kept = hit[(hit["mode"] == "fallback") & (hit["t_end_c"] > start) & (hit["t_end_c"] <= until)]
    return dataclasses.replace(
        fault, recovery_s=until - back, unverified_tokens=int(kept["tokens"].sum())
    )


def request_figures(asked: dict[str, list[str]], requests: pd.DataFrame) -> dict[str, object]:
    """Requests lost (asked of a device, never answered) and duplicated (answered more than
    once), and whether every answer of verified tokens only equals the target's."""
    answered = requests.groupby(["dev", "problem"]).size() if not requests.empty else pd.Series()
    lost = sum(
        (dev, str(p)) not in answered.index for dev, problems in asked.items() for p in problems
    )
    duplicated = int((answered > 1).sum()) if len(answered) else 0
    pure = requests[requests["fallback_tokens"] == 0] if not requests.empty else requests
    match = bool(pure["matches_target"].fillna(False).all()) if not pure.empty else None
    return {
        "requests_lost": int(lost),
        "requests_duplicated": duplicated,
        "verified_answers_match_target": match,
    }


def recovery_figures(faults: list[FaultRecord]) -> dict[str, object]:
    """The condition's recovery columns over its injected faults."""
    injected = [f for f in faults if f.injected and f.back_t is not None]
    if not injected:
        return {}
    times = [f.recovery_s for f in injected]
    return {
        "recovery_s_max": None if any(t is None for t in times) else max(times),  # type: ignore[type-var]
        "recovery_unverified_tokens": sum(f.unverified_tokens or 0 for f in injected),
        "recovered_all": all(t is not None for t in times),
    }
