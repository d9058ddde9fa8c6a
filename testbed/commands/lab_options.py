"""What the lab commands share (`testbed lab ...`, `testbed lab calibrate`): their options, and
how they find the lab or the links they act on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from testbed.labs import EmulatedLab, LinkSite

INTERRUPTED = "interrupted (run `testbed lab clean` if anything was left behind)"

NameOpt = Annotated[str, typer.Option("--name", help="Lab name (1-10 lowercase letters/digits).")]
StateOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", help="Lab state folder (default: <cache>/labs/<name>)."),
]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Print the actions, do nothing.")]
InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        help="A physical lab's Ansible inventory (links impaired on its middlebox, or on its hosts "
        "where it names none).",
    ),
]
DevicesOpt = Annotated[
    list[str] | None,
    typer.Option("--device", "-d", help="Device name (repeat); default: every device."),
]


def lab_runner(dry_run: bool) -> Any:
    """The system runner of a lab command (printing only, in a dry run)."""
    from testbed.labs import SystemRunner

    return SystemRunner(dry_run=dry_run)


def find_lab(name: str, state_dir: Path | None, dry_run: bool = False) -> EmulatedLab:
    """The namespace lab called `name` (from its state folder)."""
    from testbed.labs import EmulatedLab

    return EmulatedLab.find(name, state_dir, runner=lab_runner(dry_run))


def link_site(name: str, state_dir: Path | None, inventory: Path | None, dry_run: bool) -> LinkSite:
    """The links to impair: a namespace lab's, or (with --inventory) a physical lab's."""
    if inventory is None:
        return find_lab(name, state_dir, dry_run)
    from testbed.hosts.inventory import load_inventory
    from testbed.labs import LabSetup
    from testbed.labs.physical import InventoryLab, inventory_topology
    from testbed.topo.profile import LinkProfile

    topo = inventory_topology(load_inventory(inventory), LinkProfile())
    setup = LabSetup.build("--inventory", name=name, topology=topo, inventory=inventory,
                           state_dir=state_dir)  # fmt: skip
    return InventoryLab.up(setup, runner=lab_runner(dry_run))
