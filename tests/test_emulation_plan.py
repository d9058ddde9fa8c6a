"""What the controller makes of the emulated hardware: each host's emulation document, the
checks on a playbook's models and dilation, dilated link profiles and probe figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config.playbook import Playbook, expand, load_playbook
from testbed.core.errors import BadInputError
from testbed.core.loading import validate
from testbed.hosts.inventory import InventoryHost
from testbed.links.probe import summarize
from testbed.runner.emulation import (
    ConditionTime,
    check_emulation,
    emulation_tag,
    engine_roles,
    host_emulation,
    time_dilation,
)
from testbed.runner.run import check_conditions
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import dilate, timeline
from testbed.topo.topology import Topology

REPO = Path(__file__).resolve().parent.parent


def host(name: str, role: str, cls: str | None) -> InventoryHost:
    return InventoryHost(
        name=name, role=role, address="10.0.0.1", user="root", workdir="/w", host_class=cls
    )


def playbook(**fields) -> Playbook:
    return validate(Playbook, {"name": "t", **fields}, "t.yaml")


@pytest.mark.parametrize(
    ("mode", "device", "server"),
    [
        ("sled", ("draft",), ("target",)),
        ("centralized", (), ("target",)),
        ("device-only", ("draft",), ("target",)),
        ("server-ad", (), ("target",)),
        ("server-sd", (), ("target", "draft")),
        ("balance", (), ("target", "draft")),
    ],
)
def test_each_mode_paces_the_engines_its_hosts_run(mode, device, server):
    assert engine_roles(mode, "device") == device
    assert engine_roles(mode, "server") == server


def test_a_hosts_document_names_its_hardware_and_models_and_the_conditions_time():
    pb = playbook(models={"draft_as": "llama-3.2-1b@q4_0", "target_as": "llama-3.1-8b@bf16"})
    when = ConditionTime(2.0, 100.0)
    dev = host_emulation(host("dev1", "device", "jetson-orin-nano"), pb, True, when)
    assert dev["time_dilation"] == 2.0 and dev["clock_epoch"] == 100.0 and dev["pace"]
    assert dev["hardware"]["name"] == "jetson-orin-nano"
    assert set(dev["models"]) == {"draft"} and dev["models"]["draft"]["layers"] == 16
    srv = host_emulation(host("server", "server", "a100x4"), pb, False, when)
    assert srv["hardware"]["devices"] == 4 and set(srv["models"]) == {"target"}
    assert srv["pace"] is False
    bare = host_emulation(host("pi", "device", None), pb, True, when)
    assert "hardware" not in bare and bare["time_dilation"] == 2.0
    jetson = host("dev1", "device", "jetson-orin-nano")
    later = host_emulation(jetson, pb, True, ConditionTime(2, 7))
    assert emulation_tag(dev) == emulation_tag(later) != emulation_tag(srv)


def test_the_condition_clock_maps_the_controllers_times():
    when = ConditionTime(4.0, 1000.0)
    assert when.wall(1040.0) == pytest.approx(1010.0)
    assert when.real_s(2.5) == 10.0


def test_an_unknown_model_or_one_its_host_cannot_hold_is_refused_naming_the_key():
    hosts = [("server", "server", "a100"), ("dev1", "device", "pi5")]
    with pytest.raises(BadInputError, match=r"t\.yaml: models\.target_as.*llama-9"):
        check_emulation(playbook(models={"target_as": "llama-9@f16"}), hosts, "t.yaml")
    too_big = playbook(models={"target_as": "llama-3.1-70b@bf16"})
    with pytest.raises(BadInputError, match=r"host server \(class a100\).*GB"):
        check_emulation(too_big, hosts, "t.yaml")
    check_emulation(too_big, [("server", "server", "a100x4")], "t.yaml")
    on_a_pi = playbook(models={"draft_as": "llama-3.1-8b@bf16"})
    with pytest.raises(BadInputError, match=r"host dev1 \(class pi5\).*GB"):
        check_emulation(on_a_pi, hosts, "t.yaml")
    check_emulation(
        playbook(mode="centralized", models={"draft_as": "llama-3.1-8b@bf16"}), hosts, "t.yaml"
    )  # fmt: skip  (centralized devices run no draft)


@pytest.mark.parametrize("bad", [0, -1, "fast", 5000, True and "yes"])
def test_a_dilation_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(BadInputError, match="lab.time_dilation"):
        playbook(lab={"time_dilation": bad})


def test_an_inventory_lab_cannot_be_dilated(tmp_path: Path):
    inv = tmp_path / "lab.yml"
    inv.write_text("all: {}\n")
    pb = playbook(lab={"kind": "inventory", "inventory": str(inv), "time_dilation": 2})
    with pytest.raises(BadInputError, match="time_dilation.*real time"):
        time_dilation(pb, "t.yaml")
    assert time_dilation(playbook(lab={"time_dilation": "auto"}), "t.yaml") is None


def test_every_swept_model_is_checked_before_the_lab_comes_up():
    pb = playbook(
        models={"draft_as": "llama-3.2-1b@q4_0"},
        sweep={"models.target_as": ["llama-3.1-8b@bf16", "llama-3.1-70b@bf16"]},
    )
    with pytest.raises(BadInputError, match=r"t\.yaml \(c01.*70b"):
        check_conditions(expand(pb, "t.yaml"), Topology.star(2), "t.yaml")


def test_validate_refuses_a_shipped_style_playbook_with_an_unknown_hardware_model(tmp_path):
    book = tmp_path / "p.yaml"
    book.write_text(
        f"name: p\ntopology: {REPO / 'topologies/star.yaml'}\n"
        "models: {draft_as: llama-3.2-1b@q5_k}\n"
    )
    pb = load_playbook(book)
    with pytest.raises(BadInputError, match="format 'q5_k'"):
        check_conditions(expand(pb, str(book)), Topology.star(2), str(book))


def test_a_dilated_profile_is_slower_in_every_time_and_keeps_its_loss():
    p = LinkProfile(
        rtt_ms=85, jitter_ms=4, loss=0.1, rate_mbit=20,
        schedule=[{"at_s": 2, "rtt_ms": 140, "loss": 0.2}],
    )  # fmt: skip
    d = dilate(p, 4)
    assert (d.rtt_ms, d.jitter_ms, d.rate_mbit, d.loss) == (340, 16, 5, 0.1)
    assert [(ph.at_s, ph.profile.rtt_ms, ph.profile.loss) for ph in timeline(d)] == [
        (0, 340, 0.1),
        (8, 560, 0.2),
    ]
    assert dilate(p, 1) is p


def test_a_dilated_trace_becomes_its_dilated_rows():
    trace = REPO / "topologies" / "traces" / "wifi-synthetic.csv"
    p = LinkProfile(rtt_ms=85, trace=trace)
    plain, slow = timeline(p), timeline(dilate(p, 2))
    assert len(plain) == len(slow)
    for a, b in zip(plain, slow):
        assert b.at_s == pytest.approx(2 * a.at_s)
        assert b.profile.rtt_ms == pytest.approx(2 * a.profile.rtt_ms)
        assert b.profile.loss == a.profile.loss


def test_a_probe_reads_back_in_emulated_time():
    asked = LinkProfile(rtt_ms=85, loss=0.0)
    applied = dilate(asked, 3)
    real = summarize("dev1", applied, 4, [0, 1, 2, 3], {0: 255.0, 1: 255.3, 2: 254.7, 3: 255.0})
    shown = real.in_emulated_time(3, asked)
    assert shown.rtt_ms.p50 == pytest.approx(85.0)
    assert shown.rtt_error_ms["median"] == pytest.approx(real.rtt_error_ms["median"] / 3)
    assert shown.requested == asked and shown.loss_up == real.loss_up
