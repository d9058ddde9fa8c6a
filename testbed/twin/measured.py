"""The acceptance a lab run measured, as the twin draws it: per token, and by position.

A round's drafts are not equally likely to be accepted: the tiny pair accepts a round's first
draft at about 0.89 and its fourth at about 0.79 (per token 0.83, `acceptance_alpha`), so a
twin drawing every draft at the per-token rate gives 3-4 % fewer tokens a round than the lab
and wins the look-ahead's bet (the draft's next token the target's own) too often.
`acceptance_profile` measures the chance at each position from a condition's rounds;
`measured_acceptance` pools the SLED conditions of a lab run folder, for `testbed simulate`
and `testbed capacity --twin` (`--acceptance-from RUN`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from agents.spec.rates import per_token_acceptance
from testbed.core.errors import BadInputError

POSITIONS_MIN_ROUNDS = 30
"""Rounds that must reach a position for its measured acceptance to stand; later positions
take the last that did."""


def acceptance_profile(rounds: pd.DataFrame) -> tuple[float, ...]:
    """The acceptance at each position of the verified rounds, given the drafts before it
    were accepted (positions reached by `POSITIONS_MIN_ROUNDS` rounds or more), and after
    them the look-ahead's bet: the target's next token the draft's own, in rounds that
    accepted every draft with two or more drafted ahead. Empty where nothing was verified."""
    if not {"mode", "drafted", "accepted"} <= set(rounds.columns):
        return ()
    v = rounds[rounds["mode"] == "verified"]
    drafted, accepted = v["drafted"].to_numpy(), v["accepted"].to_numpy()
    profile: list[float] = []
    for i in range(int(drafted.max()) if len(v) else 0):
        reached = (drafted > i) & (accepted >= i)
        if reached.sum() < POSITIONS_MIN_ROUNDS:
            break
        profile.append(float((accepted[reached] > i).mean()))
    if profile and {"lookahead_drafted", "lookahead_kept"} <= set(v.columns):
        bets = v[(v["accepted"] == v["drafted"]) & (v["lookahead_drafted"] >= 2)]
        if len(bets) >= POSITIONS_MIN_ROUNDS:
            profile.append(float((bets["lookahead_kept"] > 0).mean()))
    return tuple(profile)


@dataclass(frozen=True)
class MeasuredAcceptance:
    """What a lab run measured: the per-token rate, the rate by position and the spread of
    the devices' acceptance against independent tokens'."""

    per_token: float
    profile: tuple[float, ...]
    source: str
    dispersion: float = 1.0


def rounds_acceptance(rounds: pd.DataFrame, source: str) -> MeasuredAcceptance | None:
    """The acceptance of a lab's rounds (one device a `dev`); None where none was verified."""
    if not {"mode", "drafted", "accepted"} <= set(rounds.columns):
        return None
    v = rounds[rounds["mode"] == "verified"]
    alpha = per_token_acceptance(
        int(v["accepted"].sum()), int((v["accepted"] < v["drafted"]).sum())
    )
    if alpha is None:
        return None
    return MeasuredAcceptance(float(alpha), acceptance_profile(v), source,
                              acceptance_dispersion(v))  # fmt: skip


def condition_acceptance(folder: Path) -> MeasuredAcceptance | None:
    """`rounds_acceptance` of one lab condition folder; None where its rounds are unreadable."""
    try:
        rounds = pd.read_parquet(folder / "rounds.parquet")
    except (OSError, ValueError):
        return None
    return rounds_acceptance(rounds, f"measured in {folder.name}")


def measured_acceptance(run: Path) -> MeasuredAcceptance:
    """The acceptance of every done SLED condition of the lab run folder `run`, pooled (each
    condition's devices apart); BadInputError naming the folder where it holds no verified
    SLED round."""
    from testbed.results.store import RunStore

    store = RunStore(run)
    try:
        done = [e["condition"] for e in store.journal() if e.get("status") == "done"]
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{run}: not a readable run folder ({exc})") from None
    frames = []
    for cid in done:
        try:
            frame = pd.read_parquet(store.condition_dir(cid) / "rounds.parquet")
        except (OSError, ValueError):
            continue
        if {"mode", "dev", "drafted", "accepted"} <= set(frame.columns):
            frames.append(frame.assign(dev=cid + "/" + frame["dev"].astype(str)))
    rounds = pd.concat(frames) if frames else pd.DataFrame()
    verified = int((rounds["mode"] == "verified").sum()) if len(rounds) else 0
    measured = rounds_acceptance(rounds, f"measured in {run.name} ({verified} rounds, by position)")
    if measured is None:
        raise BadInputError(f"{run}: --acceptance-from: no verified SLED round in its conditions")
    return measured


def acceptance_record(acceptance: float | MeasuredAcceptance | None) -> object:
    """`acceptance` as JSON holds it (a search's `capacity.json`)."""
    return asdict(acceptance) if isinstance(acceptance, MeasuredAcceptance) else acceptance


def measured_or_given(
    acceptance: float | None, acceptance_from: Path | None
) -> float | MeasuredAcceptance | None:
    """The command line's acceptance: `--acceptance A`, or what `--acceptance-from RUN`
    measured; BadInputError where both are given."""
    if acceptance is not None and acceptance_from is not None:
        raise BadInputError("--acceptance and --acceptance-from: give one of them, not both")
    return measured_acceptance(acceptance_from) if acceptance_from is not None else acceptance


DISPERSION_MIN_DEVICES = 4
DISPERSION_MIN_JUDGED = 20  # drafts judged a device for its acceptance to count


def acceptance_dispersion(rounds: pd.DataFrame) -> float:
    """The standard deviation of the devices' per-token acceptance over what independent
    tokens at the pooled rate would give them (the root of the mean alpha (1 - alpha) / n),
    capped at 1; 1 where fewer than `DISPERSION_MIN_DEVICES` devices judged enough drafts."""
    if not {"mode", "dev", "drafted", "accepted"} <= set(rounds.columns):
        return 1.0
    v = rounds[rounds["mode"] == "verified"]
    accepted = v.groupby("dev")["accepted"].sum()
    judged = accepted + (v["accepted"] < v["drafted"]).groupby(v["dev"]).sum()
    keep = judged >= DISPERSION_MIN_JUDGED
    if keep.sum() < DISPERSION_MIN_DEVICES:
        return 1.0
    accepted, judged = accepted[keep], judged[keep]
    alpha = accepted.sum() / judged.sum()
    independent = float(np.sqrt((alpha * (1 - alpha) / judged).mean()))
    if independent <= 0:
        return 1.0
    return float(min(1.0, (accepted / judged).std(ddof=1) / independent))
