"""Every link of a condition, resolved in one place: the profile each device's primary and
backup path gets, as the playbook asks for it, and as it is applied (dilated in time).

The primary path's profile is the playbook's `link` (already filled from the topology's
profile when the playbook was loaded); the backup path's comes from the lab's topology. Each
is seeded with the playbook's seed unless it sets its own. With `lab.time_dilation` N the
links carry `dilate(profile, N)`: delays, jitter and step times N times longer, rates N times
lower.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.config.playbook import Playbook
from testbed.labs.backup import load_plan
from testbed.labs.interface import Lab
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import dilate


def seeded(profile: LinkProfile, seed: int) -> LinkProfile:
    """`profile` with `seed` unless it sets its own."""
    return profile if profile.seed is not None else profile.model_copy(update={"seed": seed})


@dataclass(frozen=True)
class ConditionLinks:
    """Device name -> profile of each path, as asked (emulated time), and the dilation."""

    primary: dict[str, LinkProfile]
    backup: dict[str, LinkProfile]
    dilation: float = 1.0

    @property
    def applied_primary(self) -> dict[str, LinkProfile]:
        """The primary links as the backend applies them (real time)."""
        return {d: dilate(p, self.dilation) for d, p in self.primary.items()}

    @property
    def applied_backup(self) -> dict[str, LinkProfile]:
        """The backup links as the backend applies them (real time)."""
        return {d: dilate(p, self.dilation) for d, p in self.backup.items()}

    @property
    def requested(self) -> LinkProfile:
        """The primary profile every device shares (the playbook's `link`)."""
        return next(iter(self.primary.values()))


def backup_profiles(
    lab: Lab, devices: list[str], seed: int | None = None
) -> dict[str, LinkProfile]:
    """Each named device's backup-link profile from the lab's topology (seeded with `seed`
    unless it sets its own); empty when the lab has no backup path."""
    if load_plan(lab) is None:
        return {}
    found = {d: lab.topology.link(d, "backup") for d in devices}
    return {d: seeded(k.profile, seed) if seed is not None else k.profile
            for d, k in found.items() if k is not None}  # fmt: skip


def condition_links(lab: Lab, devices: list[str], pb: Playbook, dilation: float) -> ConditionLinks:
    """The links of a condition run on `devices` with playbook `pb` at `dilation`."""
    return ConditionLinks(
        primary={d: seeded(pb.link, pb.seed) for d in devices},
        backup=backup_profiles(lab, devices, pb.seed),
        dilation=dilation,
    )
