"""Link impairment: profiles, rules, the NFQUEUE holder, probes, and controller traffic kept clean.

Statistical checks use wide (99.9 %) binomial bounds so they do not flake; the 95 % figures
are for `testbed bench link`.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from statistics import median

import pytest
from conftest import require_root_netns

from testbed.core import stats
from testbed.core.errors import BadInputError, ImpairmentError, PrivilegeError
from testbed.labs import EmulatedLab, LabSetup, SystemRunner
from testbed.links import detect
from testbed.links.api import apply, apply_each, clear, current, verify
from testbed.links.detect import choose_backend
from testbed.links.nfqueue import (
    CHAIN_DOWN,
    CHAIN_UP,
    holder_tag,
    link_changes,
    plan_rules,
    release_counts,
    restore_text,
)
from testbed.links.probe import probe_link, probe_packets, send_budget_s, summarize
from testbed.links.tcnetem import TcNetemBackend, netem_args
from testbed.topo.profile import GilbertElliott, LinkProfile, ScheduleStep

# --- no root needed ------------------------------------------------------------------------


def test_profile_validation_names_the_field() -> None:
    with pytest.raises(BadInputError, match=r"loss\.random: .*less than or equal to 1"):
        LinkProfile.build("playbook.yaml", rtt_ms=85, loss=1.5)
    with pytest.raises(BadInputError, match=r"jitter_ms .* must not exceed"):
        LinkProfile.build("playbook.yaml", rtt_ms=10, jitter_ms=6)
    with pytest.raises(BadInputError, match=r"rttms: Extra inputs"):
        LinkProfile.build("playbook.yaml", rttms=10)


def test_loss_semantics() -> None:
    p = LinkProfile(rtt_ms=85, loss=0.1)
    assert p.up_loss == p.down_loss == 0.1
    assert p.round_trip_loss == pytest.approx(1 - 0.9**2)
    q = LinkProfile(loss=0.5, loss_down=0.0)
    assert (q.up_loss, q.down_loss, q.round_trip_loss) == (0.5, 0.0, 0.5)
    assert LinkProfile().is_null and not LinkProfile(rate_mbit=5).is_null


def test_binomial_interval() -> None:
    assert stats.binomial_interval(200, 0.0) == (0, 0)
    assert stats.binomial_interval(200, 1.0) == (200, 200)
    lo, hi = stats.binomial_interval(200, 0.1)
    assert lo < 20 < hi and 8 <= lo <= 13 and 27 <= hi <= 32
    assert stats.loss_within(20, 200, 0.1) and not stats.loss_within(60, 200, 0.1)
    assert not stats.loss_within(1, 200, 0.0) and stats.loss_within(0, 0, 0.5)
    assert stats.percentile([1, 2, 3, 4], 50) == 2.5
    assert stats.loss_runs([True, True, False, False, True]) == [2, 1]
    lo, hi = stats.rate_interval(5, 100)
    assert 0.01 < lo < 0.05 < hi < 0.12


def test_summarize_counts_each_direction() -> None:
    req = LinkProfile(rtt_ms=85, loss=0.5)
    # 10 sent, 6 reached the server, 3 of those came back
    res = summarize("dev1", req, 10, [0, 1, 2, 3, 4, 5], {0: 85.2, 1: 85.4, 2: 84.9})
    assert (res.received_by_server, res.received_back) == (6, 3)
    assert (res.loss_up.lost, res.loss_up.of) == (4, 10)
    assert (res.loss_down.lost, res.loss_down.of) == (3, 6)
    assert (res.loss_round_trip.lost, res.loss_round_trip.of) == (7, 10)
    assert res.rtt_error_ms is not None
    assert res.rtt_error_ms["median"] == pytest.approx(0.2)
    assert res.ok


def _dry_lab(tmp_path: Path, devices: int = 2) -> EmulatedLab:
    setup = LabSetup(name="bdry", devices=devices, subnet="10.79.209.0/24", state_dir=tmp_path)
    return EmulatedLab.up(setup, runner=SystemRunner(dry_run=True, echo=lambda _l: None))


def test_rules_match_only_the_device_server_path(tmp_path: Path) -> None:
    lab = _dry_lab(tmp_path)
    devices = list(enumerate(lab.devices, start=1))
    profiles = {"dev1": LinkProfile(rtt_ms=85, loss=0.1), "dev2": LinkProfile(rtt_ms=85, loss=1)}
    rules = plan_rules(lab.server, devices, profiles)
    server = lab.server.ip
    for r in rules:
        assert server in (r.src, r.dst)  # controller (10.79.209.254) never matches
    # one queue per direction of each device; loss is the holder's, not a kernel rule
    assert [(r.device, r.chain, r.queue) for r in rules] == [
        ("dev1", CHAIN_UP, 102),
        ("dev1", CHAIN_DOWN, 103),
        ("dev2", CHAIN_UP, 104),
        ("dev2", CHAIN_DOWN, 105),
    ]
    text = restore_text(rules)
    # down is queued where it enters the bridge (the server's port), not where it leaves: the
    # bridge clears a packet's arrival stamp when it forwards it
    assert "--physdev-out" not in text
    assert (
        f"-A {CHAIN_DOWN} -s {server}/32 -d 10.79.209.2/32 -m physdev --physdev-in "
        f"{lab.server.port} -j NFQUEUE --queue-num 103" in text
    )
    assert (
        f"-A {CHAIN_UP} -s 10.79.209.3/32 -d {server}/32 -m physdev --physdev-in p-dev2 "
        "-j NFQUEUE --queue-num 104" in text
    )
    assert "DROP" not in text and "statistic" not in text
    rate_only = plan_rules(lab.server, devices, {"dev1": LinkProfile(rate_mbit=5)})
    assert rate_only == []  # HTB alone limits the rate: nothing queued


def test_dry_run_apply_prints_rules_and_starts_nothing(tmp_path: Path) -> None:
    printed: list[str] = []
    lab = _dry_lab(tmp_path)
    runner = SystemRunner(dry_run=True, echo=printed.append)
    imp = apply(lab, LinkProfile(rtt_ms=85, loss=0.1), backend="nfqueue", runner=runner)
    assert imp.backend == "nfqueue"
    text = "\n".join(printed)
    assert "iptables-restore --wait=5 --noflush" in text
    assert "tb-holder --tag tb-bdry-holder --rt-prio 20 --log" in text
    assert not (tmp_path / "impairment.json").exists()


@pytest.mark.parametrize("kernel_has_netem", [True, False])
def test_auto_runs_a_link_with_a_schedule_in_the_packet_holder_whatever_the_kernel(
    tmp_path: Path, monkeypatch, kernel_has_netem: bool
) -> None:
    """netem has no schedules or traces: `auto` takes the holder for them on any kernel (and
    netem, where the kernel has it, for a steady link); `netem` asked for them is refused."""
    monkeypatch.setattr(detect, "netem_available", lambda runner=None: kernel_has_netem)
    lab = _dry_lab(tmp_path)
    runner = SystemRunner(dry_run=True, echo=lambda _l: None)
    steady = apply(lab, LinkProfile(rtt_ms=85), backend="auto", runner=runner)
    assert steady.backend == ("netem" if kernel_has_netem else "nfqueue")
    cut = LinkProfile(rtt_ms=85, schedule=(ScheduleStep(at_s=1, loss=1.0),))
    imp = apply_each(lab, {"dev1": LinkProfile(rtt_ms=85), "dev2": cut}, "auto", runner)
    assert imp.backend == "nfqueue" and "schedule" in imp.reason
    assert choose_backend("auto", probe=lambda: True, varies=True)[0] == "nfqueue"
    with pytest.raises(ImpairmentError, match="cannot run a schedule"):
        apply(lab, cut, backend="netem", runner=runner)


def test_netem_backend_commands(tmp_path: Path) -> None:
    lab = _dry_lab(tmp_path)
    runner = SystemRunner(dry_run=True, echo=lambda _l: None)
    TcNetemBackend(runner).apply(lab, {"dev2": LinkProfile(rtt_ms=85, jitter_ms=1, loss=0.1)})
    cmds = [a for a in runner.actions if " tc " in f" {a.split(' tb-bdry-sw ')[-1]} "]
    text = "\n".join(cmds)
    netem = "netem limit 100000 delay 42.5ms 1ms rate 10gbit loss random 10%"
    assert f"tc qdisc add dev p-dev2 parent 1:2 handle 2: {netem}" in text
    match = "u32 match ip src 10.79.209.1/32 flowid 1:2"
    assert f"tc filter add dev p-dev2 parent 1: protocol ip prio 1 {match}" in text
    assert "match ip src 10.79.209.3/32 match ip dst 10.79.209.1/32 flowid 1:102" in text
    assert "p-dev1" not in text.replace("tc qdisc del dev p-dev1 root", "")
    assert netem_args(LinkProfile(loss=1.0), "up") == [
        "netem",
        "limit",
        "100000",
        "loss",
        "random",
        "100%",
    ]


# --- root: a real lab ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    require_root_netns()
    setup = LabSetup(
        name="bnet", devices=2, subnet="10.79.202.0/24", state_dir=tmp_path_factory.mktemp("bnet")
    )
    with EmulatedLab.running(setup) as running:
        yield running


@pytest.fixture
def clean_links(lab: EmulatedLab):
    yield lab
    clear(lab)


def _bound(figure, level: float = 0.999) -> bool:
    """Measured loss inside a wide binomial interval around the requested rate."""
    return stats.loss_within(figure.lost, figure.of, figure.requested, level)


def test_a_probe_sender_behind_a_slow_rate_limit_gets_the_time_the_limit_needs() -> None:
    """200 datagrams of 1,200 bytes (1,242 on the wire) at 0.05 Mbit/s need 39.7 s; without a
    limit, or at a limit faster than the sending, the sending time rules."""
    slow = send_budget_s(LinkProfile(rtt_ms=10, rate_mbit=0.05), 200, 0.0, 1200, 1.0)
    assert slow == pytest.approx(200 * 1242 * 8 / 0.05e6 + 1 + 30)
    assert send_budget_s(LinkProfile(rtt_ms=10), 200, 5.0, 64, 1.0) == pytest.approx(1 + 1 + 30)
    fast = LinkProfile(rtt_ms=10, rate_mbit=100)
    assert send_budget_s(fast, 200, 5.0, 64, 1.0) == pytest.approx(1 + 1 + 30)


def test_probe_responder_reports_each_echos_send_lag_and_both_ends_their_send_times() -> None:
    """On loopback: the responder tells, per measurement echo, how long the echo took to leave
    after the turnaround it carries was taken (the caller subtracts it from the RTT), and when
    it left; the sender when each datagram left (monotonic ns: the legs a stall can meet)."""
    import json
    import signal
    import subprocess
    import time

    from testbed.links.probe import PROBE_MODULE

    PROBE = [sys.executable, *PROBE_MODULE]

    port = 47990
    echo = subprocess.Popen(
        [*PROBE, "echo", "--bind", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        sent = subprocess.run(
            [*PROBE, "send", "--dst", "127.0.0.1", "--port", str(port),
             "--count", "50", "--interval-ms", "2", "--warmup-min-s", "0", "--warmup-max-s", "0.1"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
    finally:
        echo.send_signal(signal.SIGTERM)
        out, _ = echo.communicate(timeout=10)
    told = json.loads(out.strip().splitlines()[-1])
    assert told["received"] == list(range(50))
    lags = {int(k): v for k, v in told["send_lag_ns"].items()}
    assert sorted(lags) == list(range(50))
    assert all(0 <= v < 50_000_000 for v in lags.values()), lags
    result = json.loads(sent.stdout)
    assert len(result["rtt_ms"]) == 50
    went = {int(k): v for k, v in result["sent_ns"].items()}
    back = {int(k): v for k, v in told["sent_ns"].items()}
    assert sorted(went) == sorted(back) == list(range(50))
    now = time.monotonic_ns()
    for seq in range(50):  # on one clock: each echo left after its datagram, in order
        assert 0 < back[seq] - went[seq] < 1e9
        assert now - 60e9 < went[seq] < back[seq] < now
    assert all(back[s] < back[s + 1] for s in range(49))
    assert all(went[s] < went[s + 1] for s in range(49))
    assert 50e6 < went[49] - went[0] < 10e9  # sent every 2 ms: 98 ms from first to last


def test_probe_moves_kernel_wall_clock_stamps_to_the_monotonic_clock() -> None:
    """Differences are taken on the monotonic clock, so a stepped wall clock does not count."""
    import struct
    import time

    from agents.link_probe import SO_TIMESTAMPNS, _recv_time

    wall = time.time_ns() - 2_000_000  # the kernel stamped it 2 ms ago, on the wall clock
    anc = [(socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("qq", *divmod(wall, 1_000_000_000)))]
    read_at = time.monotonic_ns()
    got, mono_now = _recv_time(anc, read_at, None), time.monotonic_ns()
    assert 1_000_000 < mono_now - got < 50_000_000  # about 2 ms before now, monotonic
    assert _recv_time([], read_at, None) == read_at  # none: when it was read, monotonic too


def test_probe_takes_the_holders_release_stamp_after_an_ingress_hold() -> None:
    """Held after the kernel stamped it, a datagram's receive time is the holder's release
    stamp, never the kernel's (before the hold); one without is timed when it was read."""
    import struct
    import time

    from agents.link_probe import SO_TIMESTAMPNS, _recv_time

    wall = time.time_ns() - 40_000_000  # arrival, before a 40 ms hold
    anc = [(socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("qq", *divmod(wall, 1_000_000_000)))]
    read_at = time.monotonic_ns()
    released = read_at - 100_000
    assert _recv_time(anc, read_at, released) == released
    assert _recv_time(anc, read_at, 0) == read_at


def test_unimpaired_link_is_fast(lab: EmulatedLab) -> None:
    res = probe_link(lab, "dev1", count=50, interval_ms=5)
    assert res.received_back == 50 and res.rtt_ms is not None and res.rtt_ms.p50 < 5


def test_85ms_rtt_without_loss(clean_links: EmulatedLab) -> None:
    lab = clean_links
    imp = apply(lab, LinkProfile(rtt_ms=85))
    assert imp.backend in ("netem", "nfqueue") and set(imp.profiles) == {"dev1", "dev2"}
    if imp.backend == "nfqueue":
        assert imp.holder == "c"
    res = probe_link(lab, "dev1", count=200, interval_ms=5)
    assert res.received_back == 200
    assert abs(res.rtt_ms.p50 - 85) <= 1.0, res.rtt_ms
    assert current(lab) is not None and current(lab).profiles["dev1"].rtt_ms == 85


def test_loss_is_per_direction(clean_links: EmulatedLab) -> None:
    lab = clean_links
    apply(lab, LinkProfile(rtt_ms=20, loss=0.2))
    res = probe_link(lab, "dev2", count=400, interval_ms=3)
    assert _bound(res.loss_up) and _bound(res.loss_down) and _bound(res.loss_round_trip)
    assert 0 < res.loss_round_trip.lost < 400
    assert abs(res.rtt_ms.p50 - 20) <= 1.0


def test_one_device_only(clean_links: EmulatedLab) -> None:
    lab = clean_links
    apply(lab, LinkProfile(rtt_ms=40), devices=["dev2"])
    fast = probe_link(lab, "dev1", count=40, interval_ms=5)
    slow = probe_link(lab, "dev2", count=40, interval_ms=5)
    assert fast.rtt_ms.p50 < 5 and abs(slow.rtt_ms.p50 - 40) <= 1.0
    assert set(current(lab).profiles) == {"dev2"}


def test_full_loss_keeps_controller_ssh(clean_links: EmulatedLab) -> None:
    from testbed.hosts import HostControl

    lab = clean_links
    apply(lab, LinkProfile(rtt_ms=85, loss=1.0))
    res = probe_link(lab, "dev1", count=50, interval_ms=5)
    assert res.received_by_server == 0 and res.received_back == 0
    with HostControl(lab.inventory()) as hc:
        out = hc.run_all("echo alive", hosts=["server", "dev1", "dev2"])
        assert all(r.stdout.strip() == "alive" for r in out.values())
        # and the device really cannot reach the server's sshd, while the controller can
        connect = f"import socket; socket.create_connection(('{lab.server.ip}', 22), 2)"
        blocked = hc.run("dev1", f'{sys.executable} -c "{connect}"', check=False)
        assert not blocked.ok and "timed out" in blocked.stderr
    socket.create_connection((lab.server.ip, 22), 2).close()


def test_verify_refuses_a_dead_holder(clean_links: EmulatedLab) -> None:
    import os
    import signal

    lab = clean_links
    imp = apply(lab, LinkProfile(rtt_ms=30))
    if imp.backend != "nfqueue":
        pytest.skip("holder only exists with the nfqueue backend")
    assert verify(lab) == imp  # in place: no error
    os.kill(imp.backend_state["holder_pid"], signal.SIGKILL)
    with pytest.raises(ImpairmentError, match="not running|no holder bound"):
        for _ in range(50):  # until the kernel has noticed
            verify(lab)
    # and with the holder gone, packets are dropped, not passed unimpaired
    res = probe_link(lab, "dev1", count=20, interval_ms=5)
    assert res.received_back == 0


def test_clear_removes_rules_and_holder(lab: EmulatedLab) -> None:
    from testbed.labs.discover import tagged_processes

    apply(lab, LinkProfile(rtt_ms=30, loss=0.1))
    clear(lab)
    assert current(lab) is None
    saved = subprocess.run(
        ["ip", "netns", "exec", lab.bridge_netns, "iptables-save", "-t", "mangle"],
        capture_output=True,
        text=True,
    ).stdout
    assert f"-A {CHAIN_UP} " not in saved and f"-A {CHAIN_DOWN} " not in saved
    assert tagged_processes(holder_tag(lab.name)) == []
    res = probe_link(lab, "dev2", count=30, interval_ms=5)
    assert res.received_back == 30 and res.rtt_ms.p50 < 5


def test_unknown_device_is_refused(lab: EmulatedLab) -> None:
    with pytest.raises(ImpairmentError, match="no device"):
        apply(lab, LinkProfile(rtt_ms=10), devices=["dev9"])
    assert current(lab) is None


def _tc_classes(lab: EmulatedLab, port: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", lab.bridge_netns, "tc", "class", "show", "dev", port],
        capture_output=True,
        text=True,
    ).stdout


def test_rate_limit_classes_follow_the_profile(clean_links: EmulatedLab) -> None:
    lab = clean_links
    apply(lab, LinkProfile(rtt_ms=10, rate_mbit=20), devices=["dev1"])
    assert "rate 20Mbit" in _tc_classes(lab, "p-dev1")  # server -> dev1
    assert "rate 20Mbit" in _tc_classes(lab, "p-server")  # dev1 -> server
    assert _tc_classes(lab, "p-dev2") == ""
    apply(lab, LinkProfile(rtt_ms=10), devices=["dev1"])  # rate dropped: shaping removed
    assert _tc_classes(lab, "p-dev1") == "" and _tc_classes(lab, "p-server") == ""


def test_jitter_spreads_rtt_without_reordering(clean_links: EmulatedLab) -> None:
    lab = clean_links
    # the holder's promise (netem reorders when jitter exceeds the spacing), on every kernel
    apply(lab, LinkProfile(rtt_ms=40, jitter_ms=4, seed=7), devices=["dev1"], backend="nfqueue")
    # 1 ms spacing, 4 ms jitter: an independent draw per packet would reorder most of them
    raw = probe_packets(lab, "dev1", count=300, interval_ms=1)
    clear(lab)  # the holder stops and counts how late it released
    assert raw.at_server == sorted(raw.at_server) and len(raw.at_server) == 300
    assert list(raw.rtt_ms) == sorted(raw.rtt_ms) and len(raw.rtt_ms) == 300
    rtts = list(raw.rtt_ms.values())
    assert max(rtts) - min(rtts) > 2.0  # spread by the jitter
    # within +-j each way (+ FIFO wait), + however late the holder says it released (a VM
    # pause of both its CPUs; none otherwise)
    late_ms = sum(c.latest_ms for c in release_counts(lab) if c.link == "dev1")
    assert min(rtts) >= 32 - 0.5 and max(rtts) <= 48 + 5.0 + late_ms, late_ms


def test_each_releaser_alone_keeps_order_and_delay_and_says_who_released(lab: EmulatedLab) -> None:
    """The holder's two releasers, each alone: the backup (which otherwise reads and releases
    only what the main thread left waiting) and the main thread."""
    import os

    from testbed.links.holder_process import flags_for_holders

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the backup releaser needs a second CPU")
    for flags, backup_share in ((("--backup-only",), 1.0), (("--no-backup",), 0.0)):
        clear(lab)  # the next apply starts a holder with these flags
        with flags_for_holders(flags):
            apply(lab, LinkProfile(rtt_ms=40, jitter_ms=4, seed=7), ["dev1"], backend="nfqueue")
        raw = probe_packets(lab, "dev1", count=300, interval_ms=1)
        clear(lab)
        assert list(raw.rtt_ms) == sorted(raw.rtt_ms) and len(raw.rtt_ms) == 300, flags
        rtts = list(raw.rtt_ms.values())
        counts = [c for c in release_counts(lab) if c.link == "dev1"]
        assert sorted(c.direction for c in counts) == ["down", "up"], counts
        # within +-j each way (+ FIFO wait, + the backup's 0.2 ms grace each way), + however
        # late the releaser alone says it released (a VM pause of its one CPU; none otherwise)
        late_ms = sum(c.latest_ms for c in counts)
        assert min(rtts) >= 32 - 0.5 and max(rtts) <= 48 + 5.0 + late_ms, (flags, late_ms)
        assert all(c.released >= 300 for c in counts)
        assert all(c.by_backup == round(backup_share * c.released) for c in counts), counts
        # alone, the backup also reads every packet (as it does when the main thread's CPU is
        # taken), and the order and delays above come through its reading too
        assert all(c.read_by_backup == round(backup_share * c.released) for c in counts), counts


def test_holder_holds_both_directions_from_their_kernel_arrival_time(lab: EmulatedLab) -> None:
    """Each packet's hold counts from the kernel's arrival stamp in both directions; a packet
    queued where the bridge has cleared it (down, at POSTROUTING) was held from when the holder
    read it, so every stall of the holder's reading added to its delay."""

    clear(lab)
    apply(lab, LinkProfile(rtt_ms=20), ["dev1"], backend="nfqueue")
    raw = probe_packets(lab, "dev1", count=200, interval_ms=2)
    clear(lab)
    assert len(raw.rtt_ms) == 200
    counts = [c for c in release_counts(lab) if c.link == "dev1"]
    assert sorted(c.direction for c in counts) == ["down", "up"], counts
    assert all(c.released >= 200 and c.unstamped == 0 for c in counts), counts


def test_a_stopped_holder_is_held_up_and_the_round_trips_it_delayed_are_told_apart(
    lab: EmulatedLab,
) -> None:
    """Stopping the holder for 30 ms (SIGSTOP, as a hypervisor pausing the VM would) is one
    held-up spell covering the stop, and every round trip with a leg due in the stop is left
    out of the untouched p99, while most of the others are kept."""
    import os
    import signal
    import threading
    import time
    from dataclasses import replace

    from testbed.bench.link import LinkBench
    from testbed.links.calibrate import analyse
    from testbed.links.nfqueue import held_up, site_holder

    clear(lab)
    prof = LinkProfile(rtt_ms=20)
    imp = apply(lab, prof, ["dev1"], backend="nfqueue")
    pid = site_holder(lab, lab.runner).pid()
    assert pid is not None
    got: list = []
    probe = threading.Thread(
        target=lambda: got.append(probe_packets(lab, "dev1", count=400, interval_ms=2))
    )
    probe.start()
    time.sleep(0.6)  # warm-up (about 0.2 s), then well inside the 0.8 s of probing
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic_ns()
    time.sleep(0.03)
    resumed = time.monotonic_ns()
    os.kill(pid, signal.SIGCONT)
    probe.join()
    clear(lab)
    spells = [h for h in held_up(lab) if h.generation == imp.backend_state["holder_generation"]]
    covering = [
        (a, b) for h in spells for a, b in h.windows if a <= stopped + 5e6 and b >= resumed - 1e6
    ]
    assert covering, (stopped, resumed, spells)
    row = analyse("stopped", "nfqueue", prof, got[0])
    row.holder_generation = imp.backend_state["holder_generation"]
    legs = row.echo_legs
    due = 10_000_000  # one way
    hit = [
        leg for leg in legs
        if any(stopped + 1e6 < t + due < resumed - 1e6 for t in leg[:2])
    ]  # fmt: skip
    assert len(hit) >= 10 and all(err > 1.0 for *_, err in hit), hit  # released after the stop
    # the stop's spell alone (on a busy VM other spells leave out more round trips)
    stop_only = [
        replace(h, spells=len(ws), windows=ws)
        for h in spells
        for ws in [tuple(w for w in h.windows if w in covering)]
    ]
    kept = LinkBench(20, 1, [row], spells=stop_only).untouched_errors(row)
    assert kept is not None
    assert len(kept) <= len(legs) - len(hit)
    assert len(kept) >= 0.7 * len(legs), (len(kept), len(legs))


def test_gilbert_elliott_loss_comes_in_bursts(clean_links: EmulatedLab) -> None:
    lab = clean_links
    ge = GilbertElliott(p=0.05, r=0.25)  # mean loss 1/6, mean burst 4 packets
    prof = LinkProfile(rtt_ms=2, loss_up=ge, loss_down=0.0, seed=3)
    apply(lab, prof, devices=["dev1"], backend="nfqueue")
    raw = probe_packets(lab, "dev1", count=3000, interval_ms=0.5)
    got = set(raw.at_server)
    lost = [seq not in got for seq in range(raw.sent)]
    runs = stats.loss_runs(lost)
    # wide bounds (about 4 sigma at 3000 packets): the model, not independent loss
    assert 0.11 < sum(lost) / raw.sent < 0.23, sum(lost)
    assert 3.0 < sum(runs) / len(runs) < 5.3, sum(runs) / len(runs)  # random loss: about 1.2
    assert len(raw.rtt_ms) == len(got)  # nothing lost on the way down


def test_schedule_steps_apply_at_their_times(clean_links: EmulatedLab) -> None:
    lab = clean_links
    steps = [ScheduleStep(at_s=1.0, loss=1.0), ScheduleStep(at_s=2.0, loss=0.0, rtt_ms=20)]
    imp = apply(lab, LinkProfile(rtt_ms=10, schedule=steps), devices=["dev2"], backend="nfqueue")
    raw = probe_packets(lab, "dev2", count=300, interval_ms=10)  # about 3 s, from ~0.2 s on
    changes = link_changes(lab)
    mine = [c for c in changes if c["link"] == "dev2" and c["direction"] == "up"][-3:]
    assert [c["phase"] for c in mine] == [0, 1, 2]
    assert [c["1-k"] for c in mine] == [0, 1, 0] and mine[2]["delay_us"] == 10_000
    t0 = mine[0]["at"]
    assert abs(mine[1]["at"] - t0 - 1.0) < 0.05 and abs(mine[2]["at"] - t0 - 2.0) < 0.05
    assert imp.applied_at == pytest.approx(t0, abs=1.0)
    # packets are 10 ms apart: one unbroken second of 100 % loss, nothing lost outside it
    got = set(raw.at_server)
    first_lost, last_lost = min(set(range(300)) - got), max(set(range(300)) - got)
    outage = (last_lost - first_lost) * 0.01
    assert 0.9 < outage < 1.1, outage
    assert len(got) == 300 - (last_lost - first_lost + 1)
    after = [raw.rtt_ms[s] for s in raw.rtt_ms if s > last_lost + 10]
    before = [raw.rtt_ms[s] for s in raw.rtt_ms if s < first_lost - 10]
    # each phase's delay, and no packet after the change with the old one (the holder may
    # release up to 1 ms early per direction after waking late on a loaded machine)
    assert after and before and min(after) > 15
    assert abs(median(before) - 10) < 1 and abs(median(after) - 20) < 1


def test_profile_changes_live_without_restarting_the_holder(clean_links: EmulatedLab) -> None:
    lab = clean_links
    later = LinkProfile(rtt_ms=20, schedule=(ScheduleStep(at_s=30, loss=1.0),))
    apply(lab, later, devices=["dev2"], backend="nfqueue")
    first = apply(lab, LinkProfile(rtt_ms=30), devices=["dev1"], backend="nfqueue")
    second = apply(lab, LinkProfile(rtt_ms=60), devices=["dev1"], backend="nfqueue")
    assert first.backend_state["holder_pid"] == second.backend_state["holder_pid"]
    res = probe_link(lab, "dev1", count=40, interval_ms=5)
    assert abs(res.rtt_ms.p50 - 60) <= 1.0
    # each change is logged for the link it changed; dev2's schedule kept its clock
    log = [(c["generation"], c["link"], c["delay_us"]) for c in link_changes(lab)]
    gens = sorted({g for g, _, _ in log})[-3:]
    assert [x for x in log if x[0] in gens and x[1] == "dev1"] == [
        (gens[1], "dev1", 15_000),
        (gens[1], "dev1", 15_000),
        (gens[2], "dev1", 30_000),
        (gens[2], "dev1", 30_000),
    ]
    assert [x for x in log if x[0] in gens and x[1] == "dev2"] == [(gens[0], "dev2", 10_000)] * 2


def test_calibrate_measures_rate_limit_and_counts_both_sides(lab: EmulatedLab) -> None:
    from testbed.links.calibrate import calibrate

    profiles = {"r5": LinkProfile(rtt_ms=10, rate_mbit=5), "l20": LinkProfile(rtt_ms=10, loss=0.2)}
    rows = calibrate(lab, profiles, ["dev2"], count=300, interval_ms=2, parallel=1)
    assert [(r.profile, r.device, r.backend) for r in rows] == [
        ("r5", "dev2", rows[0].backend),
        ("l20", "dev2", rows[0].backend),
    ]
    rate, lossy = rows
    # UDP payload of 1200-byte datagrams on a 5 Mbit/s link: 1200/1242 of it, not more
    assert rate.throughput_mbit is not None and 4.0 < rate.throughput_mbit <= 5.0
    assert abs(rate.rtt_p50_ms - 10) < 1.0 and rate.loss_up.lost == 0
    assert lossy.loss_down.of == 300 - lossy.loss_up.lost  # down counted on what got up
    assert _bound(lossy.loss_up) and _bound(lossy.loss_down)
    assert current(lab) is None  # calibrate clears what it applied


def test_holder_needs_a_compiler(tmp_path: Path, monkeypatch) -> None:
    from testbed.links import holder_build

    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))  # nothing compiled there yet
    monkeypatch.setattr(holder_build.shutil, "which", lambda _name: None)
    with pytest.raises(PrivilegeError, match="no C compiler"):
        holder_build.find_holder()
