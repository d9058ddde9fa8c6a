"""Measured power: the parsers on the tools' documented output, RAPL counters on a sysfs-shaped
folder, the sampler's summary into status.json and the hosts table, the energy metric and
the `testbed costs` table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from agents.power import (
    PowerSampler,
    PowerSummary,
    Rapl,
    counter_delta,
    detect_source,
    parse_nvidia_smi,
    parse_tegrastats,
    rapl_zones,
)
from agents.records import read_records
from testbed.cli import app
from testbed.config.costs import DEFAULT_CLASSES, CostTable, HostCost, load_cost_table
from testbed.metrics.condition_stats import ConditionStats
from testbed.results.store import ConditionFolder
from testbed.results.tables import tables_from_records

# `tegrastats` lines as the Jetson docs show them: Orin (JetPack 5/6, mW units, a date first)
ORIN = (
    "12-01-2026 03:40:11 RAM 2457/7620MB (lfb 2x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [3%@729,2%@729,0%@729,1%@729,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[305] "
    "cpu@47.562C soc2@45.906C soc0@46.125C gpu@45.218C tj@47.562C soc1@45.75C "
    "VDD_IN 5123mW/4987mW VDD_CPU_GPU_CV 516mW/520mW VDD_SOC 1351mW/1349mW"
)
# ... and Jetson Nano (JetPack 4: the input rail is POM_5V_IN, mW without the unit)
NANO = (
    "RAM 1536/3956MB (lfb 4x4MB) SWAP 0/1978MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [3%@1479,1%@1479,0%@1479,0%@1479] EMC_FREQ 0%@1600 GR3D_FREQ 0%@76 APE 25 "
    "PLL@26C CPU@28.5C PMIC@100C GPU@26.5C AO@34C thermal@27.25C "
    "POM_5V_IN 2304/2260 POM_5V_GPU 0/0 POM_5V_CPU 307/301"
)


def test_nvidia_smi_csv_sums_the_gpus_and_skips_unsupported():
    assert parse_nvidia_smi("71.23\n65.10\n") == pytest.approx(136.33)
    assert parse_nvidia_smi("[N/A]\n250.50\n") == pytest.approx(250.5)
    assert parse_nvidia_smi("[Not Supported]\n") is None
    assert parse_nvidia_smi("") is None


def test_tegrastats_reads_the_current_input_power():
    assert parse_tegrastats(ORIN) == pytest.approx(5.123)  # current, not the 4987 average
    assert parse_tegrastats(NANO) == pytest.approx(2.304)
    assert parse_tegrastats("RAM 1536/3956MB CPU [3%@1479] VDD_SOC 1351mW/1349mW") is None


def test_counter_delta_wraps_at_the_counters_range():
    assert counter_delta(100, 350, 1000) == 250
    assert counter_delta(900, 50, 1000) == 150  # 900 -> 1000 (=0) -> 50


def rapl_zone(root: Path, folder: str, name: str, energy_uj: int, max_range: int) -> Path:
    zone = root / folder
    zone.mkdir(parents=True)
    (zone / "name").write_text(name + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range}\n")
    return zone / "energy_uj"


@pytest.fixture
def powercap(tmp_path):
    """Two packages (one near its wrap point) and a core subzone inside package 0."""
    root = tmp_path / "powercap"
    p0 = rapl_zone(root, "intel-rapl:0", "package-0", 1_000_000, 262_143_328_850)
    p1 = rapl_zone(root, "intel-rapl:1", "package-1", 9_000_000, 10_000_000)
    rapl_zone(root, "intel-rapl:0:0", "core", 5, 262_143_328_850)
    return root, p0, p1


def test_rapl_counts_top_level_zones_across_wraparound(powercap):
    root, p0, p1 = powercap
    zones = rapl_zones(root)
    assert sorted(z.energy for z in zones) == sorted([p0, p1])  # not the core subzone
    rapl = Rapl(zones)
    p0.write_text("3500000\n")  # +2.5 J
    p1.write_text("500000\n")  # wrapped: +1.0 J to the top, +0.5 J after it
    assert rapl.joules() == pytest.approx(4.0)
    assert rapl.joules() == 0.0  # counted from the previous read


def test_rapl_uses_psys_alone_where_present(powercap):
    root, _, _ = powercap
    psys = rapl_zone(root, "intel-rapl:2", "psys", 0, 10_000_000)
    assert [z.energy for z in rapl_zones(root)] == [psys]


def test_no_readable_zone_means_no_source(tmp_path):
    assert rapl_zones(tmp_path / "absent") == []
    broken = tmp_path / "powercap" / "intel-rapl:0"
    broken.mkdir(parents=True)
    (broken / "energy_uj").write_text("not a number\n")
    (broken / "max_energy_range_uj").write_text("100\n")
    assert rapl_zones(tmp_path / "powercap") == []


def test_detection_falls_back_to_rapl_then_to_none(tmp_path, powercap, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))  # no nvidia-smi, no tegrastats
    root, _, _ = powercap
    source = detect_source(root)
    assert isinstance(source, Rapl) and len(source.zones) == 2
    assert detect_source(tmp_path / "absent") is None


def test_sampler_writes_samples_and_totals_the_counted_energy(tmp_path, powercap):
    root, p0, _ = powercap
    records = tmp_path / "records"
    sampler = PowerSampler(records, Rapl(rapl_zones(root)), interval_s=0.01)
    with sampler:
        p0.write_text("6000000\n")  # +5 J while sampling
    summary = sampler.summary
    assert summary.energy_j == pytest.approx(5.0)  # every interval counted, the tail too
    samples = read_records(records / "power.jsonl")
    assert {s["source"] for s in samples} == {"rapl"}
    assert sum(s["joules"] for s in samples) == pytest.approx(5.0)
    assert all(s["watts"] == pytest.approx(s["joules"] / s["dt"]) for s in samples if s["dt"])
    status = summary.as_status()
    assert status["power_source"] == "rapl" and status["energy_j"] == pytest.approx(5.0)
    assert status["power_w"] == pytest.approx(5.0 / summary.seconds)


def test_no_source_writes_nothing(tmp_path):
    with PowerSampler(tmp_path, None) as sampler:
        pass
    assert sampler.summary.as_status() == {}
    assert not (tmp_path / "power.jsonl").exists()


def test_summary_is_energy_over_sampled_time():
    s = PowerSummary("nvidia-smi")
    s.add(100.0, 1.0)  # 100 W for 1 s
    s.add(600.0, 3.0)  # 200 W for 3 s
    assert (s.energy_j, s.seconds, s.power_w) == (700.0, 4.0, 175.0)


def test_status_power_reaches_the_hosts_table(tmp_path):
    """A device's status names it; the server's names no host and takes its folder's name."""
    hosts = tmp_path / "hosts"
    (hosts / "d1").mkdir(parents=True)
    (hosts / "srv").mkdir(parents=True)
    (hosts / "d1" / "requests.jsonl").write_text(
        json.dumps({"dev": "d1", "problem": "p", "t_start": 1.0, "t_end": 3.0, "tokens": 500,
                    "verified_tokens": 500, "fallback_tokens": 0, "rounds": 1}) + "\n"
    )  # fmt: skip
    (hosts / "d1" / "status.json").write_text(json.dumps({"dev": "d1", "t_start": 1.0,
                                                          "t_end": 3.0}))  # fmt: skip
    (hosts / "srv" / "status.json").write_text(
        json.dumps({"role": "server", "t_start": 50.0, "t_end": 53.6, "power_w": 250.0,
                    "energy_j": 900.0, "power_source": "nvidia-smi"})
    )  # fmt: skip
    info = [{"dev": "d1", "role": "device", "host_class": "pi5"},
            {"dev": "srv", "role": "server", "host_class": "a100", "t_start": 0.0,
             "t_end": 9.0}]  # fmt: skip
    nominal = {"pi5": HostCost(price_per_hour=0, power_w=10),
               "a100": HostCost(price_per_hour=0, power_w=400)}  # fmt: skip
    table = CostTable(kwh_price=1.0, classes=nominal)
    metrics = tables_from_records(ConditionFolder(tmp_path), "c", lambda r: r, costs=table,
                                  hosts_info=info)  # fmt: skip
    rows = pd.read_parquet(tmp_path / "hosts.parquet").set_index("dev")
    assert rows.loc["srv", "power_source"] == "nvidia-smi"
    assert rows.loc["srv", "t_end"] - rows.loc["srv", "t_start"] == pytest.approx(3.6)
    assert pd.isna(rows.loc["d1", "power_source"])
    # cost: d1 2 s at nominal 10 W, the server 3.6 s (own clock) at its measured 250 W
    assert metrics["cost_usd"] == pytest.approx((2 * 10 + 3.6 * 250) / 3600 / 1000)
    assert metrics["cost_power"] == "measured on 1 of 2 hosts"
    assert metrics["energy_per_1k_tokens_j"] == pytest.approx(900.0 / 500 * 1000)


def test_energy_per_thousand_tokens_needs_a_measurement():
    requests = pd.DataFrame(
        [dict(dev="d1", problem="p", t_start=0.0, t_end=2.0, tokens=400, verified_tokens=400,
              fallback_tokens=0, rounds=1)]
    )  # fmt: skip
    hosts = pd.DataFrame([dict(dev="d1", t_start=0.0, t_end=2.0, host_class="pi5")])
    s = ConditionStats.from_frames(pd.DataFrame(), requests, hosts)
    assert s.energy_per_1k_tokens_j is None and s.cost_power == "nominal"
    measured = hosts.assign(energy_j=[30.0], power_w=[15.0], power_source=["tegrastats"])
    s = ConditionStats.from_frames(pd.DataFrame(), requests, measured)
    assert s.energy_per_1k_tokens_j == pytest.approx(75.0) and s.cost_power == "measured"


def test_costs_command_shows_the_table_and_its_source(tmp_path):
    runner = CliRunner()
    out = runner.invoke(app, ["costs"])
    assert out.exit_code == 0
    assert "pi5" in out.output and "defaults" in out.output and "nominal" in out.output
    file = tmp_path / "costs.yaml"
    file.write_text("kwh_price: 0.2\nclasses:\n  pi5: {price_per_hour: 0.01, power_w: 6}\n")
    out = runner.invoke(app, ["costs", "--file", str(file)])
    assert out.exit_code == 0
    pi5 = next(line for line in out.output.splitlines() if line.startswith("pi5"))
    assert pi5.split()[1:4] == ["0.01000", "6.0", "0.01120"] and str(file) in pi5
    a100 = next(line for line in out.output.splitlines() if line.startswith("a100"))
    assert a100.endswith("defaults")
    assert load_cost_table(file).classes["a100"] == DEFAULT_CLASSES["a100"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("classes:\n  pi5: {price_per_hour: -1, power_w: 6}\n", "classes.pi5.price_per_hour"),
        ("classes:\n  toaster: {price_per_hour: 1, power_w: 6}\n", "classes.toaster"),
        ("kwh_price: cheap\n", "kwh_price"),
        ("classes:\n  pi5: {price: 1}\n", "classes.pi5"),
    ],
)
def test_costs_command_names_the_file_and_key_of_bad_input(tmp_path, text, says):
    file = tmp_path / "costs.yaml"
    file.write_text(text)
    out = CliRunner().invoke(app, ["costs", "--file", str(file)])
    assert out.exit_code == 2
    assert str(file) in out.output and says in out.output
