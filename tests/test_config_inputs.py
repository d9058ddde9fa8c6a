"""Every input file, whatever its bytes, loads or fails with a BadInputError naming the file;
sweeps past the limit are refused at once; expansion is lazy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from testbed.cli import app
from testbed.config import playbook as playbook_module
from testbed.config.costs import load_cost_table
from testbed.config.playbook import expand, load_playbook
from testbed.core.errors import BadInputError
from testbed.core.loading import MAX_BYTES
from testbed.topo.files import load_topology

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def load_or_bad_input(path: Path) -> None:
    """Loading either works or raises BadInputError whose message names the file."""
    try:
        expand(load_playbook(path), str(path))
    except BadInputError as exc:
        assert str(path) in str(exc)


def load_playbook_and_sweep(path: Path) -> None:
    expand(load_playbook(path), str(path))


LOADERS = {"playbook": load_playbook_and_sweep, "topology": load_topology,
           "cost table": load_cost_table}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(LOADERS))
@FUZZ
@given(data=st.binary(max_size=600))
def test_random_bytes_never_give_a_traceback(tmp_path_factory, kind, data):
    path = tmp_path_factory.mktemp("fuzz") / "input.yaml"
    path.write_bytes(data)
    try:
        LOADERS[kind](path)
    except BadInputError as exc:
        assert str(path) in str(exc)


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(
    ["name", "seed", "lab", "models", "workload", "sled", "link", "sweep", "topology", "mode",
     "workload.slo", "workload.arrival", "link.loss", "sweep.link.loss", "sweep.sled.draft_len"]
)  # fmt: skip


@FUZZ
@given(doc=st.dictionaries(KEYS, YAML_VALUES, max_size=6))
def test_wrongly_typed_playbooks_name_the_file(tmp_path_factory, doc):
    data: dict = {"name": "fuzz"}
    for key, value in doc.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[last] = value
    path = tmp_path_factory.mktemp("fuzz") / "pb.yaml"
    path.write_text(yaml.safe_dump(data))
    load_or_bad_input(path)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"name: caf\xe9\n", "not UTF-8"),
        (b"\x00\x01\x02binary", "NUL"),
        (b"name: t\n" + b"#" * (MAX_BYTES + 1), "bytes, more than"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b"name: t\nseed: 2026-13-45\n", "pb.yaml"),
        (b"name: t\nworkload:\n  slo: {ttft_ms: -1}\n", "workload.slo.ttft_ms"),
        (b"name: t\nworkload:\n  arrival: {process: poisson}\n", "rate_per_s"),
        (b"name: t\nworkload:\n  fewshot: lots\n", "workload.fewshot"),
    ],
)
def test_hostile_files_are_refused_with_the_file_named(tmp_path, content, needle):
    path = tmp_path / "pb.yaml"
    path.write_bytes(content)
    with pytest.raises(BadInputError) as err:
        expand(load_playbook(path), str(path))
    assert str(path) in str(err.value) and needle in str(err.value)


def test_alias_bomb_is_refused_before_it_is_built(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = tmp_path / "pb.yaml"
    path.write_text("\n".join(lines) + "\nname: t\n")
    with pytest.raises(BadInputError, match="expands to .* values"):
        load_playbook(path)


def test_a_folder_or_missing_file_is_named(tmp_path):
    with pytest.raises(BadInputError, match="is a folder"):
        load_playbook(tmp_path)
    with pytest.raises(BadInputError, match="no such file"):
        load_playbook(tmp_path / "absent.yaml")


def huge_sweep(tmp_path: Path) -> Path:
    """8^8 = 16.8 million conditions."""
    keys = ["link.loss", "link.rtt_ms", "link.jitter_ms", "sled.draft_len", "sled.timeout_ms",
            "sled.retries", "sled.window_ms", "workload.seed"]  # fmt: skip
    values = {
        "link.loss": [0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
        "sled.draft_len": [1, 2, 3, 4, 5, 6, 7, 8],
        "sled.retries": [0, 1, 2, 3, 4, 5, 6, 7],
        "workload.seed": [1, 2, 3, 4, 5, 6, 7, 8],
        "link.rtt_ms": [80, 81, 82, 83, 84, 85, 86, 87],
        "link.jitter_ms": [0, 1, 2, 3, 4, 5, 6, 7],
    }
    lines = ["name: big", "sweep:"]
    for key in keys:
        lines.append(f"  {key}: {values.get(key, [1, 2, 3, 4, 5, 6, 7, 8])}")
    path = tmp_path / "big.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_sweep_past_the_limit_is_refused_naming_count_and_keys(tmp_path):
    path = huge_sweep(tmp_path)
    with pytest.raises(BadInputError) as err:
        expand(load_playbook(path), str(path))
    message = str(err.value)
    assert "16,777,216 conditions" in message and "link.loss (8)" in message
    assert "--max-conditions" in message and str(path) in message


def test_an_allowed_large_sweep_is_expanded_lazily(tmp_path, monkeypatch):
    path = huge_sweep(tmp_path)
    sweep = expand(load_playbook(path), str(path), max_conditions=20_000_000)
    assert len(sweep) == 8**8
    calls = []
    real = playbook_module.validate
    monkeypatch.setattr(playbook_module, "validate", lambda *a: calls.append(a[2]) or real(*a))
    it = iter(sweep)
    first, second = next(it), next(it)
    assert (first.index, second.index) == (0, 1)
    assert len(calls) == 2  # only the conditions reached were resolved
    assert second.playbook.workload.seed == 2


def test_validate_command_reports_count_or_the_problem(tmp_path):
    runner = CliRunner()
    good = tmp_path / "ok.yaml"
    good.write_text("name: ok\nsweep:\n  link.loss: [0, 0.1]\n  sled.draft_len: [2, 4]\n")
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0 and "4 conditions" in result.output
    good.write_text(good.read_text() + "workload: {repetitions: 3}\n")
    result = runner.invoke(app, ["validate", str(good)])
    assert "12 conditions (link.loss (2), sled.draft_len (2); 3 repetitions each)" in result.output
    big = huge_sweep(tmp_path)
    result = runner.invoke(app, ["validate", str(big)])
    assert result.exit_code == 2 and "16,777,216" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: t\nsweep:\n  link.loss: [0, 7]\n")
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2 and "link.loss" in result.output


def test_repetitions_multiply_conditions_and_shift_seeds(tmp_path):
    path = tmp_path / "pb.yaml"
    path.write_text(
        "name: t\nworkload:\n  repetitions: 3\n  seed: 10\n  arrival: {process: poisson, "
        "rate_per_s: 1.0, seed: 4}\nsweep:\n  link.loss: [0, 0.1]\n"
    )
    sweep = expand(load_playbook(path), str(path))
    conds = list(sweep)
    assert len(sweep) == len(conds) == 6 and len({c.id for c in conds}) == 6
    # the whole sweep once per repetition: a point's repetitions are spread over the run
    assert [c.values["repetition"] for c in conds] == [0, 0, 1, 1, 2, 2]
    assert [c.values["link.loss"] for c in conds] == [0, 0.1] * 3
    assert [c.playbook.workload.seed for c in conds[::2]] == [10, 11, 12]
    assert [c.playbook.workload.arrival.seed for c in conds[::2]] == [4, 5, 6]
    assert list(sweep.ids()) == [c.id for c in conds]
    with pytest.raises(BadInputError, match=r"repetitions \(3\)"):
        expand(load_playbook(path), str(path), max_conditions=5)


def test_validate_checks_a_huge_allowed_sweep_value_by_value(tmp_path):
    path = huge_sweep(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(path), "--max-conditions", "20000000"])
    assert result.exit_code == 0, result.output
    assert "16,777,216 conditions" in result.output and "on its own" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("sled.retries: [0,", "sled.retries: [-1,"))
    result = runner.invoke(app, ["validate", str(bad), "--max-conditions", "20000000"])
    assert result.exit_code == 2 and "sled.retries=-1" in result.output


def test_lab_impair_profile_file_errors_name_the_file_and_field(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "wifi.yaml"
    bad.write_text("rtt_ms: 85\nloss_up: {p: 0.01, r: 2.0}\n")
    result = runner.invoke(app, ["lab", "impair", "--profile", str(bad), "--name", "zz"])
    assert result.exit_code == 2, result.output
    assert "wifi.yaml" in result.output and "loss_up" in result.output
    both = runner.invoke(app, ["lab", "impair", "--profile", str(bad), "--loss", "0.1"])
    assert both.exit_code == 2 and "drop the options ['loss']" in both.output
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\xff\xfe\x00garbage")
    result = runner.invoke(app, ["lab", "impair", "--profile", str(junk), "--name", "zz"])
    assert result.exit_code == 2 and "junk.yaml" in result.output


def test_a_playbooks_cost_file_is_checked_when_the_playbook_loads(tmp_path):
    (tmp_path / "costs.yaml").write_text("classes:\n  pi5: {price_per_hour: -1, power_w: 3}\n")
    path = tmp_path / "pb.yaml"
    path.write_text("name: t\ncosts: costs.yaml\n")
    with pytest.raises(BadInputError, match=r"costs.yaml: classes.pi5.price_per_hour"):
        load_playbook(path)
    (tmp_path / "costs.yaml").write_text("kwh_price: 0.2\n")
    assert load_playbook(path).costs == str(tmp_path / "costs.yaml")
