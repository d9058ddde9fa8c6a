"""The link guard of a condition: a link that does not measure as requested is probed again
before the condition fails, every try is kept in the record, and the RTT tolerance is wider
where the probe timed most echoes in user space (hand-built probe results)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.config.playbook import ImpairmentSection
from testbed.core.errors import ImpairmentError
from testbed.links.probe import ProbeResult, summarize
from testbed.runner.link_guard import probe_checked
from testbed.topo.profile import LinkProfile

WANT = LinkProfile(rtt_ms=40)
PROFILES = {"dev1": WANT}


def measured(rtt_ms: float, user_rx: int | None = None) -> dict[str, ProbeResult]:
    """dev1's probe: 50 echoes, every one back after `rtt_ms`, `user_rx` of them timed in user
    space (None: by kernel stamps)."""
    echoes = dict.fromkeys(range(50), rtt_ms)
    return {"dev1": summarize("dev1", WANT, 50, list(range(50)), echoes, rx_user_space=user_rx)}


class Probes:
    """Hands out the given medians, one a probe, and counts the saves between them."""

    def __init__(self, *rtts: float, user_rx: int | None = None) -> None:
        self.rtts, self.user_rx = list(rtts), user_rx
        self.calls = self.saves = 0
        self.said: list[str] = []

    def probe(self) -> dict[str, ProbeResult]:
        self.calls += 1
        return measured(self.rtts.pop(0), self.user_rx)

    def save(self) -> None:
        self.saves += 1


def check(probes: Probes, knobs: ImpairmentSection, record: dict[str, Any]) -> None:
    probe_checked(record, probes.probe, PROFILES, knobs, probes.save, probes.said.append)


def run(probes: Probes, retries: int = 1) -> dict[str, Any]:
    record: dict[str, Any] = {}
    check(probes, ImpairmentSection(probe_retries=retries), record)
    return record


def test_a_link_that_measures_as_asked_is_probed_once():
    probes = Probes(40.2)
    record = run(probes)
    assert (probes.calls, probes.saves, probes.said) == (1, 1, [])
    assert record["summary"]["rtt_measured_ms"] == pytest.approx(40.2)
    assert "failed_tries" not in record


def test_a_stalled_probe_is_probed_again_and_its_try_kept():
    probes = Probes(41.4, 40.1)
    record = run(probes)
    assert (probes.calls, probes.saves) == (2, 2)
    assert record["summary"]["rtt_measured_ms"] == pytest.approx(40.1)
    assert record["probes"]["dev1"]["rtt_ms"]["p50"] == pytest.approx(40.1)
    (first,) = record["failed_tries"]
    assert "dev1: median RTT 41.40 ms" in first["problem"]
    assert first["summary"]["rtt_measured_ms"] == pytest.approx(41.4)
    assert len(probes.said) == 1 and "probing again (1 of 1)" in probes.said[0]


def test_no_retries_fails_on_the_first_probe():
    probes = Probes(0.1, 40.0)
    record: dict[str, Any] = {}
    knobs = ImpairmentSection(probe_retries=0)
    with pytest.raises(ImpairmentError):
        check(probes, knobs, record)
    assert probes.calls == 1
    assert record["summary"]["rtt_measured_ms"] == pytest.approx(0.1)
    assert "failed_tries" not in record


def test_a_link_that_fails_every_try_fails_with_every_try_recorded():
    probes = Probes(0.1, 0.2, 0.3)
    record: dict[str, Any] = {}
    knobs = ImpairmentSection(probe_retries=2)
    with pytest.raises(ImpairmentError, match=r"dev1: median RTT 0\.30 ms, expected 40\.00 ms"):
        check(probes, knobs, record)
    assert probes.calls == 3 and probes.saves == 3
    assert [t["summary"]["rtt_measured_ms"] for t in record["failed_tries"]] == pytest.approx(
        [0.1, 0.2]
    )
    assert record["summary"]["rtt_measured_ms"] == pytest.approx(0.3)


def test_probe_retries_must_not_be_negative():
    with pytest.raises(ValueError, match="probe_retries"):
        ImpairmentSection(probe_retries=-1)


@pytest.mark.parametrize(
    ("user_rx", "set_ms", "tolerance", "passes"),
    [
        (None, None, 1.0, False),  # kernel stamps: 1.5 ms off is too far
        (0, None, 1.0, False),  # held after the kernel's stamp, every echo stamped by the holder
        (20, None, 1.0, False),  # 20 of 50 in user space: the median is still a stamped one
        (26, None, 2.0, True),  # most timed in user space
        (26, 1.2, 1.2, False),  # a tolerance the playbook sets holds for all
        (None, 1.6, 1.6, True),
    ],
)
def test_the_rtt_tolerance_is_wider_where_the_probe_timed_most_echoes_in_user_space(
    user_rx, set_ms, tolerance, passes
):
    probes = Probes(41.5, user_rx=user_rx)
    record: dict[str, Any] = {}
    knobs = ImpairmentSection(probe_retries=0, rtt_tolerance_ms=set_ms)
    if passes:
        check(probes, knobs, record)
    else:
        with pytest.raises(ImpairmentError, match=rf"with {tolerance:g} ms timing allowance"):
            check(probes, knobs, record)
    assert record["rtt_tolerance_ms"] == tolerance


def test_a_probe_line_says_how_many_echoes_the_holder_stamped():
    from testbed.links.probe import format_result

    echoes = dict.fromkeys(range(50), 40.0)
    held = summarize("dev1", WANT, 50, list(range(50)), echoes, rx_user_space=2,
                     rx_wake_ms=[0.1, 0.3, 0.2])  # fmt: skip
    line = format_result(held)
    assert line.endswith(
        "; 48 of 50 timed by the holder's release stamps (user-space times would add 0.20 ms, "
        "median)"
    ), line
    assert not held.timed_in_user_space
    assert "release stamps" not in format_result(summarize("dev1", WANT, 50, [], echoes))
