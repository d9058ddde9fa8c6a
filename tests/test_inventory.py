"""Inventories read through ansible-core: nested groups, ranges, group_vars/host_vars, Jinja,
vaulted values, the roles the testbed gives hosts, errors naming file/host/key, and the writer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.core.errors import BadInputError
from testbed.hosts import InventoryHost, dump_inventory, load_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "ansible" / "inventories" / "lab.example.yml"
EXAMPLE_PASS = REPO / "ansible" / "inventories" / "lab.example.vault-pass"
BIN = Path(sys.executable).parent


def _write(tmp_path: Path, doc: object, name: str = "lab.yml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def _doc(**server_vars: object) -> dict:
    server = {"ansible_host": "10.0.0.1", "ansible_user": "root", "workdir": "/w", **server_vars}
    return {
        "all": {
            "children": {
                "verifiers": {"hosts": {"srv": server}},
                "drafters": {
                    "vars": {"ansible_user": "pi", "workdir": "/home/pi/w"},
                    "hosts": {"pi1": {"ansible_host": "10.0.0.2"}},
                },
            }
        }
    }


def _vault(tmp_path: Path, password: str, value: str) -> tuple[Path, str]:
    """A password file and `value` encrypted with it, as `ansible-vault encrypt_string` does."""
    pw = tmp_path / "vault-pass"
    pw.write_text(password + "\n")
    res = subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(pw), value],
        capture_output=True,
        text=True,
        check=True,
    )
    return pw, res.stdout.strip()


def test_example_inventory_hosts_roles_and_classes() -> None:
    inv = load_inventory(EXAMPLE, EXAMPLE_PASS)
    assert [h.name for h in inv.servers] == ["a100"]
    assert [h.name for h in inv.devices] == ["pi5-1", "pi5-2", "pi5-3", "pi5-4", "jetson-1"]
    assert [h.name for h in inv.middleboxes] == ["mbox"]  # controller: Ansible's only
    pi = inv.host("pi5-3")
    # a range, Jinja in ansible_host and workdir, group vars at two levels
    assert (pi.address, pi.user, pi.workdir) == ("192.168.50.23", "pi", "/home/pi/edge-testbed")
    assert (pi.host_class, inv.host("jetson-1").host_class) == ("pi5", "jetson-orin-nano")
    assert inv.host("jetson-1").vars["draft_model_name"] == "llama-3.2-3b-q8"
    assert inv.server.key_file == Path("~/.ssh/edge_lab_ed25519").expanduser()
    assert inv.server.vars["lab_protocol_key"] == "replace-me-with-a-32-byte-random-key"
    assert set(inv.server.vars["target_checkpoint"]["files"]) >= {
        "config.json",
        "model.safetensors",
    }


def test_example_inventory_names_the_fields_the_code_reads() -> None:
    """The fields the roles and the harness read (docs/lab-bringup.md's table), one middlebox
    port per host, and the smoke topology bound onto its hosts."""
    from testbed.labs.binding import bind_topology
    from testbed.labs.physical import IFACE_VAR, PORT_VAR
    from testbed.topo.files import load_topology

    assert "link_interface" not in EXAMPLE.read_text()
    inv = load_inventory(EXAMPLE, EXAMPLE_PASS)
    hosts = [*inv.servers, *inv.devices]
    assert all(h.vars.get(IFACE_VAR) and h.vars.get("link_ip") for h in hosts)
    ports = [h.vars[PORT_VAR] for h in hosts]
    assert len(set(ports)) == len(ports), ports
    assert inv.server.vars["testbed_src"] and inv.host("mbox").vars["middlebox_bridge"] == "br0"
    bound = bind_topology(load_topology(REPO / "topologies" / "star.yaml"), inv)
    assert bound.hosts == {"server": "a100", "dev1": "pi5-1", "dev2": "pi5-2"}


def test_group_vars_host_vars_and_nested_groups(tmp_path: Path) -> None:
    doc = {
        "all": {
            "children": {
                "verifiers": {"hosts": {"srv": {"ansible_host": "10.0.0.1"}}},
                "drafters": {
                    "children": {"pi5": {"children": {"rack1": {"hosts": {"p[01:03]": {}}}}}}
                },
            }
        }
    }
    path = _write(tmp_path, doc)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("ansible_user: edge\nworkdir: /srv/w\n")
    (tmp_path / "group_vars" / "rack1.yml").write_text("ansible_port: 2222\nhost_class: pi5\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "p02.yml").write_text("ansible_host: 10.0.1.2\nworkdir: /p2\n")
    inv = load_inventory(path)
    assert [h.name for h in inv.devices] == ["p01", "p02", "p03"]
    p1, p2 = inv.host("p01"), inv.host("p02")
    assert (p1.address, p1.port, p1.user, p1.workdir, p1.host_class) == (
        "p01", 2222, "edge", "/srv/w", "pi5"
    )  # fmt: skip
    assert (p2.address, p2.workdir) == ("10.0.1.2", "/p2")
    assert inv.server.port == 22 and inv.server.python == "python3"


def test_vaulted_value_needs_its_password(tmp_path: Path, monkeypatch) -> None:
    pw, blob = _vault(tmp_path, "pw-1", "s3cret key")
    doc = yaml.safe_dump(_doc())
    path = _write(
        tmp_path, doc + "  vars:\n    lab_protocol_key: " + blob.replace("\n", "\n    ") + "\n"
    )
    assert load_inventory(path, pw).server.vars["lab_protocol_key"] == "s3cret key"
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(pw))
    assert load_inventory(path).devices[0].vars["lab_protocol_key"] == "s3cret key"
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE")
    with pytest.raises(BadInputError, match=r"host '\w+' \(group \w+\): lab_protocol_key: "
                       r"cannot decrypt.*vault password file"):  # fmt: skip
        load_inventory(path)
    wrong = tmp_path / "wrong"
    wrong.write_text("pw-2\n")
    with pytest.raises(BadInputError, match="lab_protocol_key: cannot decrypt"):
        load_inventory(path, wrong)


def test_relative_key_path_is_taken_from_the_inventory_folder(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, _doc(ansible_ssh_private_key_file="keys/id")))
    assert inv.server.key_file == tmp_path / "keys" / "id"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (_doc(ansible_port="ssh"), r"host 'srv' \(group verifiers\): ansible_port: .*integer"),
        (_doc(ansible_port=70000), r"host 'srv' \(group verifiers\): ansible_port: .*65535"),
        (_doc(workdir="{{ nowhere }}"), r"host 'srv' \(group verifiers\): workdir: .*nowhere"),
        (
            {
                "all": {
                    "children": {
                        "drafters": {"hosts": {"d": {"ansible_user": "u", "workdir": "/w"}}}
                    }
                }
            },
            r"at least one host in group 'verifiers'",
        ),
        (
            {"all": {"children": {"verifiers": {"hosts": {"s": {"workdir": "/w"}}}}}},
            r"host 's' \(group verifiers\): missing ansible_user",
        ),
        ("all: [unclosed", r"not a valid Ansible inventory"),
    ],
)
def test_errors_name_file_host_and_key(tmp_path: Path, doc, expected: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(BadInputError, match=expected) as err:
        load_inventory(path)
    assert str(path) in str(err.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"nope.yml: cannot read inventory"):
        load_inventory(tmp_path / "nope.yml")


def test_host_with_two_roles_is_refused(tmp_path: Path) -> None:
    doc = _doc()
    doc["all"]["children"]["drafters"]["hosts"]["srv"] = {}
    with pytest.raises(
        BadInputError, match=r"host 'srv': in drafters and verifiers; a host plays one role"
    ):
        load_inventory(_write(tmp_path, doc))


def test_unknown_host_lookup_names_the_hosts(tmp_path: Path) -> None:
    inv = load_inventory(_write(tmp_path, _doc()))
    with pytest.raises(BadInputError, match=r"no host 'nope' \(hosts: srv, pi1\)"):
        inv.host("nope")


def test_writer_output_reads_back_through_ansible(tmp_path: Path) -> None:
    """What `lab up` writes (dump_inventory) is read back unchanged, by us and by Ansible."""
    hosts = [
        InventoryHost(name="server", role="server", address="10.80.0.1", user="root",
                      workdir="/l/server", netns="tb-x-server", host_class="a100",
                      key_file=tmp_path / "key"),
        InventoryHost(name="dev1", role="device", address="10.80.0.2", user="root",
                      workdir="/l/dev1", host_class="jetson-orin-nano",
                      vars={"draft_model_name": "m"}),
        InventoryHost(name="dev2", role="device", address="10.80.0.3", user="root",
                      workdir="/l/dev2", python="/venv/bin/python"),
        InventoryHost(name="mb", role="middlebox", address="localhost", user="root",
                      workdir="/l/mb", vars={"ansible_connection": "local"}),
    ]  # fmt: skip
    path = _write(tmp_path, dump_inventory(hosts, {"lab_kind": "emulated"}, {"workdir": "/c"}))
    inv = load_inventory(path)
    inherited = [h.model_copy(update={"vars": {"lab_kind": "emulated", **h.vars}}) for h in hosts]
    assert inv.hosts == tuple(inherited[:3]) and inv.middleboxes == (inherited[3],)
    assert inv.vars == {"lab_kind": "emulated"}
    listed = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(path), "--graph"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for line in (
        "@verifiers:",
        "@drafters:",
        "@jetson_orin_nano:",
        "@middleboxes:",
        "@controller:",
    ):
        assert line in listed, listed
