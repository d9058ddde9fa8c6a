"""Options the lab commands share (`testbed lab ...`, `testbed lab calibrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
