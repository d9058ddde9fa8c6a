"""The holder's model and what the link check expects from it (no root needed): jitter laws,
the ordering policy, each probe packet judged against the profile in force when it was sent,
tolerance from the sample size, traces read relative to the playbook and refused with file, row
and column, and captures read back with scapy."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from testbed.core.errors import ImpairmentError
from testbed.links.expect import LinkClock, fit_probe
from testbed.links.holder_process import parse_clocks
from testbed.links.model import Leg, hold, round_trips, standard_jitter
from testbed.links.probe import summarize
from testbed.runner.link_guard import check_links
from testbed.topo.profile import LinkProfile, ScheduleStep

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]


@pytest.mark.parametrize("dist", ["uniform", "normal", "pareto", "paretonormal"])
def test_jitter_laws_have_the_spread_netem_names(dist: str) -> None:
    x = standard_jitter(np.random.default_rng(1), dist, (400_000,))  # type: ignore[arg-type]
    assert abs(x.mean()) < 0.01
    if dist == "uniform":  # [-j, +j]: sigma j / sqrt(3)
        assert x.min() >= -1 and x.max() <= 1 and x.std() == pytest.approx(1 / math.sqrt(3), 0.01)
    else:
        assert x.std() == pytest.approx(1, abs=0.03)
    if dist == "pareto":  # Pareto(3): median 2^(1/3), mean 3/2, sigma sqrt(3)/2
        assert np.median(x) == pytest.approx((2 ** (1 / 3) - 1.5) / (math.sqrt(3) / 2), abs=0.01)
        assert x.min() >= -1.5 / (math.sqrt(3) / 2)


def _leg(n: int, spacing_ms: float, jitter_ms: float, loss: float = 0.0) -> Leg:
    ones = np.ones(n)
    return Leg(np.arange(n) * spacing_ms, 40 * ones, jitter_ms * ones, loss * ones)


def test_keeping_order_holds_packets_for_their_predecessor_and_reorder_does_not() -> None:
    leg = _leg(2000, 1.0, 6.0)
    kept = hold(np.random.default_rng(2), leg, "uniform", "keep", 50)
    passed = hold(np.random.default_rng(2), leg, "uniform", "reorder", 50)
    # the same draws: kept in order none leaves before the one before it, and none earlier
    # than it would alone; let pass, delays are the drawn ones (mean 40 ms)
    assert (np.diff(kept, axis=1) >= 0).all() and (kept >= passed).all()
    assert (np.diff(passed, axis=1) < 0).any()
    delays_kept, delays_passed = kept - leg.at_ms, passed - leg.at_ms
    assert np.mean(delays_passed) == pytest.approx(40, abs=0.05)
    assert np.median(delays_kept) > 42  # jitter of 6 ms against 1 ms spacing: upward
    # spaced wider than the jitter's whole range, keeping order changes nothing
    wide = _leg(200, 13.0, 6.0)
    assert np.array_equal(
        hold(np.random.default_rng(3), wide, "uniform", "keep", 20),
        hold(np.random.default_rng(3), wide, "uniform", "reorder", 20),
    )


def test_lost_packets_hold_nothing_up() -> None:
    everything_lost = hold(np.random.default_rng(4), _leg(100, 1.0, 6.0, loss=1.0), "normal",
                           "keep", 10)  # fmt: skip
    assert np.isnan(everything_lost).all()
    rtts = round_trips(5, _leg(300, 1.0, 0.0, loss=0.5), _leg(300, 1.0, 0.0), "uniform", "keep")
    back = rtts[~np.isnan(rtts)]
    assert 0.4 < len(back) / rtts.size < 0.6 and np.allclose(back, 80)


def _probe(rtts: list[float], spacing_ms: float = 10.0, t0_ns: int = 5_000_000_000):
    """A probe's raw figures: packet i sent at t0 + i spacing, every echo back."""
    n = len(rtts)
    sent_ns = {i: t0_ns + round(i * spacing_ms * 1e6) for i in range(n)}
    echo_ns = {i: sent_ns[i] + round(rtts[i] / 2 * 1e6) for i in range(n)}
    return n, list(range(n)), dict(enumerate(rtts)), sent_ns, echo_ns


def test_a_schedule_step_met_mid_probe_is_expected_packet_by_packet() -> None:
    prof = LinkProfile(rtt_ms=85, schedule=(ScheduleStep(at_s=1.0, rtt_ms=140),), seed=1)
    clock = LinkClock(4_500_000_000, 4_500_000_000)  # applied 0.5 s before the first packet
    followed = [85.02] * 50 + [140.01] * 150  # the step at packet 50, as the holder applies it
    n, at, back, sent, echoed = _probe(followed)
    res = {"dev1": summarize("dev1", prof, n, at, back, 0.1, None, None, sent, echoed, clock)}
    check_links(res, 1.0)
    windows = res["dev1"].fit.windows  # type: ignore[union-attr]
    assert [(w.at_s, w.sent, w.rtt_measured_p50_ms) for w in windows] == [
        (0.0, 50, 85.02),
        (1.0, 150, 140.01),
    ]
    assert res["dev1"].rtt_error_ms["median"] == pytest.approx(0.01)  # type: ignore[index]
    # a link that never took the step fails, naming what the model expected
    n, at, back, sent, echoed = _probe([85.02] * 200)
    ignored = {"dev1": summarize("dev1", prof, n, at, back, 0.1, None, None, sent, echoed, clock)}
    with pytest.raises(ImpairmentError, match=r"median RTT 85\.02 ms, expected 140\.00 ms"):
        check_links(ignored, 1.0)
    # the same packets judged as if the probe had begun when the link was applied: the step
    # lands at packet 100, and a link that took it at packet 50 no longer measures as asked
    late = {"dev1": summarize("dev1", prof, n, at, dict(enumerate(followed)), 0.1, None, None,
                              sent, echoed, LinkClock(5_000_000_000, 5_000_000_000))}  # fmt: skip
    assert late["dev1"].fit.windows[1].sent == 100  # type: ignore[union-attr]


def test_jitter_is_judged_by_the_model_s_quantiles_with_a_band_from_the_sample_size() -> None:
    prof = LinkProfile(rtt_ms=95, jitter_ms=6, jitter_dist="pareto", seed=2)
    n = 300
    up = Leg(np.arange(n) * 10.0, 47.5 * np.ones(n), 6 * np.ones(n), np.zeros(n))
    model = round_trips(9, up, up, "pareto", "keep", 1)[0]
    _, at, back, sent, echoed = _probe(list(model))
    drawn = {"dev1": summarize("dev1", prof, n, at, back, 0.1, None, None, sent, echoed)}
    check_links(drawn, 1.0)  # RTTs drawn from the model itself pass
    fit = drawn["dev1"].fit
    assert fit is not None and fit.expected is not None
    assert fit.expected.p50 < 94.5  # pareto: the median lies below the mean asked for
    # the same link with its jitter gone: median near enough, but p10 and p90 are not
    flat = {"dev1": summarize("dev1", prof, n, at, dict.fromkeys(range(n), fit.expected.p50), 0.1,
                              None, None, sent, echoed)}  # fmt: skip
    with pytest.raises(ImpairmentError, match=r"p10 RTT .* p90 RTT"):
        check_links(flat, 1.0)
    # fewer echoes, a wider band
    few = fit_probe(prof, 40, list(range(40)), dict(list(back.items())[:40]), sent, echoed)
    width = {k: hi - lo for k, (lo, hi) in fit.accept.items()}
    assert all(few.accept[k][1] - few.accept[k][0] > width[k] for k in width)


def test_probes_in_emulated_time_scale_the_model_too() -> None:
    prof = LinkProfile(rtt_ms=170, jitter_ms=4, seed=3)
    n, at, back, sent, echoed = _probe([170.0 + (i % 7) - 3 for i in range(100)])
    res = summarize("dev1", prof, n, at, back, 0.1, None, None, sent, echoed)
    shown = res.in_emulated_time(2.0, LinkProfile(rtt_ms=85, jitter_ms=2, seed=3))
    assert shown.fit is not None and res.fit is not None and shown.fit.expected is not None
    assert shown.fit.expected.p50 == pytest.approx(res.fit.expected.p50 / 2)  # type: ignore[union-attr]
    assert shown.fit.accept["p50"][0] == pytest.approx(res.fit.accept["p50"][0] / 2)


def test_holder_clocks_are_read_per_link_and_direction() -> None:
    text = "104 dev1 up 123\n105 dev1 down 124\n120 dev1/backup up 9\nnonsense\n"
    assert parse_clocks(text) == {"dev1": {"up": 123, "down": 124}, "dev1/backup": {"up": 9}}


def _playbook(folder: Path, link: str, extra: str = "") -> Path:
    path = folder / "pb.yaml"
    path.write_text(f"name: t\nlab: {{devices: 2}}\nlink: {link}\n{extra}")
    return path


def test_a_trace_is_read_relative_to_its_playbook_wherever_it_runs(tmp_path: Path) -> None:
    from testbed.config.playbook import expand, load_playbook

    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.csv").write_text("t_s,rtt_ms,loss\n0,40,0\n1,60,0.1\n")
    pb = _playbook(tmp_path, "{trace: traces/t.csv}",
                   "sweep:\n  link:\n    - {trace: traces/t.csv, seed: 2}\n")  # fmt: skip
    other = tmp_path / "elsewhere"
    other.mkdir()
    loaded = subprocess.run([*TESTBED, "validate", str(pb)], cwd=other, capture_output=True,
                            text=True)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    book = load_playbook(pb)
    assert book.link.trace == tmp_path / "traces" / "t.csv"
    (cond,) = list(expand(book))
    assert cond.playbook.link.trace == tmp_path / "traces" / "t.csv"


@pytest.mark.parametrize(
    ("rows", "where"),
    [
        ("t_s,rtt_ms,loss\n0,40,0\n1,40,7\n", "row 3, column 3 (loss)"),
        ("t_s,rtt_ms,loss\n0,40,0\n1,forty,0\n", "row 3, column 2 (rtt_ms)"),
        ("t_s,rtt_ms,loss\n0,40,0\n0,40,0\n", "row 3, column 1 (t_s)"),
    ],
)
@pytest.mark.parametrize("swept", [False, True])
def test_a_malformed_trace_is_refused_naming_file_row_and_column(
    tmp_path: Path, rows: str, where: str, swept: bool
) -> None:
    from testbed.config.playbook import load_playbook
    from testbed.core.errors import BadInputError

    (tmp_path / "bad.csv").write_text(rows)
    link, sweep = ("{rtt_ms: 40}", "sweep:\n  link.trace: [bad.csv]\n") if swept else (
        "{trace: bad.csv}", "")  # fmt: skip
    with pytest.raises(BadInputError) as err:
        load_playbook(_playbook(tmp_path, link, sweep))
    assert f"{tmp_path / 'bad.csv'} {where}" in str(err.value)


def test_testbed_validate_refuses_a_malformed_trace(tmp_path: Path) -> None:
    (tmp_path / "bad.csv").write_text("# a trace\nt_s,rtt_ms,loss\n0,40,0\n1,40,7\n")
    res = subprocess.run([*TESTBED, "validate", str(_playbook(tmp_path, "{trace: bad.csv}"))],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode != 0, res.stdout
    assert f"{tmp_path / 'bad.csv'} row 4, column 3 (loss)" in res.stderr, res.stderr


def test_captures_are_read_back_per_packet_with_scapy(tmp_path: Path) -> None:
    """pcaps written as a bridge port would see them: losses, one reordered pair, delays."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    from testbed.links.capture import PROBE_HEADER, leg_figures, read_legs

    dev_ip, srv_ip = "10.0.0.2", "10.0.0.1"

    def datagram(src: str, dst: str, seq: int, at: float):
        body = PROBE_HEADER.pack(b"tbRX", 0, b"M", seq) + b"\0" * 16
        pkt = Ether() / IP(src=src, dst=dst) / UDP(sport=4000, dport=47000) / body
        pkt.time = at
        return pkt

    up_lost, t0 = {3, 4, 5, 9}, 1000.0
    leave = {s: t0 + s * 0.01 + 0.040 for s in range(20) if s not in up_lost}
    leave[7], leave[8] = leave[8] + 0.001, leave[7]  # 8 leaves before 7
    dev_port = [datagram(dev_ip, srv_ip, s, t0 + s * 0.01) for s in range(20)]
    srv_port = [datagram(dev_ip, srv_ip, s, t) for s, t in leave.items()]
    wrpcap(str(tmp_path / "dev.pcap"), dev_port)
    wrpcap(str(tmp_path / "srv.pcap"), srv_port)
    legs = read_legs(tmp_path / "dev.pcap", tmp_path / "srv.pcap", dev_ip, srv_ip)
    assert set(legs["up"]) == set(range(20)) and legs["down"] == {}
    prof = LinkProfile(rtt_ms=80, loss_up={"p": 0.1, "r": 0.4})
    up = leg_figures("up", legs["up"], prof, t0)
    assert (up.entered, up.left, up.reordered_measured, up.reordered_expected) == (20, 16, 1, 0)
    assert up.bursts.runs == 2 and up.bursts.mean_measured == 2.0  # runs 3-5 and 9
    assert up.bursts.mean_model == pytest.approx(2.5)  # 1 / r
    assert up.delay_measured is not None and up.delay_measured.p50 == pytest.approx(40, abs=0.01)
    assert up.delay_expected is not None and up.delay_expected.p50 == pytest.approx(40)
