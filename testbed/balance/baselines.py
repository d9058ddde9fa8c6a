"""Baselines the scheduler is measured against.

AD-only and SD-only are the scheduler itself with one mode allowed, so a gap to the hybrid
schedule is due to mixing modes alone. The naive greedy takes users in arrival order and puts
each in the mode with the smaller compute demand that still fits, else the other mode.
"""

from __future__ import annotations

import numpy as np

from agents.balance.algorithm import schedule
from agents.balance.problem import AD, SD, UNSERVED, Instance, Schedule, is_feasible, schedule_of


def ad_only(inst: Instance) -> Schedule:
    return schedule(inst, allowed=(AD,))


def sd_only(inst: Instance) -> Schedule:
    return schedule(inst, allowed=(SD,))


def naive_greedy(inst: Instance) -> Schedule:
    """Arrival order; the cheaper-compute mode first; no look-ahead."""
    modes = np.full(len(inst), UNSERVED, dtype=np.int8)
    for i in range(len(inst)):
        order = (AD, SD) if inst.compute[i, 0] <= inst.compute[i, 1] else (SD, AD)
        for mode in order:
            modes[i] = mode
            if is_feasible(inst, modes):
                break
            modes[i] = UNSERVED
    return schedule_of(inst, modes)
