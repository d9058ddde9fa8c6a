"""Kernel impairment with tc netem, for kernels that have sch_netem.

Each device <-> server flow, on the primary and (where the lab has one) the backup path, gets
an HTB class on a bridge port in the bridge namespace (see `shaper`) with a netem leaf: delay
rtt/2, jitter with its distribution, loss per direction (random or Gilbert-Elliott `gemodel`),
queue limit. Only device <-> server traffic is classified there, so controller traffic stays
unimpaired, as with `nfqueue`. Ordering: netem lets jittered packets pass each other (`order:
reorder`); for `order: keep` the leaf also gets `rate 10gbit`, with which netem times each
packet from the later of its own delay and its predecessor's release (sch_netem's
netem_enqueue), as the holder keeps order, at a rate that limits nothing here (a 1,500-byte
packet takes 1.2 us). Differences from the holder: netem cannot be seeded, its normal, pareto and
paretonormal jitter come from its own tables, and it has no schedules, so a profile with a
schedule or trace is refused here (use the nfqueue backend).
"""

from __future__ import annotations

from testbed.core.errors import ImpairmentError
from testbed.labs.backup import backup_ports
from testbed.labs.interface import LinkSite
from testbed.labs.system import SystemRunner
from testbed.links import shaper
from testbed.links.paths import htb_plan, impaired_paths
from testbed.topo.profile import GilbertElliott, LinkProfile

KEEP_ORDER_RATE = "10gbit"  # netem keeps order when given a rate; this one limits nothing


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.10g}%"


def netem_args(profile: LinkProfile, direction: str) -> list[str]:
    """`netem ...` arguments for one direction ("up" | "down") of a static `profile`."""
    args = ["netem", "limit", str(profile.queue_limit)]
    if profile.rtt_ms > 0:
        args += ["delay", f"{profile.one_way_ms:g}ms"]
        if profile.jitter_ms > 0:
            args += [f"{profile.jitter_ms:g}ms"]
            if profile.jitter_dist != "uniform":
                args += ["distribution", profile.jitter_dist]
            if profile.order == "keep":
                args += ["rate", KEEP_ORDER_RATE]
    loss = profile.loss_model(direction)  # type: ignore[arg-type]
    if isinstance(loss, GilbertElliott):
        args += ["loss", "gemodel", _pct(loss.p), _pct(loss.r)]
        args += [_pct(loss.one_minus_h), _pct(loss.one_minus_k)]
    elif loss > 0:
        args += ["loss", "random", _pct(loss)]
    return args


def netem_count(runner: SystemRunner, port: str, netns: str | None = None) -> int:
    """How many netem qdiscs `port` carries now (in `netns`)."""
    out = runner.run(["tc", "qdisc", "show", "dev", port], netns=netns, query=True, check=False)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("qdisc netem"))


class TcNetemBackend:
    """tc netem on the bridge ports (delay, jitter, loss; rate through HTB)."""

    name = "netem"

    def __init__(self, runner: SystemRunner) -> None:
        self.runner = runner

    def apply(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        backup: dict[str, LinkProfile] | None = None,
    ) -> dict[str, object]:
        """Replace the whole impairment of `lab` by `profiles` (primary links) and `backup`
        (backup links); returns backend state to keep."""
        paths = impaired_paths(lab, profiles, backup)
        varying = sorted(name for p in paths for name, prof in p.profiles.items() if prof.varies)
        if varying:
            raise ImpairmentError(
                f"tc netem cannot run a schedule or trace (links of {', '.join(varying)}); "
                "use backend nfqueue, whose holder steps through them"
            )
        cmds, ports = htb_plan(paths, netem_args)
        shaper.reset(self.runner, lab.bridge_netns)
        for argv in cmds:
            self.runner.run(argv, netns=lab.bridge_netns, error=ImpairmentError)
        return {"shaped_ports": ports, "holder": None, "holder_pid": None}

    def clear(self, lab: LinkSite, state: dict[str, object]) -> None:
        shaper.reset(self.runner, lab.bridge_netns, list(state.get("shaped_ports") or []))

    def verify(
        self,
        lab: LinkSite,
        profiles: dict[str, LinkProfile],
        state: dict[str, object],
        backup: dict[str, LinkProfile] | None = None,
    ) -> None:
        """Raise ImpairmentError unless every expected netem qdisc is in place (both paths)."""
        if self.runner.dry_run:
            return
        expected: dict[str, int] = {}
        problems: list[str] = []
        for p in impaired_paths(lab, profiles, backup):
            for _, dev in p.devices:
                if dev.name in p.profiles:
                    expected[dev.port] = expected.get(dev.port, 0) + 1
                    expected[p.site.server.port] = expected.get(p.site.server.port, 0) + 1
            problems += [
                f"class missing: {flow}"
                for flow in shaper.missing_classes(
                    self.runner, lab.bridge_netns, p.site.server, p.devices, p.profiles, netem_args
                )
            ]
        problems = [
            f"{port}: {got} netem qdisc(s), expected {want}"
            for port, want in expected.items()
            if (got := netem_count(self.runner, port, lab.bridge_netns)) != want
        ] + problems
        if problems:
            raise ImpairmentError(
                f"netem impairment of lab {lab.name} not in place: " + "; ".join(problems)
            )

    def verify_clear(self, lab: LinkSite) -> None:
        if self.runner.dry_run:
            return
        left = shaper.shaped_ports(self.runner, lab.bridge_netns)
        ports = [h.port for h in lab.hosts] + backup_ports(lab)
        left += [port for port in ports if netem_count(self.runner, port, lab.bridge_netns)]
        if left:
            raise ImpairmentError(f"netem/HTB qdiscs left after clear on {sorted(set(left))}")
