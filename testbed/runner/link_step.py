"""A condition's links, as one step of its run: applied (dilated), probed and checked by the
link guard, recorded in the condition's `link.json` with what happened to them meanwhile,
and always cleared at the end.

    with condition_link_step(ctx, links, folder) as link:   # applied and checked
        ... run the agents ...
        link.close()                                         # events recorded, link.json written
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from agents.failover import Failover
from testbed.config.playbook import ImpairmentSection
from testbed.core.files import atomic_write_json
from testbed.labs.backup import failover_log, read_failovers, set_monitor_dilation
from testbed.labs.clocks import machine_clock
from testbed.labs.interface import Lab
from testbed.links.api import apply_each, clear, link_changes
from testbed.links.plan import ConditionLinks
from testbed.links.probe import ProbeResult, probe_backup, probe_links
from testbed.metrics.clocks import CONTROLLER, ClockOffset
from testbed.results.store import ConditionFolder
from testbed.runner.context import RunContext
from testbed.runner.emulation import ConditionTime
from testbed.runner.link_guard import probe_checked
from testbed.topo.profile import LOSS_SEMANTICS


def link_events(
    lab: Lab, since: float, until: float, when: ConditionTime
) -> dict[str, list[dict[str, Any]]]:
    """What happened to the links between the controller's times `since` and `until`: the
    profile changes the packet holder(s) applied (schedules, traces, reloads) and the backup
    path's failovers, each on the controller's clock (`events_on_controller`). A holder stamps
    its machine's clock: the lab's forwarding point (the bridge namespace here, or a middlebox)
    or, on a lab impaired on its hosts, the host (`host`); each such clock is measured
    (`testbed.labs.clocks`). The monitor runs here, on the controller's clock."""
    changes = link_changes(lab)
    stamped_on = {c.get("host") for c in changes}
    clocks = {
        h: machine_clock(lab.runner if h is None else lab.host_runner(str(h))) for h in stamped_on
    }
    return events_on_controller(
        changes, clocks, read_failovers(failover_log(lab)), since, until, when
    )


def events_on_controller(
    changes: list[dict[str, Any]],
    clocks: Mapping[str | None, ClockOffset],
    failovers: list[Failover],
    since: float,
    until: float,
    when: ConditionTime,
) -> dict[str, list[dict[str, Any]]]:
    """The holders' `changes` (each on the clock of `clocks[change["host"]]`, None: the
    forwarding point's) and the monitor's `failovers` (the controller's clock) that fell between
    the controller's `since` and `until` (within the offset's error bound), moved onto the
    controller's clock and then onto the condition's emulated clock (delays in emulated time),
    each with the offset that moved it."""
    kept = []
    for c in changes:
        clock = clocks[c.get("host")]
        at = clock.to_controller(float(c.get("at", 0.0)))
        if since - clock.error_s <= at <= until + clock.error_s:
            c = {**c, "at": when.wall(at), **clock.columns()}
            for key in ("delay_us", "jitter_us"):
                if isinstance(c.get(key), int | float):
                    c[key] = c[key] / when.dilation
            kept.append(c)
    moved = [
        {**asdict(f), "t": when.wall(f.t), **CONTROLLER.columns()}
        for f in failovers
        if since <= f.t <= until
    ]
    return {"changes": sorted(kept, key=lambda c: c["at"]), "failovers": moved}


@dataclass
class LinkStep:
    """The condition's links while it runs, and their record (`link.json`)."""

    lab: Lab
    links: ConditionLinks
    when: ConditionTime
    folder: ConditionFolder
    dry_run: bool
    record: dict[str, Any] = field(default_factory=dict)
    began: float = field(default_factory=time.time)

    def save(self) -> None:
        if not self.dry_run:
            atomic_write_json(self.folder.link, self.record)

    def apply(self, knobs: ImpairmentSection, say: Any) -> None:
        """Apply every path's links in one go, then probe and check each path."""
        links, lab = self.links, self.lab
        self.record.update(requested=links.requested.model_dump(), loss_semantics=LOSS_SEMANTICS,
                           time_dilation=links.dilation)  # fmt: skip
        if links.dilation != 1:
            self.record["applied"] = next(iter(links.applied_primary.values())).model_dump(
                mode="json"
            )
        if links.backup and lab.emulated:  # the emulated lab's link monitor keeps the time
            set_monitor_dilation(lab, links.dilation)
        imp = apply_each(lab, links.applied_primary, backend=knobs.backend,
                         backup=links.applied_backup)  # fmt: skip
        self.record.update(backend=imp.backend, backend_reason=imp.reason, holder=imp.holder)
        if links.backup:
            self.record["backup"] = {
                "requested": {d: p.model_dump() for d, p in links.backup.items()}
            }
        if self.dry_run:
            n = len(links.primary)
            say(f"  probe {n} device links, {knobs.probe_packets} UDP packets each")
            return
        n, devices = knobs.probe_packets, list(links.primary)

        def primary() -> dict[str, ProbeResult]:
            return probe_links(lab, devices, requested=links.applied_primary[devices[0]], count=n)

        probe_checked(self.record, primary, links.applied_primary, knobs, self.save, say,
                      links.dilation, links.primary)  # fmt: skip
        if links.backup:  # over each device's backup interface, while traffic stays on primary
            probe_checked(self.record["backup"],
                          lambda: probe_backup(lab, links.applied_backup, count=n),
                          links.applied_backup, knobs, self.save, say, links.dilation,
                          links.backup)  # fmt: skip

    def close(self) -> None:
        """Record what happened to the links since they were applied, and save the record."""
        self.record.update(link_events(self.lab, self.began, time.time(), self.when))
        self.save()


@contextmanager
def condition_link_step(
    ctx: RunContext, links: ConditionLinks, when: ConditionTime, folder: ConditionFolder,
    knobs: ImpairmentSection,
) -> Iterator[LinkStep]:  # fmt: skip
    """The links applied and checked for the block; cleared after it, whatever happens (a
    failed condition still records what happened to its links so far)."""
    step = LinkStep(ctx.lab, links, when, folder, ctx.dry_run)
    try:
        step.apply(knobs, ctx.say)
        yield step
    finally:
        clear(ctx.lab)
        if "changes" not in step.record and "requested" in step.record:
            step.close()
