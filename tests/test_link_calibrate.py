"""Calibration figures from packet sequences, and the fidelity benchmark's loss verdicts."""

from __future__ import annotations

import pytest

from testbed.bench.link import LinkBench
from testbed.links.calibrate import Calibration, analyse
from testbed.links.probe import RawProbe
from testbed.topo.profile import GilbertElliott, LinkProfile


def _raw(at_server: list[int], echoed: dict[int, float], sent: int = 10) -> RawProbe:
    return RawProbe(device="dev1", sent=sent, at_server=at_server, rtt_ms=echoed, warmup_s=0.1)


def test_analyse_counts_each_side_of_the_hop() -> None:
    # 10 sent; 3 and 4 never reached the server; 9 reached it but its echo did not come back
    raw = _raw([0, 1, 2, 5, 6, 7, 8, 9], {s: 85.0 + 0.1 * s for s in (0, 1, 2, 5, 6, 7, 8)})
    cal = analyse("p", "nfqueue/c", LinkProfile(rtt_ms=85, loss=0.2), raw)
    assert (cal.loss_up.lost, cal.loss_up.of) == (2, 10)
    assert (cal.loss_down.lost, cal.loss_down.of) == (1, 8)
    assert cal.loss_up.within is True and cal.ok
    assert cal.rtt_p50_ms == pytest.approx(85.5)
    assert cal.rtt_error_p50_ms == pytest.approx(0.5)
    assert cal.jitter_ipdv_ms == pytest.approx((0.1 + 0.3 + 0.1 + 0.1 + 0.1 + 0.1) / 6)
    lo, hi = cal.loss_up.rate_ci95
    assert lo < 0.2 < hi
    assert cal.bursts_up is None  # random loss: no burst model


def test_analyse_flags_loss_outside_the_request() -> None:
    raw = _raw(list(range(10)), {s: 85.0 for s in range(10)}, sent=10)
    cal = analyse("p", "nfqueue/c", LinkProfile(rtt_ms=85, loss=0.9), raw)
    assert cal.loss_up.within is False and not cal.ok


def test_gilbert_elliott_is_judged_by_its_bursts_not_a_binomial() -> None:
    ge = GilbertElliott(p=0.1, r=0.5)
    lost = {2, 3, 4, 10, 11}  # bursts of 3 and 2
    at = [s for s in range(20) if s not in lost]
    raw = _raw(at, {s: 85.0 for s in at}, sent=20)
    cal = analyse("ge", "nfqueue/c", LinkProfile(rtt_ms=85, loss_up=ge, loss_down=0.0), raw)
    assert cal.loss_up.within is None and cal.ok
    assert cal.bursts_up is not None
    assert cal.bursts_up.measured_mean_burst == 2.5 and cal.bursts_up.bursts == 2
    assert cal.bursts_up.model_mean_burst == 2.0
    assert cal.bursts_up.model_mean_loss == pytest.approx(0.1 / 0.6)


def test_link_bench_pools_links_and_tolerates_chance_misses() -> None:
    def row(dev: int, lost: int) -> object:
        at = list(range(lost, 400))
        raw = _raw(at, {s: 85.0 for s in at}, 400)
        return analyse("l10", "x", LinkProfile(rtt_ms=85, loss_up=0.1), raw)

    # 20 links near 10 %, one of them far outside: pooled still inside, 1 miss is plausible
    rows = [row(d, 40) for d in range(19)] + [row(19, 60)]
    bench = LinkBench(rtt_ms=85, devices=20, rows=rows)  # type: ignore[arg-type]
    lost, of, asked, inside = bench.loss.pooled["l10 up"]
    assert (lost, asked, inside) == (19 * 40 + 60, 0.1, True)
    down = (0, sum(400 - r.loss_up.lost for r in rows), 0.0, True)
    assert bench.loss.pooled["l10 down"] == down
    assert (bench.loss.inside, bench.loss.checks) == (39, 40) and bench.loss.misses_p > 0.05
    assert bench.loss.ok
    # many single-link misses are not chance, even when the pooled count looks right
    spread = [row(d, 25) for d in range(10)] + [row(d, 55) for d in range(10)]
    wide = LinkBench(85, 20, spread)  # type: ignore[arg-type]
    assert wide.loss.pooled["l10 up"][3] and wide.loss.misses_p < 0.05 and not wide.loss.ok
    # a systematic bias is caught by the pooled count even when single links look fine
    biased = LinkBench(85, 20, [row(d, 48) for d in range(20)])  # type: ignore[list-item]
    assert not biased.loss.pooled["l10 up"][3] and not biased.loss.ok


def test_holder_release_counts_are_read_from_its_last_run_only() -> None:
    from testbed.links.holder_process import START_MARK, parse_release_counts

    line = (
        "queue={q} link={link}/{d} gen={g} in=120 out={out} lost=3 full=0 late_us_mean=12.5 "
        "late_us_max={mx} late_over_500us={late} by_backup=3 unstamped={unstamped} "
        "read_by_backup={read} probe_stamped={stamped} probe_unstamped={missed}"
    )
    log = "\n".join([
        START_MARK,
        line.format(q=1, link="dev1", d="up", g=1, out=9, mx=900.0, late=2, unstamped=0, read=0,
                    stamped=0, missed=0),
        START_MARK,  # the lines above are an earlier holder's
        "tb-holder: reload failed; kept going",
        line.format(q=1, link="dev1", d="up", g=4, out=117, mx=3569.5, late=4, unstamped=0, read=2,
                    stamped=30, missed=1),
        line.format(q=2, link="dev1/backup", d="down", g=4, out=100, mx=40, late=0, unstamped=7,
                    read=0, stamped=0, missed=0),
        line.format(q=1, link="dev1", d="up", g=5, out=50, mx=20.0, late=0, unstamped=0, read=0,
                    stamped=12, missed=0),
        "queue=3 link=dev2/up in=x out=1",  # not a counts line: skipped
    ])  # fmt: skip
    counts = parse_release_counts(log)
    assert [
        (c.queue, c.link, c.direction, c.generation, c.released, c.late_over_500us) for c in counts
    ] == [
        (1, "dev1", "up", 4, 117, 4),
        (2, "dev1/backup", "down", 4, 100, 0),
        (1, "dev1", "up", 5, 50, 0),
    ]
    assert counts[0].latest_ms == pytest.approx(3.5695)
    assert [c.unstamped for c in counts] == [0, 7, 0]
    assert [c.read_by_backup for c in counts] == [2, 0, 0]
    assert [(c.probe_stamped, c.probe_unstamped) for c in counts] == [(30, 1), (0, 0), (12, 0)]
    bench = LinkBench(85, 1, [], holder=counts)
    assert bench.holder_late == (267, 4, pytest.approx(3.5695))


def test_spells_when_neither_releaser_ran_are_read_per_generation() -> None:
    from testbed.links.holder_process import START_MARK, HeldUp, parse_held_up

    log = "\n".join([
        START_MARK,
        "held_up gen=1 both=9 longest_us=30000.0 total_us=50000.0",  # an earlier holder
        START_MARK,
        "held_up gen=4 both=2 longest_us=4670.5 total_us=6100.0",
        "queue=1 link=dev1/up gen=5 in=1 out=1 lost=0 full=0 late_us_mean=1.0 late_us_max=1.0 "
        "late_over_500us=0 by_backup=0 unstamped=0 read_by_backup=0 probe_stamped=0 "
        "probe_unstamped=0",
        "held_up gen=5 both=0 longest_us=0.0 total_us=0.0",
        "held_up gen=x both=1",  # not a held-up line: skipped
        "held_up_spell gen=4 from_ns=1000 to_ns=5000",
        "held_up_spell gen=4 from_ns=9000 to_ns=9600",
        "held_up_spell gen=5 from_ns=x to_ns=1",  # not a spell line: skipped
    ])  # fmt: skip
    four = HeldUp(4, 2, 4.6705, 6.1, ((1000, 5000), (9000, 9600)))
    assert parse_held_up(log) == [four, HeldUp(5, 0, 0.0, 0.0)]


def test_round_trips_a_held_up_spell_met_are_told_apart() -> None:
    """A round trip is left out of the untouched p99 when either leg was due in a spell of
    its profile's generation, or within the p99 goal before one; the others are kept."""
    from testbed.links.holder_process import HeldUp

    ms = 1_000_000
    legs = [  # (left the device, echo left the server) ns, |error| ms; each leg due 42.5 ms on
        (0, 50 * ms, 0.1),  # due at 42.5 and 92.5 ms: clear of the spell
        (960 * ms, 1010 * ms, 9.0),  # up due at 1002.5 ms: in the spell
        (1000 * ms, 1057.7 * ms, 5.0),  # down due at 1100.2 ms: 0.3 ms before it -> touched
        (2000 * ms, 2050 * ms, 0.3),  # clear
        (1000 * ms, 1056 * ms, 0.2),  # down due 1098.5 ms: 1.5 ms before the spell: clear
    ]
    row = Calibration.model_construct(
        profile="a", device="dev1", holder_generation=3, requested=LinkProfile(rtt_ms=85),
        echo_legs=legs, loss_down=None, rtt_error_p99_ms=8.0, started_at=0.0, ended_at=3.0,
    )  # fmt: skip
    spells = [HeldUp(3, 2, 5.0, 10.0, ((1000 * ms, 1005 * ms), (1100.5 * ms, 1105 * ms)))]
    other = [HeldUp(2, 1, 5.0, 5.0, ((1000 * ms, 1005 * ms),))]  # another profile's
    bench = LinkBench(85, 1, [row], spells=spells)  # type: ignore[list-item]
    assert sorted(bench.untouched_errors(row).tolist()) == [0.1, 0.2, 0.3]  # type: ignore[union-attr]
    assert bench.worst_untouched([row]) == (pytest.approx(0.298), 3)
    assert bench.worst_p99_untouched_ms == pytest.approx(0.298)
    assert len(LinkBench(85, 1, [row], spells=other).untouched_errors(row)) == 5  # type: ignore[arg-type]
    # the holder counted a spell it did not list: which round trips it met is unknown
    unlisted = [HeldUp(3, 3, 5.0, 10.0, spells[0].windows)]
    assert LinkBench(85, 1, [row], spells=unlisted).worst_untouched([row]) == (None, 0)  # type: ignore[list-item]


def test_spells_that_keep_a_100_ms_cycle_are_told_from_random_ones() -> None:
    """The densest 10 ms window of every 100 ms, wrapping around the cycle's end."""
    import numpy as np

    from testbed.links.holder_process import HeldUp

    ms = 1_000_000
    rng = np.random.default_rng(7)
    spread = [int(t) for t in rng.uniform(0, 60_000 * ms, 200)]
    periodic = [k * 100 * ms + 97 * ms + int(rng.uniform(0, 5 * ms)) for k in range(300)]

    def cycle(starts: list[int]) -> tuple[int, float, float] | None:
        windows = tuple((t, t + ms) for t in starts)
        return LinkBench(85, 1, [], spells=[HeldUp(1, len(windows), 1.0, 1.0, windows)]).spell_cycle

    listed, share, start = cycle(spread)  # type: ignore[misc]
    assert listed == 200 and 0.05 < share < 0.25  # about a tenth, by chance a little more
    listed, share, start = cycle(spread + periodic)  # type: ignore[misc]
    assert listed == 500 and share >= 300 / 500
    assert 92 <= start < 98  # a window of 10 ms holding 97-102 ms, past the cycle's end
    assert cycle(periodic[:19]) is None  # too few to tell


def test_the_holder_s_late_packets_are_told_per_profile_and_on_the_links_that_missed() -> None:
    from testbed.links.calibrate import LossCheck
    from testbed.links.holder_process import HeldUp, ReleaseCounts

    def row(profile: str, device: str, p99: float, gen: int, echoes: int = 500) -> Calibration:
        return Calibration.model_construct(
            profile=profile,
            device=device,
            rtt_error_p99_ms=p99,
            holder_generation=gen,
            loss_down=LossCheck.model_construct(of=echoes + 40, lost=40),
            started_at=100.0 * gen,
            ended_at=100.0 * gen + 2.5,
        )

    rows = [row("a", "dev1", 0.9, 1), row("a", "dev2", 0.1, 1, 480), row("b", "dev1", 0.2, 2)]
    counts = [
        ReleaseCounts(1, "dev1", "up", 1, 100, 3, 1.2, by_backup=2),
        ReleaseCounts(2, "dev1", "down", 1, 100, 1, 0.7, unstamped=4),
        ReleaseCounts(3, "dev2", "up", 1, 100, 5, 0.9),
        ReleaseCounts(4, "dev1/backup", "up", 1, 100, 7, 0.9),  # another path: not dev1's
        ReleaseCounts(1, "dev1", "up", 2, 80, 2, 0.6),
    ]
    spells = [HeldUp(1, 3, 4.7, 6.0), HeldUp(7, 1, 9.0, 9.0)]  # generation 7: no profile's
    bench = LinkBench(85, 2, rows, holder=counts, spells=spells)  # type: ignore[arg-type]
    assert bench.holder_late_on(rows[0]) == (200, 4)
    assert bench.holder_late_on(rows[2]) == (80, 2)
    a, b = bench.tails()
    assert (a.profile, a.links, a.missed, a.late_all, a.late_missed, a.released) == (
        "a",
        2,
        1,
        9,
        4,
        300,
    )
    assert (b.missed, b.late_all, b.late_missed) == (0, 2, 0)
    assert (a.by_backup, b.by_backup) == (2, 0)
    assert (a.held_up, a.held_up_longest_ms, b.held_up, b.held_up_longest_ms) == (3, 4.7, 0, 0.0)
    # 6 ms held up in the 2.5 s the profile was probed; the p99 rests on dev2's 480 echoes
    assert (a.held_up_ms, a.probed_s, a.held_up_share) == (6.0, 2.5, pytest.approx(0.0024))
    assert (a.fewest_echoes, b.fewest_echoes, b.held_up_share) == (480, 500, 0.0)
    assert bench.holder_unstamped == 4
    # the no-backup comparison rows are shown, not judged against the goals
    compared = LinkBench(85, 2, [*rows, row("a no-backup", "dev1", 9.0, 3)])  # type: ignore[list-item]
    assert compared.worst_p99_error_ms == 0.9


@pytest.mark.parametrize(
    ("loss", "sent"),
    [(0.0, 500), (0.01, 511), (0.1, 618), (0.5, 2000), (0.8, 2000), (1.0, 500)],
)
def test_lossy_links_are_sent_enough_packets_for_the_echoes_wanted(loss: float, sent: int) -> None:
    from testbed.bench.link import packets_for

    assert packets_for(LinkProfile(rtt_ms=85, loss=loss), 500) == sent


def test_holder_flags_come_from_the_environment_and_unknown_ones_are_named(monkeypatch) -> None:
    from testbed.core.errors import BadInputError
    from testbed.links.holder_process import FLAGS_ENV, flags_for_holders, holder_flags

    monkeypatch.delenv(FLAGS_ENV, raising=False)
    assert holder_flags() == []
    with flags_for_holders(("--no-backup",)):
        assert holder_flags() == ["--no-backup"]
    assert FLAGS_ENV not in __import__("os").environ
    monkeypatch.setenv(FLAGS_ENV, "--no-backup --fast")
    with pytest.raises(BadInputError, match=rf"{FLAGS_ENV}: unknown holder flag\(s\) \['--fast'\]"):
        holder_flags()
