"""Playbook validation and sweep expansion."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.config.playbook import expand, lab_playbook, load_playbook, playbook_topology
from testbed.core.errors import BadInputError

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
    conds = list(expand(pb))
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
        ("name: t\nsweep:\n  lab.kind: [mininet]\n", ["sweep.lab.kind", "whole run"]),
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
        list(expand(load_playbook(path), str(path)))
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_playbook(tmp_path / "absent.yaml")


TOPO = """name: t
server: {class: a100}
fleet:
  - {class: pi5, count: 5}
profiles:
  wifi: {rtt_ms: 60, loss: 0.02}
  g5: {rtt_ms: 30}
links: {primary: wifi, backup: g5}
"""


def test_topology_fills_the_link_unless_the_playbook_sets_it(tmp_path):
    (tmp_path / "t.yaml").write_text(TOPO)
    pb = load_playbook(write(tmp_path, "name: p\ntopology: t.yaml\nlink: {loss: 0.5}\n"))
    assert (pb.link.rtt_ms, pb.link.loss) == (60, 0.5)
    topo = playbook_topology(pb)
    assert len(topo.devices) == 5
    assert {p.loss for p in topo.profiles("primary").values()} == {0.5}
    assert {p.rtt_ms for p in topo.profiles("backup").values()} == {30}


def test_lab_devices_rescales_a_one_class_fleet(tmp_path):
    (tmp_path / "t.yaml").write_text(TOPO)
    pb = load_playbook(write(tmp_path, "name: p\ntopology: t.yaml\nlab: {devices: 3}\n"))
    topo = playbook_topology(pb)
    assert [d.name for d in topo.devices] == ["dev1", "dev2", "dev3"]
    assert topo.has_backup and topo.link("dev3", "backup") is not None


def test_swept_device_count_builds_the_largest_lab_and_runs_the_first_n(tmp_path):
    from testbed.hosts.inventory import Inventory, InventoryHost
    from testbed.runner.context import condition_devices

    pb = load_playbook(write(tmp_path, "name: t\nsweep:\n  lab.devices: [1, 3, 2]\n"))
    assert lab_playbook(pb).lab.devices == 3
    assert len(playbook_topology(lab_playbook(pb)).devices) == 3

    def host(name: str, role: str) -> InventoryHost:
        return InventoryHost(name=name, role=role, address=name, user="u", workdir="/w")

    hosts = [host("server", "server"), *(host(f"dev{i}", "device") for i in range(1, 4))]
    inv = Inventory(source="t", hosts=tuple(hosts))
    used = {
        c.values["lab.devices"]: [d.name for d in condition_devices(inv, c)] for c in expand(pb)
    }
    assert used == {1: ["dev1"], 2: ["dev1", "dev2"], 3: ["dev1", "dev2", "dev3"]}


def test_lab_devices_cannot_rescale_a_mixed_fleet():
    pb = load_playbook(write_mixed := REPO / "experiments" / "smoke.yaml")
    mixed = pb.model_copy(
        update={
            "topology": str(REPO / "topologies" / "mixed-fleet.yaml"),
            "lab": pb.lab.model_copy(update={"devices": 4}),
        }
    )
    with pytest.raises(BadInputError, match="lab.devices: .*mixed fleet"):
        playbook_topology(mixed, str(write_mixed))


def test_per_direction_loss_is_settable_from_a_playbook(tmp_path):
    pb = load_playbook(
        write(tmp_path, "name: t\nlink: {rtt_ms: 85, loss_up: 0.1, loss_down: 0.3}\n")
    )
    assert (pb.link.up_loss, pb.link.down_loss) == (0.1, 0.3)
    assert pb.link.round_trip_loss == pytest.approx(1 - 0.9 * 0.7)


def test_run_only_knobs_are_not_part_of_the_link(tmp_path):
    with pytest.raises(BadInputError, match="link.backend"):
        load_playbook(write(tmp_path, "name: t\nlink: {backend: nfqueue}\n"))
    pb = load_playbook(write(tmp_path, "name: t\nimpairment: {backend: nfqueue}\n"))
    assert pb.impairment.backend == "nfqueue"


def test_old_lab_kind_is_refused_with_the_choices(tmp_path):
    with pytest.raises(BadInputError, match="lab.kind.*namespaces"):
        load_playbook(write(tmp_path, "name: t\nlab: {kind: emulated}\n"))


def test_inventory_lab_needs_an_inventory(tmp_path):
    with pytest.raises(BadInputError, match="lab: .*inventory: required"):
        load_playbook(write(tmp_path, "name: t\nlab: {kind: inventory}\n"))
    pb = load_playbook(write(tmp_path, "name: t\nlab: {kind: inventory, inventory: inv.yml}\n"))
    assert pb.lab.inventory == str(tmp_path / "inv.yml")


@pytest.mark.parametrize(
    ("topology", "needles"),
    [
        (TOPO.replace("primary: wifi", "primary: lte"), ["links.primary", "lte"]),
        (TOPO.replace("count: 5", "count: 0"), ["fleet.0.count"]),
        (TOPO.replace("class: pi5", "class: pi4"), ["fleet.0.class", "pi4", "known"]),
        (TOPO.replace("class: a100", "class: pi5"), ["server", "cannot be a server"]),
    ],
)
def test_bad_topology_is_named(tmp_path, topology, needles):
    (tmp_path / "t.yaml").write_text(topology)
    with pytest.raises(BadInputError) as err:
        load_playbook(write(tmp_path, "name: p\ntopology: t.yaml\n"))
    assert "t.yaml" in str(err.value)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_missing_topology_is_named(tmp_path):
    with pytest.raises(BadInputError, match="absent.yaml not found"):
        load_playbook(write(tmp_path, "name: p\ntopology: absent.yaml\n"))


def test_command_line_lab_kind_replaces_the_playbooks(tmp_path):
    from testbed.config.playbook import with_lab

    pb = load_playbook(REPO / "experiments" / "smoke.yaml")
    assert pb.lab.kind == "namespaces"
    assert with_lab(pb, "smoke", "mininet", None).lab.kind == "mininet"
    inv = with_lab(pb, "smoke", None, "inv.yml").lab
    assert inv.kind == "inventory" and Path(inv.inventory).is_absolute()
    with pytest.raises(BadInputError, match="lab.kind"):
        with_lab(pb, "smoke", "emulated", None)


def test_run_lab_setup_takes_name_and_subnet_from_the_environment(monkeypatch):
    from testbed.runner.run import run_lab_setup

    pb = load_playbook(REPO / "experiments" / "demo.yaml")
    monkeypatch.setenv("TESTBED_LAB_NAME", "aenv")
    monkeypatch.setenv("TESTBED_LAB_SUBNET", "10.78.12.0/24")
    spec = run_lab_setup(pb, "demo")
    assert (spec.name, str(spec.subnet), spec.devices) == ("aenv", "10.78.12.0/24", 4)
    assert {p.rtt_ms for p in spec.topology.profiles().values()} == {85}


def test_a_swept_device_class_runs_every_device_as_that_class(tmp_path):
    """`lab.device_class` sets each condition's devices' class: on the lab's hosts (what their
    agents are paced to) and in the topology the twin simulates; the server keeps its own."""
    from testbed.hosts.inventory import Inventory, InventoryHost
    from testbed.runner.context import condition_devices

    pb = load_playbook(write(tmp_path, (
        "name: t\ntopology: topologies/seed-pi5-a100x4.yaml\nlab: {devices: 2}\n"
        "sweep:\n  lab.device_class: [pi5, jetson-orin-nano]\n"
    )))  # fmt: skip
    hosts = [
        InventoryHost(name=n, role=r, address=n, user="u", workdir="/w", host_class=c)
        for n, r, c in [("server", "server", "a100x4"), ("dev1", "device", "pi5"),
                        ("dev2", "device", "pi5")]
    ]  # fmt: skip
    inv = Inventory(source="t", hosts=tuple(hosts))
    by_class = {c.values["lab.device_class"]: c for c in expand(pb)}
    assert [d.host_class for d in condition_devices(inv, by_class["jetson-orin-nano"])] == [
        "jetson-orin-nano", "jetson-orin-nano"]  # fmt: skip
    assert [d.host_class for d in condition_devices(inv, by_class["pi5"])] == ["pi5", "pi5"]
    topo = playbook_topology(by_class["jetson-orin-nano"].playbook)
    assert topo.class_counts() == {"jetson-orin-nano": 2}
    assert topo.server.host_class == "a100x4"
    assert playbook_topology(by_class["pi5"].playbook).class_counts() == {"pi5": 2}


@pytest.mark.parametrize(
    "text, needles",
    [
        ("lab: {device_class: a100x4}", ["lab.device_class", "expected a device class", "pi5"]),
        ("lab: {device_class: pi6}", ["lab.device_class", "'pi6'"]),
        ("lab: {kind: inventory, inventory: i.yml, device_class: pi5}",
         ["device_class", "inventory lab"]),
        ("workload: {answer_scale: 2}", ["answer_scale", "needs stands_for"]),
        ("workload: {stands_for: gsm8k-cot-0shot, answer_scale: 0}", ["answer_scale"]),
    ],
)  # fmt: skip
def test_bad_device_class_and_answer_scale_are_named(tmp_path, text, needles):
    with pytest.raises(BadInputError) as err:
        load_playbook(write(tmp_path, f"name: t\n{text}\n"))
    assert all(n in str(err.value) for n in needles), str(err.value)


def test_a_lab_run_refuses_more_devices_than_a_lab_holds(tmp_path):
    """The twin takes a playbook of 1,000 devices; a lab run names the key and the limit."""
    from testbed.runner.run import check_conditions

    pb = load_playbook(write(tmp_path, (
        "name: t\ntopology: topologies/seed-pi5-a100x4.yaml\nsweep:\n  lab.devices: [4, 1000]\n"
    )))  # fmt: skip
    conditions = expand(pb, "pb.yaml")
    assert max(len(playbook_topology(c.playbook).devices) for c in conditions) == 1000
    with pytest.raises(BadInputError, match=r"pb.yaml \(.*\): lab.devices: 1000 is over the 200"):
        check_conditions(conditions, playbook_topology(lab_playbook(pb)), "pb.yaml")
    with pytest.raises(BadInputError, match="lab.devices"):
        load_playbook(write(tmp_path, "name: t\nlab: {devices: 100001}\n"))
