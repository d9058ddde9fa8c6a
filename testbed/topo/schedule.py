"""A profile over time: the static profiles a schedule or trace steps through, and when."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.topo.profile import LinkProfile
from testbed.topo.trace import load_trace

STEP_FIELDS = ("rtt_ms", "jitter_ms", "loss", "loss_up", "loss_down")


@dataclass(frozen=True)
class Phase:
    """From `at_s` seconds after apply on, the link behaves as `profile` (static)."""

    at_s: float
    profile: LinkProfile


def timeline(profile: LinkProfile) -> list[Phase]:
    """Static phases of `profile`, the first at 0 s; one phase when it does not vary."""
    base = profile.model_copy(update={"schedule": (), "trace": None})
    steps = load_trace(profile.trace) if profile.trace is not None else profile.schedule
    phases = [Phase(0.0, base)]
    current = base.model_dump()
    for step in steps:
        current.update(step.model_dump(include=set(STEP_FIELDS), exclude_none=True))
        if step.loss is not None:  # a new `loss` resets per-direction overrides not also given
            current["loss_up"], current["loss_down"] = step.loss_up, step.loss_down
        source = f"{profile.trace or 'schedule'} at {step.at_s:g} s"
        static = LinkProfile.build(source, **current)
        if step.at_s == 0:
            phases[0] = Phase(0.0, static)
        else:
            phases.append(Phase(step.at_s, static))
    return phases


def duration_s(profile: LinkProfile) -> float:
    """When the last change happens (0 for a static profile)."""
    return timeline(profile)[-1].at_s


def dilate(profile: LinkProfile, factor: float) -> LinkProfile:
    """`profile` slowed down `factor` times (time dilation): delays, jitter and the times of
    its schedule or trace steps times `factor`, its rate divided by it; loss is unchanged. A
    trace becomes the schedule of its rows, so the holder steps through the dilated times."""
    if factor == 1:
        return profile
    steps = load_trace(profile.trace) if profile.trace is not None else profile.schedule

    def scaled(value: float | None) -> float | None:
        return None if value is None else value * factor

    schedule = tuple(
        s.model_copy(
            update={
                "at_s": s.at_s * factor,
                "rtt_ms": scaled(s.rtt_ms),
                "jitter_ms": scaled(s.jitter_ms),
            }
        )  # fmt: skip
        for s in steps
    )
    return profile.model_copy(
        update={
            "rtt_ms": profile.rtt_ms * factor,
            "jitter_ms": profile.jitter_ms * factor,
            "rate_mbit": None if profile.rate_mbit is None else profile.rate_mbit / factor,
            "schedule": schedule,
            "trace": None,
        }
    )
