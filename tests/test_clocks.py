"""Times of several hosts set against each other on the controller's clock: a host whose clock
runs 2.5 s ahead gives the same cross-host figures (a device's reaction to a cut, the
failover after it) once its measured offset is applied, and the condition's rows carry the
offsets they used. Offsets are injected: on the emulated lab every host shares one kernel
clock."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest

from agents.failover import Failover
from testbed.core.errors import LabError
from testbed.hosts.inventory import InventoryHost
from testbed.labs.clocks import machine_clock
from testbed.labs.system import SystemRunner
from testbed.metrics.clocks import CONTROLLER, ClockOffset
from testbed.results.store import ConditionFolder
from testbed.results.tables import tables_from_records
from testbed.runner.condition import hosts_info
from testbed.runner.emulation import ConditionTime
from testbed.runner.link_step import events_on_controller

SHIFT = 2.5  # the shifted host's clock minus the controller's
DEVICE_ERR, SITE_ERR = 0.004, 0.002  # the error bounds of their measured offsets

# One device on the controller's clock: rounds (start, end, mode); its link cut at 101.0 (by
# the link site), the monitor's failover at 101.5; the agent from 100.0 to 102.8.
ROUNDS = [(100.0, 100.6, "verified"), (100.6, 101.2, "verified"), (101.2, 101.9, "fallback"),
          (101.9, 102.3, "verified"), (102.3, 102.8, "verified")]  # fmt: skip
CUT_AT, FAILOVER_AT = 101.0, 101.5
REACTIONS = sorted([101.9 - CUT_AT, 101.9 - CUT_AT, 102.3 - FAILOVER_AT])  # both directions
FAILOVER_S = FAILOVER_AT - CUT_AT


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def holder_changes(shift: float) -> list[dict]:
    """What the link site's holder logs, on its own clock (`shift` ahead): each direction's
    first phase as the condition began, and the cut."""
    return [
        {"at": at + shift, "generation": 1, "link": "d1", "direction": d, "phase": phase,
         "delay_us": 10000.0, "p": 0.0, "r": 1.0, "1-h": 1.0, "1-k": loss}
        for at, phase, loss in ((99.5, 0, 0.0), (CUT_AT, 1, 1.0)) for d in ("up", "down")
    ]  # fmt: skip


def condition_row(
    tmp: Path, device_shift: float, device_offset: ClockOffset, site_shift: float,
    site_offset: ClockOffset,
) -> tuple[dict, pd.DataFrame]:  # fmt: skip
    """Write one condition's records as its hosts stamp them (the device's clock
    `device_shift` ahead, the link site's `site_shift`), the controller knowing their offsets
    as `device_offset` and `site_offset`; returns its row and its link_changes table."""
    folder = ConditionFolder(tmp)
    dev = folder.host("d1")
    write_jsonl(dev / "rounds.jsonl", [
        {"dev": "d1", "problem": "p", "round": i, "t_start": a + device_shift,
         "t_end": b + device_shift, "mode": mode, "drafted": 4, "accepted": 4, "tokens": 5}
        for i, (a, b, mode) in enumerate(ROUNDS)
    ])  # fmt: skip
    write_jsonl(dev / "requests.jsonl", [
        {"dev": "d1", "problem": "p", "t_start": 100.0 + device_shift,
         "t_end": 102.8 + device_shift, "tokens": 25, "verified_tokens": 20,
         "fallback_tokens": 5, "rounds": 5, "text": "#### 4", "reference": "4"},
    ])  # fmt: skip
    (dev / "status.json").write_text(json.dumps(
        {"dev": "d1", "t_start": 100.0 + device_shift, "t_end": 102.8 + device_shift}))  # fmt: skip
    failover = Failover(FAILOVER_AT, "d1", "backup", 3, 20.0, 1.0)  # the monitor: here
    events = events_on_controller(
        holder_changes(site_shift), {None: site_offset}, [failover], since=99.0, until=110.0,
        when=ConditionTime(1.0, 0.0),
    )  # fmt: skip
    folder.link.write_text(json.dumps({"requested": {"rtt_ms": 20.0}, **events}))
    info = hosts_info([HOST], "server", (99.0, 103.0), {"d1": device_offset})
    row = tables_from_records(folder, "c00", lambda r: r, hosts_info=info)
    return row, pd.read_parquet(folder.table("link_changes"))


HOST = InventoryHost(name="d1", role="device", address="d1", user="pi", workdir="/srv/edge",
                     host_class="pi5")  # fmt: skip


def test_a_host_time_goes_onto_the_controller_clock_and_back():
    clock = ClockOffset(SHIFT, 0.01)
    assert clock.to_controller(102.5) == pytest.approx(100.0)
    assert clock.to_host(clock.to_controller(7.25)) == pytest.approx(7.25)
    assert list(clock.to_controller(pd.Series([3.5, 4.5]).to_numpy())) == [1.0, 2.0]
    assert CONTROLLER.to_controller(5.0) == 5.0


def test_cross_host_figures_do_not_move_with_a_host_clock(tmp_path):
    """The device's clock 2.5 s ahead, then the link site's: with their measured offsets the
    reaction to the cut, to the failover, and the failover's delay after the cut are those of
    one shared clock; a device clock 0.5 s ahead taken for the controller's moves them."""
    same = condition_row(tmp_path / "same", 0.0, CONTROLLER, 0.0, CONTROLLER)[0]
    assert same["link_reaction_max_s"] == pytest.approx(max(REACTIONS))
    assert same["link_reaction_p50_s"] == pytest.approx(REACTIONS[1])
    assert same["failover_max_s"] == pytest.approx(FAILOVER_S)

    device = ClockOffset(SHIFT, DEVICE_ERR)
    site = ClockOffset(-SHIFT, SITE_ERR)
    shifted, changes = condition_row(tmp_path / "shifted", SHIFT, device, -SHIFT, site)
    for key in ("link_reaction_p50_s", "link_reaction_max_s", "failover_max_s"):
        assert shifted[key] == pytest.approx(same[key]), key
    cut = changes[(changes["kind"] == "change") & (changes["phase"] == 1)]
    assert list(cut["t"]) == pytest.approx([CUT_AT, CUT_AT])  # on the controller's clock
    assert list(cut["reaction_s"]) == pytest.approx([101.9 - CUT_AT] * 2)
    assert changes["reaction_s"][changes["phase"] == 0].isna().all()  # before the device ran

    ignored = condition_row(tmp_path / "ignored", 0.5, CONTROLLER, 0.0, CONTROLLER)[0]
    assert ignored["link_reaction_p50_s"] == pytest.approx(0.7)  # the device seems 0.2 s quicker
    assert same["link_reaction_p50_s"] == pytest.approx(0.9)


def test_condition_rows_carry_the_offsets_they_used(tmp_path):
    device, site = ClockOffset(SHIFT, DEVICE_ERR), ClockOffset(-0.3, SITE_ERR)
    row, changes = condition_row(tmp_path, SHIFT, device, -0.3, site)
    assert row["clock_offset_max_s"] == pytest.approx(SHIFT)
    assert row["clock_error_max_s"] == pytest.approx(DEVICE_ERR)
    hosts = pd.read_parquet(tmp_path / "hosts.parquet")
    assert hosts.set_index("dev").loc["d1", ["clock_offset_s", "clock_offset_err_s"]].tolist() == [
        SHIFT,
        DEVICE_ERR,
    ]
    moved = changes.set_index("kind")
    assert set(moved.loc["change", "clock_offset_s"]) == {-0.3}
    assert moved.loc["failover", "clock_offset_s"] == 0.0  # the monitor runs on the controller


def test_a_change_stamped_on_a_shifted_clock_is_kept_by_the_condition_window():
    """The link site 2.5 s ahead stamps the cut after the condition's window on its own clock;
    moved onto the controller's, it is inside (and one 2.5 s behind is not lost either)."""
    when = ConditionTime(1.0, 0.0)
    for shift in (SHIFT, -SHIFT):
        events = events_on_controller(holder_changes(shift), {None: ClockOffset(shift, 0.001)},
                                      [], since=100.5, until=101.2, when=when)  # fmt: skip
        assert [c["at"] for c in events["changes"]] == pytest.approx([CUT_AT, CUT_AT]), shift


def _shifted_date(tmp: Path, shift: float) -> SystemRunner:
    """A runner whose commands run through a shell where `date` answers `shift` s ahead of
    this machine's clock: a machine reached over a connection, with its own clock."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    date = bin_dir / "date"
    date.write_text(f"#!{sys.executable}\nimport time\nprint(f'{{time.time() + {shift}:.9f}}')\n")
    date.chmod(date.stat().st_mode | stat.S_IXUSR)
    return SystemRunner(remote=("env", f"PATH={bin_dir}:{os.environ['PATH']}", "sh", "-c"))


def test_a_machine_reached_over_a_connection_has_its_clock_measured(tmp_path):
    runner = _shifted_date(tmp_path, SHIFT)
    clock = machine_clock(runner)
    assert clock.error_s > 0 and abs(clock.offset_s - SHIFT) <= clock.error_s + 1e-6
    assert machine_clock(SystemRunner()) == CONTROLLER  # this machine: its own clock
    dry = SystemRunner(dry_run=True, remote=runner.remote)
    assert machine_clock(dry) == CONTROLLER  # a dry run measures nothing


def test_a_machine_whose_date_is_not_gnu_is_named(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "date").write_text("#!/bin/sh\necho 'Thu Dec  3 17:00:00 UTC 2026'\n")
    (bin_dir / "date").chmod(0o755)
    runner = SystemRunner(remote=("env", f"PATH={bin_dir}:{os.environ['PATH']}", "sh", "-c"))
    with pytest.raises(LabError, match=r"date \+%s\.%N.*Thu Dec"):
        machine_clock(runner)


def test_each_host_keeps_the_condition_epoch_on_its_own_clock():
    when = ConditionTime(4.0, 1000.0)
    ahead = when.on_host(ClockOffset(SHIFT, 0.0))
    assert (ahead.dilation, ahead.epoch) == (4.0, 1000.0 + SHIFT)
    # a host's emulated time is the controller's plus the offset: to_controller takes it off
    real_controller = 1040.0
    host_emulated = ahead.clock.wall(real_controller + SHIFT)
    assert ClockOffset(SHIFT, 0.0).to_controller(host_emulated) == pytest.approx(
        when.wall(real_controller)
    )


CONTROLLER_ROLE = Path(__file__).resolve().parent.parent / "ansible" / "roles" / "controller"


def _chrony_server_conf(clients: list[str], upstream: list[str]) -> list[str]:
    """The controller's chrony settings as its role's template writes them (Ansible renders
    with trim_blocks), the stratum from the role's defaults."""
    import jinja2
    import yaml

    defaults = yaml.safe_load((CONTROLLER_ROLE / "defaults" / "main.yml").read_text())
    source = (CONTROLLER_ROLE / "templates" / "edge-lab-server.conf.j2").read_text()
    text = jinja2.Template(source, trim_blocks=True).render(
        ansible_managed="managed", controller_time_clients=clients,
        controller_time_upstream=upstream,
        controller_time_local_stratum=defaults["controller_time_local_stratum"],
    )  # fmt: skip
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_the_controller_serves_its_own_clock_to_an_offline_lab():
    assert _chrony_server_conf(["192.168.50.0/24"], []) == [
        "allow 192.168.50.0/24",
        "local stratum 10",
    ]
    with_upstream = _chrony_server_conf(["192.168.50.0/24"], ["ntp.example.org"])
    assert with_upstream == ["server ntp.example.org iburst", "allow 192.168.50.0/24"]
