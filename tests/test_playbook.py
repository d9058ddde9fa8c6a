"""Playbook validation and sweep expansion."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config.playbook import expand, load_playbook
from testbed.errors import BadInputError

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pb.yaml"
    path.write_text(text)
    return path


def test_shipped_playbooks_validate():
    paths = sorted((REPO / "experiments").glob("*.yaml"))
    assert any(p.name == "smoke.yaml" for p in paths)
    for path in paths:
        pb = load_playbook(path)
        assert expand(pb, str(path)), path


def test_sweep_is_a_cartesian_product_with_stable_ids(tmp_path):
    pb = load_playbook(
        write(
            tmp_path,
            "name: t\nsweep:\n  link.loss: [0.0, 0.5]\n  sled.draft_len: [2, 4, 8]\n",
        )
    )
    conds = expand(pb)
    assert len(conds) == 6
    assert [c.playbook.link.loss for c in conds[:3]] == [0.0, 0.0, 0.0]
    assert [c.playbook.sled.draft_len for c in conds[:3]] == [2, 4, 8]
    assert len({c.id for c in conds}) == 6
    assert [c.id for c in expand(pb)] == [c.id for c in conds]


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("name: t\nlink:\n  loss: 1.5\n", ["pb.yaml", "link.loss", "less than or equal to 1"]),
        ("name: t\nlink:\n  los: 0.1\n", ["link.los", "Extra inputs"]),
        ("name: t\nsweep:\n  link.lost: [0.1]\n", ["link.lost", "does not name a playbook"]),
        ("name: t\nsweep:\n  link.loss: [0.1, 2]\n", ["sweep", "link.loss", "2"]),
        ("name: t\nsweep:\n  link.loss: []\n", ["sweep.link.loss", "non-empty list"]),
        ("name: t\nsweep:\n  lab.devices: [1, 2]\n", ["sweep.lab.devices", "whole run"]),
        ("name: t\nsweep:\n  models.target: [a, b]\n", ["sweep.models.target", "whole run"]),
        ("name: bad name\n", ["name", "pattern"]),
        ("- a\n- b\n", ["expected a mapping"]),
        ("name: t\nworkload:\n  kind: gsm8k\n", ["workload.gsm8k_path", "required"]),
        ("name: [unclosed\n", ["not valid YAML"]),
    ],
)
def test_bad_playbooks_name_file_key_and_expectation(tmp_path, text, needles):
    path = write(tmp_path, text)
    with pytest.raises(BadInputError) as err:
        expand(load_playbook(path), str(path))
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_playbook(tmp_path / "absent.yaml")


def test_topology_fills_devices_and_link_unless_the_playbook_sets_them(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text(
        "name: t\ndevices: 5\nlinks:\n  wifi: {rtt_ms: 60, loss: 0.02}\n  g5: {rtt_ms: 30}\n"
        "primary: wifi\n"
    )
    pb = load_playbook(write(tmp_path, "name: p\ntopology: t.yaml\nlink: {loss: 0.5}\n"))
    assert pb.lab.devices == 5
    assert (pb.link.rtt_ms, pb.link.loss) == (60, 0.5)


def test_shipped_star_topology_is_valid():
    from testbed.config.topology import load_topology

    topo = load_topology(REPO / "topologies" / "star.yaml")
    assert topo.link_section().rtt_ms == 85


@pytest.mark.parametrize(
    ("topology", "needles"),
    [
        ("name: t\ndevices: 2\nlinks: {wifi: {rtt_ms: 85}}\nprimary: lte\n", ["primary", "lte"]),
        ("name: t\ndevices: 0\nlinks: {wifi: {rtt_ms: 85}}\nprimary: wifi\n", ["devices"]),
    ],
)
def test_bad_topology_is_named(tmp_path, topology, needles):
    (tmp_path / "t.yaml").write_text(topology)
    with pytest.raises(BadInputError) as err:
        load_playbook(write(tmp_path, "name: p\ntopology: t.yaml\n"))
    assert "t.yaml" in str(err.value)
    for needle in needles:
        assert needle in str(err.value)


def test_missing_topology_is_named(tmp_path):
    with pytest.raises(BadInputError, match="absent.yaml not found"):
        load_playbook(write(tmp_path, "name: p\ntopology: absent.yaml\n"))
