"""The links a backend impairs, path by path: the primary links, and a lab's backup links.

A backend applies both paths in one go (one rule set and one holder per bridge namespace), each
through its own `LinkSite`: the lab itself, or the lab seen through its backup ports.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.labs.backup import path_site
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.links.shaper import Leaf, htb_commands, indexed_devices
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import PathKind


@dataclass(frozen=True)
class PathLinks:
    """One path's device links at the site that impairs them, with the profile of each."""

    path: PathKind
    site: LinkSite
    devices: list[tuple[int, LabHost]]  # (1-based index, device end on this path)
    profiles: dict[str, LinkProfile]


def impaired_paths(
    lab: LinkSite, profiles: dict[str, LinkProfile], backup: dict[str, LinkProfile] | None = None
) -> list[PathLinks]:
    """The primary path with `profiles`, and the backup path with `backup` if any is given."""
    paths = [PathLinks("primary", lab, indexed_devices(lab, profiles), profiles)]
    if backup:
        site = path_site(lab, "backup")
        paths.append(PathLinks("backup", site, indexed_devices(site, backup), backup))
    return paths


def htb_plan(paths: list[PathLinks], leaf: Leaf | None = None) -> tuple[list[list[str]], list[str]]:
    """(tc argv lists, ports touched) that shape every path's links (see `shaper.htb_commands`)."""
    cmds: list[list[str]] = []
    ports: list[str] = []
    for p in paths:
        more, touched = htb_commands(p.site.server, p.devices, p.profiles, leaf)
        cmds += more
        ports += touched
    return cmds, ports
