"""Moving an SD user that falls behind to AD, while AD can still make its deadline.

Admission budgets an SD user at the workload's average tokens per round. A user whose problem
the draft predicts poorly gets fewer, and at SD's round rate it may no longer finish in time.
Its own rounds so far say so; AD's steps do not depend on the draft. Such a user is moved to
AD (between steps, keeping its tokens) when AD already serves someone (opening it for one
user would take its whole setup from everyone else), AD's step rate still makes the user's
remaining tokens before its deadline, and the rest of its work fits beside every hold.
"""

from __future__ import annotations

import numpy as np

from agents.balance.admission import AdmissionController
from agents.balance.costmodel import CostModel
from agents.balance.loop import HybridLoop
from agents.balance.modes import AD, SD
from agents.balance.problem import Service, Users, top_pace

MIN_ROUNDS = 3  # rounds a user must have been in before its own yield is trusted
MOVED_TO_AD = "moved to AD"  # how a moved user's admission record says so (counted by runs)


def move_lagging_sd_users(
    loop: HybridLoop,
    admission: AdmissionController,
    cost: CostModel,
    users: Users,
    arrival: np.ndarray,
    service: Service,
    now: float,
) -> dict[int, str]:
    """Move to AD the SD users whose own rounds show they cannot finish in SD by their
    deadline but AD can, where AD's work fits; return {uid: why it moved}."""
    moved: dict[int, str] = {}
    if not admission.members[AD]:
        return moved  # opening AD for one user takes its whole setup from everyone else
    for uid, m in list(loop.members.items()):
        if m.mode != SD or m.steps_in_mode < MIN_ROUNDS:
            continue
        need = int(users.output[uid]) - m.delivered
        since = now - float(arrival[uid])
        left = float(users.deadline[uid]) - since - service.period_s  # last step: a period late
        if need <= 0 or left <= 0:
            continue
        per_round = m.delivered_in_mode / m.steps_in_mode
        if need <= per_round * service.sd_rounds_per_s * left:
            continue  # SD still makes it at this user's own yield
        if need > top_pace(cost, service, AD) * left:
            continue  # AD cannot make it either
        share = cost.step_cost(AD).per_seq_s * need / left
        if admission.move(uid, AD, share, now):
            loop.move(uid, AD)
            moved[uid] = (
                f"{MOVED_TO_AD} {since:.2f} s after it arrived: its SD rounds yielded "
                f"{per_round:.2f} tokens each, too few for its {need} tokens left"
            )
    return moved
