"""Kernel impairment with tc netem, for kernels that have sch_netem.

Each device <-> server flow gets an HTB class on a bridge port in the bridge namespace (see
`shaper`) with a netem leaf: delay rtt/2, jitter, loss per direction. Only device <-> server
traffic is classified there, so controller traffic stays unimpaired, as with `nfqueue`.
"""

from __future__ import annotations

from testbed.errors import ImpairmentError
from testbed.lab.emulated import EmulatedLab
from testbed.lab.system import SystemRunner
from testbed.netem import shaper
from testbed.netem.profile import LinkProfile

NETEM_LIMIT = 100_000


def netem_args(profile: LinkProfile, direction: str) -> list[str]:
    """`netem ...` arguments for one direction of `profile`."""
    args = ["netem", "limit", str(NETEM_LIMIT)]
    if profile.rtt_ms > 0:
        args += ["delay", f"{profile.one_way_ms:g}ms"]
        if profile.jitter_ms > 0:
            args += [f"{profile.jitter_ms:g}ms"]
    loss = profile.up_loss if direction == "up" else profile.down_loss
    if loss > 0:
        args += ["loss", "random", f"{loss * 100:g}%"]
    return args


class TcNetemBackend:
    """tc netem on the bridge ports (delay, jitter, loss; rate through HTB)."""

    name = "netem"

    def __init__(self, runner: SystemRunner) -> None:
        self.runner = runner

    def apply(self, lab: EmulatedLab, profiles: dict[str, LinkProfile]) -> dict[str, object]:
        devices = shaper.indexed_devices(lab, profiles)
        cmds, ports = shaper.htb_commands(lab.server, devices, profiles, leaf=netem_args)
        shaper.reset(self.runner, lab.bridge_netns)
        for argv in cmds:
            self.runner.run(argv, netns=lab.bridge_netns, error=ImpairmentError)
        return {"shaped_ports": ports, "holder": None, "holder_pid": None}

    def clear(self, lab: EmulatedLab, state: dict[str, object]) -> None:
        shaper.reset(self.runner, lab.bridge_netns, list(state.get("shaped_ports") or []))

    def _netem_count(self, lab: EmulatedLab, port: str) -> int:
        out = self.runner.run(
            ["tc", "qdisc", "show", "dev", port], netns=lab.bridge_netns, query=True, check=False
        ).stdout
        return sum(1 for line in out.splitlines() if line.startswith("qdisc netem"))

    def verify(
        self, lab: EmulatedLab, profiles: dict[str, LinkProfile], state: dict[str, object]
    ) -> None:
        """Raise ImpairmentError unless every expected netem qdisc is in place."""
        if self.runner.dry_run:
            return
        expected: dict[str, int] = {}
        for dev in lab.devices:
            if dev.name in profiles:
                expected[dev.port] = expected.get(dev.port, 0) + 1
                expected[lab.server.port] = expected.get(lab.server.port, 0) + 1
        problems = [
            f"{port}: {got} netem qdisc(s), expected {want}"
            for port, want in expected.items()
            if (got := self._netem_count(lab, port)) != want
        ]
        devices = shaper.indexed_devices(lab, profiles)
        problems += [
            f"class missing: {flow}"
            for flow in shaper.missing_classes(
                self.runner, lab.bridge_netns, lab.server, devices, profiles, netem_args
            )
        ]
        if problems:
            raise ImpairmentError(
                f"netem impairment of lab {lab.name} not in place: " + "; ".join(problems)
            )

    def verify_clear(self, lab: EmulatedLab) -> None:
        if self.runner.dry_run:
            return
        left = shaper.shaped_ports(self.runner, lab.bridge_netns)
        left += [p.port for p in lab.hosts if self._netem_count(lab, p.port)]
        if left:
            raise ImpairmentError(f"netem/HTB qdiscs left after clear on {sorted(set(left))}")
