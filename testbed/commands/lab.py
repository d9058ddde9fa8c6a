"""`testbed lab`: bring the emulated lab up and down, impair and probe its links.

Heavy imports (pydantic models, Fabric) happen inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from testbed.commands.exits import exit_codes
from testbed.commands.lab_options import (
    INTERRUPTED,
    DevicesOpt,
    DryOpt,
    InventoryOpt,
    NameOpt,
    StateOpt,
    find_lab,
    lab_runner,
    link_site,
)
from testbed.core.errors import ExitCode

if TYPE_CHECKING:
    from testbed.labs import EmulatedLab


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


def _hosts_table(lab: EmulatedLab) -> None:
    _table(
        f"lab {lab.name}",
        ["host", "role", "class", "address", "netns", "bridge port", "workdir"],
        [
            [h.name, h.role, h.host_class, h.ip, h.netns, h.port, str(h.workdir)]
            for h in [*lab.state.support_hosts, *lab.hosts]
        ],
    )


def up(
    devices: Annotated[
        int | None,
        typer.Option("--devices", "-n", help="Number of devices (default: the topology's; 2)."),
    ] = None,
    topology: Annotated[
        Path | None, typer.Option(help="Topology file (topologies/*.yaml; default: a star).")
    ] = None,
    name: NameOpt = "lab",
    subnet: Annotated[
        str | None,
        typer.Option(help="IPv4 subnet of the lab (10.77.0.0/24; a rehearsal's LAN 10.96.0.0/24)."),
    ] = None,
    kind: Annotated[
        str,
        typer.Option(
            help="namespaces (a star of namespace hosts) or rehearsal (hosts shaped like "
            "ansible/inventories/lab.example.yml, provisioned and run through their inventory)."
        ),
    ] = "namespaces",
    state_dir: StateOpt = None,
    dry_run: DryOpt = False,
) -> None:
    """Create the lab: one namespace and sshd per host, a bridge, the controller attached."""
    with exit_codes(INTERRUPTED):
        from testbed.labs import LabSetup
        from testbed.labs.kinds import STANDING_KINDS, lab_class
        from testbed.topo.files import load_topology

        cls: Any = lab_class(kind, STANDING_KINDS, "--kind")
        default = "10.96.0.0/24" if kind == "rehearsal" else "10.77.0.0/24"
        fields: dict[str, Any] = {"name": name, "subnet": subnet or default, "state_dir": state_dir}
        if topology is not None:
            fields["topology"] = load_topology(topology)
        if devices is not None:
            fields["devices"] = devices  # rescales the topology (a star by default)
        setup = LabSetup.build("testbed lab up", **fields)
        say: Callable[[str], None] = lambda m: typer.echo(f"  {m}", err=True)  # noqa: E731
        lab = cls.up(
            setup, runner=lab_runner(dry_run), progress=None if dry_run else say, persistent=True
        )
        if dry_run:
            return
        _hosts_table(lab)
        typer.echo(f"inventory: {lab.inventory_path}")
        if kind == "rehearsal":
            typer.echo(f"vault password: {lab.vault_password_file}")
        typer.echo(f"up in {lab.state.up_seconds:.2f} s; remove it: testbed lab down --name {name}")


def status(name: NameOpt = "lab", state_dir: StateOpt = None) -> None:
    """Show the lab's hosts as found on the system; exit 3 if anything is missing."""
    with exit_codes(INTERRUPTED):
        from testbed.links.api import current

        lab = find_lab(name, state_dir)
        st = lab.status()
        _table(
            f"lab {lab.name} ({'healthy' if st.healthy else 'NOT healthy'})",
            ["host", "role", "address", "netns", "sshd"],
            [
                [
                    h.name,
                    h.role,
                    h.ip,
                    h.netns + ("" if h.netns_exists else " (missing)"),
                    f"pid {h.sshd_pid}" if h.sshd_alive else "DOWN",
                ]
                for h in st.hosts
            ],
        )
        typer.echo(f"inventory: {lab.inventory_path}")
        imp = current(lab)
        if imp is not None:
            for dev, prof in imp.profiles.items():
                typer.echo(f"impaired ({imp.backend}): {dev}: {prof.model_dump(exclude_none=True)}")
            for dev, prof in imp.backup.items():
                shown = prof.model_dump(exclude_none=True)
                typer.echo(f"impaired ({imp.backend}): {dev} backup path: {shown}")
        if not st.healthy:
            raise typer.Exit(int(ExitCode.LAB))


def down(
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
    keep_files: Annotated[bool, typer.Option(help="Keep keys, logs and workdirs.")] = False,
    dry_run: DryOpt = False,
) -> None:
    """Remove the lab (processes, namespaces, links, rules) and check nothing is left."""
    with exit_codes(INTERRUPTED):
        lab = find_lab(name, state_dir, dry_run)
        removed = lab.down(keep_files=keep_files)
        if not dry_run:
            typer.echo(f"lab {name} is down ({len(removed)} objects removed)")


def mirror(
    folder: Annotated[Path, typer.Argument(help="The folder to fill (the controller serves it).")],
    deps: Annotated[
        bool,
        typer.Option(
            help="Every dependency's wheel too (builds llama-cpp-python: run it on a host of "
            "the lab's architecture)."
        ),
    ] = False,
    debs: Annotated[
        bool, typer.Option(help="The Debian packages the roles install, as a flat apt repository.")
    ] = True,
) -> None:
    """Fill an offline lab's folder: the harness's wheels and the roles' Debian packages, for
    hosts of this machine's architecture and release (testbed.hosts.mirror)."""
    with exit_codes(INTERRUPTED):
        from testbed.hosts.mirror import build_mirror

        made = build_mirror(folder, debs=debs, deps=deps)
        typer.echo(f"{folder}/wheels: {len(made.wheels)} wheels; {folder}/debs: "
                   f"{len(made.debs)} Debian packages")  # fmt: skip
        typer.echo(f"serve it: python3 -m http.server --directory {folder} 8000")


def clean(
    name: Annotated[
        str | None, typer.Option("--name", help="Only this lab (default: every tb- lab).")
    ] = None,
    dry_run: DryOpt = False,
) -> None:
    """Remove leftovers of crashed labs (namespaces, links, sshd/holders), with no state needed."""
    with exit_codes(INTERRUPTED):
        from testbed.labs import clean_all

        removed = clean_all(name, runner=lab_runner(dry_run))
        if dry_run:
            return
        for item in removed:
            typer.echo(f"removed {item}")
        typer.echo("nothing to clean" if not removed else f"{len(removed)} objects removed")


def impair(
    rtt: Annotated[float, typer.Option("--rtt", help="Round-trip time to add, ms.")] = 85.0,
    jitter: Annotated[float, typer.Option(help="Jitter per direction, ms (uniform).")] = 0.0,
    loss: Annotated[float, typer.Option(help="Per-direction loss, 0..1.")] = 0.0,
    loss_up: Annotated[float | None, typer.Option(help="Device->server loss, 0..1.")] = None,
    loss_down: Annotated[float | None, typer.Option(help="Server->device loss, 0..1.")] = None,
    rate: Annotated[float | None, typer.Option("--rate", help="Rate limit, Mbit/s.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the jitter.")] = None,
    profile_file: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="A link profile file (YAML, the topology profiles' schema: Gilbert-Elliott "
            "loss, jitter distribution, schedule, trace...) instead of the options above.",
        ),
    ] = None,
    device: DevicesOpt = None,
    backend: Annotated[str, typer.Option(help="auto | netem | nfqueue.")] = "auto",
    probe: Annotated[bool, typer.Option(help="Probe the links afterwards.")] = True,
    inventory: InventoryOpt = None,
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
    dry_run: DryOpt = False,
) -> None:
    """Impair the device <-> server links (controller traffic is never impaired)."""
    with exit_codes(INTERRUPTED):
        from testbed.links.api import apply
        from testbed.links.probe import format_result, probe_links
        from testbed.topo.profile import LinkProfile

        options = dict(rtt_ms=rtt, jitter_ms=jitter, loss=loss, loss_up=loss_up,
                       loss_down=loss_down, rate_mbit=rate, seed=seed)  # fmt: skip
        if profile_file is None:
            profile = LinkProfile.build("testbed lab impair", **options)
        else:
            profile = _profile_from_file(profile_file, options)
        lab = link_site(name, state_dir, inventory, dry_run)
        imp = apply(lab, profile, device, backend=backend)
        if dry_run:
            return
        how = f"{imp.backend} ({imp.reason}" + (f", {imp.holder} holder)" if imp.holder else ")")
        typer.echo(f"applied with {how} to {', '.join(device or [d.name for d in lab.devices])}")
        if probe:
            for res in probe_links(lab, device).values():
                typer.echo(format_result(res))


def _profile_from_file(path: Path, options: dict[str, Any]) -> Any:
    """The LinkProfile in a YAML file; the link options must then be left at their defaults."""
    from testbed.core.errors import BadInputError
    from testbed.core.loading import read_yaml
    from testbed.topo.profile import LinkProfile

    defaults = {"rtt_ms": 85.0, "jitter_ms": 0.0, "loss": 0.0}
    given = [k for k, v in options.items() if v != defaults.get(k)]
    if given:
        raise BadInputError(
            f"--profile {path}: the file is the whole profile; drop the options {given}"
        )
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise BadInputError(f"{path}: expected a mapping of link profile fields")
    return LinkProfile.build(str(path), **data)


def clear_cmd(
    device: DevicesOpt = None,
    inventory: InventoryOpt = None,
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
    dry_run: DryOpt = False,
) -> None:
    """Remove the impairment (of the given devices, default all)."""
    with exit_codes(INTERRUPTED):
        from testbed.links.api import clear

        left = clear(link_site(name, state_dir, inventory, dry_run), device)
        if not dry_run:
            typer.echo("cleared" + (f"; still impaired: {sorted(left.profiles)}" if left else ""))


def probe_cmd(
    device: DevicesOpt = None,
    count: Annotated[int, typer.Option(help="Probe packets per link.")] = 200,
    interval: Annotated[float, typer.Option(help="Interval between packets, ms.")] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    inventory: InventoryOpt = None,
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
) -> None:
    """Measure RTT and per-direction loss of device links against the applied profile."""
    with exit_codes(INTERRUPTED):
        from testbed.links.probe import format_result, probe_links

        site = link_site(name, state_dir, inventory, False)
        results = probe_links(site, device, count=count, interval_ms=interval)
        for res in results.values():
            if as_json:
                sys.stdout.write(res.model_dump_json() + "\n")
            else:
                typer.echo(format_result(res))


def capture(
    device: DevicesOpt = None,
    count: Annotated[int, typer.Option(help="Probe datagrams per link.")] = 1000,
    interval: Annotated[float, typer.Option(help="Interval between datagrams, ms.")] = 5.0,
    profile_file: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Apply this link profile (YAML) first, and clear it after; default: capture "
            "the links as they are impaired now.",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for the pcaps (default: the lab's run folder).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON line per link.")] = False,
    name: NameOpt = "lab",
    state_dir: StateOpt = None,
) -> None:
    """Record both sides of each device's impaired hop as pcap while a probe crosses it, and
    read them with scapy: per-packet one-way delay, loss bursts and reordering, against the
    packet holder's model (a namespace or Mininet lab)."""
    with exit_codes(INTERRUPTED):
        from testbed.core.errors import BadInputError
        from testbed.links.api import apply, clear, current
        from testbed.links.capture import capture_link, describe

        lab = find_lab(name, state_dir)
        names = device or [d.name for d in lab.devices]
        if profile_file is not None:
            apply(lab, _profile_from_file(profile_file, {}), names)
        try:
            imp = current(lab)
            missing = [d for d in names if imp is None or d not in imp.profiles]
            if missing:
                raise BadInputError(f"lab {name}: {missing} not impaired; give --profile")
            assert imp is not None
            folder = out or lab.runtime_dir / "capture"
            for dev in names:
                res = capture_link(lab, dev, imp.profiles[dev], folder / dev, count, interval)
                if as_json:
                    sys.stdout.write(res.model_dump_json() + "\n")
                else:
                    for line in describe(res):
                        typer.echo(line)
        finally:
            if profile_file is not None:
                clear(lab, names)
