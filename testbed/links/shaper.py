"""HTB classes on the bridge ports that carve out each device <-> server flow.

Both directions are shaped in the bridge namespace, at the egress of a bridge port:
- server -> device: at `p-<dev>` egress, traffic from the server's address goes to class 1:2;
- device -> server: at `p-server` egress, traffic from the device's address goes to its class.
Everything else (controller SSH, device <-> device) is unclassified and passes unshaped.
A class may carry a leaf qdisc (the tc backend hangs netem there) and a rate (`rate_mbit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from testbed.core.errors import ImpairmentError
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner
from testbed.topo.profile import LinkProfile

UNLIMITED = "10gbit"  # class rate when only a leaf (netem) is wanted
Leaf = Callable[[LinkProfile, str], list[str] | None]
"""(profile, "up" | "down") -> leaf qdisc arguments (after `tc qdisc add ... parent X`), or None."""


def indexed_devices(lab: LinkSite, profiles: dict[str, LinkProfile]) -> list[tuple[int, LabHost]]:
    """(1-based index, device) of every lab device; ImpairmentError for unknown profile keys."""
    devices = list(enumerate(lab.devices, start=1))
    unknown = sorted(set(profiles) - {d.name for _, d in devices})
    if unknown:
        names = ", ".join(d.name for _, d in devices)
        raise ImpairmentError(f"lab {lab.name} has no device(s) {unknown} (devices: {names})")
    return devices


@dataclass(frozen=True)
class ShapedFlow:
    """One direction of one device's link: the port and HTB class it is shaped in."""

    device: str
    direction: str  # "up" (device -> server) or "down" (server -> device)
    port: str
    classid: str
    match: tuple[str, ...]


def flows(server: LabHost, devices: list[tuple[int, LabHost]]) -> list[ShapedFlow]:
    """The two shaped flows of each (index, device)."""
    out = []
    for index, dev in devices:
        out.append(
            ShapedFlow(dev.name, "down", dev.port, "1:2", ("match", "ip", "src", f"{server.ip}/32"))
        )
        out.append(
            ShapedFlow(
                dev.name,
                "up",
                server.port,
                f"1:{0x100 + index:x}",
                ("match", "ip", "src", f"{dev.ip}/32", "match", "ip", "dst", f"{server.ip}/32"),
            )
        )
    return out


def htb_commands(
    server: LabHost,
    devices: list[tuple[int, LabHost]],
    profiles: dict[str, LinkProfile],
    leaf: Leaf | None = None,
) -> tuple[list[list[str]], list[str]]:
    """(tc argv lists, ports touched) that set up classes (and leaves) for `profiles`."""
    shaped = [(f, profiles[f.device]) for f in flows(server, devices) if f.device in profiles]
    return flow_commands(shaped, leaf)


def flow_commands(
    shaped: list[tuple[ShapedFlow, LinkProfile]], leaf: Leaf | None = None
) -> tuple[list[list[str]], list[str]]:
    """(tc argv lists, ports touched) that give each (flow, its profile) of `shaped` an HTB
    class with its rate and, from `leaf`, a leaf qdisc; one HTB root per port."""
    cmds: list[list[str]] = []
    rooted: list[str] = []
    for flow, prof in shaped:
        leaf_args = leaf(prof, flow.direction) if leaf else None
        if prof.rate_mbit is None and leaf_args is None:
            continue
        if flow.port not in rooted:
            rooted.append(flow.port)
            # default 0: unclassified traffic (controller SSH, device <-> device) is not shaped
            cmds.append(["tc", "qdisc", "replace", "dev", flow.port, "root", "handle", "1:", "htb"])
        rate = f"{prof.rate_mbit}mbit" if prof.rate_mbit else UNLIMITED
        dev = ["dev", flow.port]
        cmds.append(
            [
                "tc",
                "class",
                "add",
                *dev,
                "parent",
                "1:",
                "classid",
                flow.classid,
                "htb",
                "rate",
                rate,
            ]
        )
        if leaf_args:
            handle = f"{int(flow.classid.split(':')[1], 16):x}:"
            cmds.append(
                ["tc", "qdisc", "add", *dev, "parent", flow.classid, "handle", handle, *leaf_args]
            )
        cmds.append(
            ["tc", "filter", "add", *dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
             *flow.match, "flowid", flow.classid]
        )  # fmt: skip
    return cmds, rooted


def clear_commands(ports: list[str]) -> list[list[str]]:
    """Remove the root qdisc of each shaped port (back to the default qdisc)."""
    return [["tc", "qdisc", "del", "dev", p, "root"] for p in ports]


def shaped_ports(runner: SystemRunner, netns: str | None) -> list[str]:
    """Ports in `netns` that carry one of our HTB roots now (read from the system)."""
    out = runner.run(["tc", "qdisc", "show"], netns=netns, query=True, check=False).stdout
    ports = []
    for line in out.splitlines():
        words = line.split()
        if words[:3] == ["qdisc", "htb", "1:"] and "root" in words and "dev" in words:
            ports.append(words[words.index("dev") + 1])
    return ports


def reset(runner: SystemRunner, netns: str, also: list[str] | None = None) -> None:
    """Remove every HTB root we put on the bridge ports (and on `also`, if any)."""
    ports = sorted(set(shaped_ports(runner, netns)) | set(also or []))
    for argv in clear_commands(ports):
        runner.run(argv, netns=netns, check=False, error=ImpairmentError)


def missing_classes(
    runner: SystemRunner,
    netns: str,
    server: LabHost,
    devices: list[tuple[int, LabHost]],
    profiles: dict[str, LinkProfile],
    leaf: Leaf | None = None,
) -> list[str]:
    """Shaped flows whose HTB class is not in place (empty when all are)."""
    missing = []
    for flow in flows(server, devices):
        prof = profiles.get(flow.device)
        if prof is None or (
            prof.rate_mbit is None and (leaf is None or not leaf(prof, flow.direction))
        ):
            continue
        out = runner.run(
            ["tc", "class", "show", "dev", flow.port, "classid", flow.classid],
            netns=netns,
            query=True,
            check=False,
        ).stdout
        if "htb" not in out:
            missing.append(f"{flow.device} {flow.direction} (class {flow.classid} on {flow.port})")
    return missing
