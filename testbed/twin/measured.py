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
    """What a lab run measured: the per-token rate and the rate by position."""

    per_token: float
    profile: tuple[float, ...]
    source: str


def measured_acceptance(run: Path) -> MeasuredAcceptance:
    """The acceptance of every done SLED condition of the lab run folder `run`, pooled;
    BadInputError naming the folder where it holds no verified SLED round."""
    from testbed.results.store import RunStore

    store = RunStore(run)
    try:
        done = [e["condition"] for e in store.journal() if e.get("status") == "done"]
    except (OSError, ValueError) as exc:
        raise BadInputError(f"{run}: not a readable run folder ({exc})") from None
    frames = []
    for cid in done:
        path = store.condition_dir(cid) / "rounds.parquet"
        try:
            frame = pd.read_parquet(path)
        except (OSError, ValueError):
            continue
        if {"mode", "drafted", "accepted"} <= set(frame.columns):
            frames.append(frame[frame["mode"] == "verified"])
    rounds = pd.concat(frames) if frames else pd.DataFrame()
    if rounds.empty:
        raise BadInputError(f"{run}: --acceptance-from: no verified SLED round in its conditions")
    accepted = int(rounds["accepted"].sum())
    rejections = int((rounds["accepted"] < rounds["drafted"]).sum())
    alpha = per_token_acceptance(accepted, rejections)
    how = f"measured in {run.name} ({len(rounds)} rounds, by position)"
    return MeasuredAcceptance(float(alpha or 0.0), acceptance_profile(rounds), how)


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
