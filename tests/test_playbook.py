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
