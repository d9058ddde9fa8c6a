"""The packet holder on a real lab against its own model: both ordering policies seen in
captures of both sides of the hop (read with scapy), and `testbed lab calibrate` printing the
distribution distance per jitter distribution and the figures of each trace window.

One lab (`lvho`, 10.95.5.0/24, one device) for the module; needs root (CI runs it as root).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_root_netns

from testbed.labs import EmulatedLab, LabSetup
from testbed.labs.clean import leftovers
from testbed.links.api import apply, clear
from testbed.links.capture import capture_link
from testbed.topo.profile import LinkProfile

REPO = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-m", "testbed.cli"]
LAB, SUBNET = "lvho", "10.95.5.0/24"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require_root_netns()
    state = tmp_path_factory.mktemp("lvho")
    setup = LabSetup(name=LAB, devices=1, subnet=SUBNET, state_dir=state)
    with EmulatedLab.running(setup) as running:
        yield running
    assert leftovers(LAB) == []


@pytest.mark.parametrize("order", ["keep", "reorder"])
def test_captures_show_each_ordering_policy_as_the_model_has_it(lab, tmp_path, order):
    """Normal jitter of 4 ms per direction on datagrams 2 ms apart: kept in order none passes
    another (and delays shift upward); let pass, about as many pass as the model says."""
    prof = LinkProfile(rtt_ms=60, jitter_ms=4, jitter_dist="normal", order=order,
                       loss_up={"p": 0.05, "r": 0.3}, seed=11)  # fmt: skip
    apply(lab, prof, backend="nfqueue")
    try:
        got = capture_link(lab, "dev1", prof, tmp_path, count=600, interval_ms=2)
    finally:
        clear(lab)
    assert got.dropped == {"p-dev1": 0, "p-server": 0}  # the capture is whole
    for leg in (got.up, got.down):
        assert leg.delay_ks_distance is not None and leg.delay_ks_distance < 0.1, leg
        assert leg.delay_measured is not None and leg.delay_expected is not None
        assert abs(leg.delay_measured.p50 - leg.delay_expected.p50) < 1.0, leg
        if order == "keep":
            assert leg.reordered_measured == 0 and leg.reordered_expected == 0
        else:
            assert leg.reordered_expected > 50
            assert (
                abs(leg.reordered_measured - leg.reordered_expected) < 0.3 * leg.reordered_expected
            )
    # up: Gilbert-Elliott bursts (mean 1/r = 3.3) against down's single random losses (none)
    assert got.up.bursts.mean_model == pytest.approx(1 / 0.3)
    assert got.up.bursts.runs > 5 and got.up.bursts.mean_measured > 1.5  # type: ignore[operator]
    assert got.down.left == got.down.entered  # no loss asked down
    assert all(Path(p).stat().st_size > 0 for p in got.pcaps)


def test_calibrate_prints_distances_per_jitter_distribution_and_trace_windows(lab, tmp_path):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text(
        "uniform: {rtt_ms: 95, jitter_ms: 6, jitter_dist: uniform, seed: 1}\n"
        "pareto: {rtt_ms: 95, jitter_ms: 6, jitter_dist: pareto, seed: 2}\n"
        "normal-reorder: {rtt_ms: 95, jitter_ms: 6, jitter_dist: normal, order: reorder, seed: 3}\n"
        f"fiveg: {{trace: {REPO / 'topologies/traces/5g-synthetic.csv'}, seed: 4}}\n"
    )
    res = subprocess.run(
        [*TESTBED, "lab", "calibrate", "--name", LAB, "--state-dir", str(lab.state_dir),
         "--profiles", str(profiles), "--count", "400", "--interval", "5", "--span", "3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    for name, dist, order in (("uniform", "uniform", "keep"), ("pareto", "pareto", "keep"),
                              ("normal-reorder", "normal", "reorder")):  # fmt: skip
        line = re.search(rf"^  {name}: {dist} jitter, order {order}: KS distance ([\d.]+)", out,
                         re.M)  # fmt: skip
        assert line is not None, out
        assert float(line[1]) < 0.15, line[0]
    # the trace: each window the probe met in its 3 s (from just after the apply), RTT and
    # loss expected beside measured
    windows = re.findall(r"^    from (\d) s \(rtt ([\d.]+) ms.*rtt p50 expected ([\d.]+) "
                         r"measured ([\d.]+) ms", out, re.M)  # fmt: skip
    assert [w[:2] for w in windows[:3]] == [("0", "38.82"), ("1", "38.85"), ("2", "40.67")], out
    assert all(abs(float(e) - float(m)) < 0.5 for *_, e, m in windows), windows
