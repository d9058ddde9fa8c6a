"""Topologies: the host-class table, `Topology` building and checks, the shipped topology files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from testbed.core.errors import BadInputError
from testbed.topo.catalogue import load_catalogue
from testbed.topo.classes import host_class, host_classes, load_host_classes
from testbed.topo.files import load_topology
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import Topology

REPO = Path(__file__).resolve().parent.parent


def test_class_table_orders_the_devices_as_their_hardware():
    pi, jetson = host_class("pi5"), host_class("jetson-orin-nano")
    catalogue = load_catalogue()
    pi_hw = catalogue.hardware(pi.hardware, "pi5")
    jetson_hw = catalogue.hardware(jetson.hardware, "jetson-orin-nano")
    assert jetson_hw.bandwidth_gbs > pi_hw.bandwidth_gbs
    assert (pi.engine, jetson.engine, host_class("a100").engine) == (
        "llama-cpp-cpu",
        "llama-cpp-cuda",
        "torch-cuda",
    )
    assert all(c.roles for c in host_classes().values())


def test_every_host_class_stands_for_hardware_in_the_catalogue():
    catalogue = load_catalogue()
    for name, cls in host_classes().items():
        catalogue.hardware(cls.hardware, f"host class {name}")  # raises for an unknown one


def test_a_bad_host_class_file_names_the_file_and_key(tmp_path: Path):
    bad = tmp_path / "classes.yaml"
    bad.write_text("pi5: {description: x, cores: 0, hardware: pi5, engine: x, roles: [device]}\n")
    with pytest.raises(BadInputError, match=r"classes.yaml.*pi5\.cores"):
        load_host_classes(bad)


def test_unknown_class_lists_the_known_ones():
    with pytest.raises(BadInputError, match="pi4.*known: pi5"):
        host_class("pi4")


def test_star_has_one_primary_link_per_device():
    topo = Topology.star(3, LinkProfile(rtt_ms=85, loss=0.1))
    assert topo.server.name == "server"
    assert [d.name for d in topo.devices] == ["dev1", "dev2", "dev3"]
    assert set(topo.profiles()) == {"dev1", "dev2", "dev3"}
    assert topo.link("dev2").profile.loss == 0.1
    assert topo.link("dev2", "backup") is None


def test_built_mininet_style_and_checked_as_it_grows():
    topo = Topology(name="t")
    topo.add_host("server", "server")
    topo.add_host("dev1", "device", "jetson-orin-nano")
    topo.add_link("dev1", "server", "wifi", LinkProfile(rtt_ms=85))
    assert topo.class_counts() == {"jetson-orin-nano": 1}
    with pytest.raises(ValueError, match="duplicate"):
        topo.add_host("dev1", "device")
    with pytest.raises(ValueError, match="cannot be a server"):
        Topology(name="t").add_host("s", "server", "pi5")
    with pytest.raises(ValueError, match="two primary links"):
        topo.add_link("dev1", "server", "wifi", LinkProfile(rtt_ms=85))


def test_link_must_join_a_device_to_a_server():
    with pytest.raises(ValidationError, match="expected a device then a server"):
        Topology.model_validate(
            {
                "name": "t",
                "hosts": [
                    {"name": "server", "role": "server", "host_class": "a100"},
                    {"name": "dev1", "role": "device", "host_class": "pi5"},
                ],
                "links": [
                    {"a": "server", "b": "dev1", "profile_name": "x", "profile": {"rtt_ms": 1}}
                ],
            }
        )


def test_rescaling_keeps_class_and_both_paths():
    topo = load_topology(REPO / "topologies" / "star-5g-backup.yaml").with_devices(6)
    assert topo.class_counts() == {"pi5": 6}
    assert len(topo.profiles("primary")) == len(topo.profiles("backup")) == 6
    assert topo.link("dev6", "backup").profile_name == "5g"


def test_shipped_topologies():
    star = load_topology(REPO / "topologies" / "star.yaml")
    assert {p.rtt_ms for p in star.profiles().values()} == {85}
    assert not star.has_backup
    backup = load_topology(REPO / "topologies" / "star-5g-backup.yaml")
    assert backup.has_backup
    assert all(backup.link(d.name, "backup") is not None for d in backup.devices)
    mixed = load_topology(REPO / "topologies" / "mixed-fleet.yaml")
    assert mixed.class_counts() == {"pi5": 10, "jetson-orin-nano": 6}
    assert mixed.server.host_class == "a100"


def test_per_group_profile_override(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "name: t\nfleet:\n  - {class: pi5, count: 1}\n"
        "  - {class: jetson-orin-nano, count: 1, primary: fast}\n"
        "profiles:\n  wifi: {rtt_ms: 85}\n  fast: {rtt_ms: 20}\nlinks: {primary: wifi}\n"
    )
    topo = load_topology(path)
    assert {d: p.rtt_ms for d, p in topo.profiles().items()} == {"dev1": 85, "dev2": 20}


def test_bad_profile_is_named_with_file_and_key(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "name: t\nfleet: [{class: pi5, count: 1}]\nprofiles:\n  wifi: {rtt_ms: 85, los: 1}\n"
        "links: {primary: wifi}\n"
    )
    with pytest.raises(BadInputError, match=r"t.yaml: profiles.wifi.los"):
        load_topology(path)
