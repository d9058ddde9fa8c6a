"""Measured power of this host, sampled in the background while an agent runs.

Sources, the first one that works on this host:
- `nvidia-smi`: the GPU boards' draw, summed over GPUs (the GPUs only, not the host);
- `tegrastats` (Jetson): the module's input rail, `VDD_IN` (Orin, Xavier) or `POM_5V_IN`
  (Nano, TX2), current value of each `current/average` pair, in mW;
- Intel RAPL (`/sys/class/powercap/intel-rapl:*`): energy counter deltas of the top-level
  zones (`psys` alone where present, it covers the packages), wrapping at
  `max_energy_range_uj`.

Each sample covers the interval since the previous one: its energy is counted (RAPL) or
the reading times the interval (the others, instantaneous readings); it goes to
`power.jsonl` as {t, dt, watts, joules, source}, watts = joules / dt. Energy = sum(joules_i)
and mean power = energy / sum(dt_i), over the samples that read. Where no source exists
nothing is written and the summary is empty (the controller then uses the class's nominal
power).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agents.records import RecordWriter

NVIDIA_SMI_QUERY = ["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"]
TEGRA_INPUT = re.compile(r"\b(?:VDD_IN|POM_5V_IN)\s+(\d+)(?:mW)?/(\d+)(?:mW)?")
RAPL_ROOT = Path("/sys/class/powercap")
RAPL_ZONE = re.compile(r"intel-rapl:\d+$")  # top level; `intel-rapl:0:1` is inside zone 0


def parse_nvidia_smi(text: str) -> float | None:
    """Watts summed over the GPUs of `nvidia-smi --query-gpu=power.draw --format=csv,
    noheader,nounits` output (one line per GPU); None when no GPU reports a number
    (`[N/A]`, `[Not Supported]`)."""
    watts = []
    for line in text.splitlines():
        try:
            watts.append(float(line.strip()))
        except ValueError:
            continue
    return sum(watts) if watts else None


def parse_tegrastats(line: str) -> float | None:
    """Watts of the module input rail in one tegrastats line (`VDD_IN 5123mW/5123mW`, or
    `POM_5V_IN 2304/2304` on older releases: current/average in mW); None without one."""
    match = TEGRA_INPUT.search(line)
    return int(match.group(1)) / 1000 if match else None


def counter_delta(before: int, after: int, max_range: int) -> int:
    """Energy counted between two readings of a counter that wraps to 0 at max_range."""
    return after - before if after >= before else after + max_range - before


Reading = tuple[float, float | None]  # (interval in s, joules over it or None: no reading)


class Source(Protocol):
    name: str

    def stream(self, interval_s: float, stop: threading.Event) -> Iterator[Reading]:
        """Yield a reading per interval until stop is set, then one for the tail."""
        ...

    def close(self) -> None: ...


def ticks(interval_s: float, stop: threading.Event) -> Iterator[float]:
    """The length of each interval_s wait until stop is set, the last one cut short by it."""
    t_prev = time.monotonic()
    while True:
        stopped = stop.wait(interval_s)
        now = time.monotonic()
        yield now - t_prev
        t_prev = now
        if stopped:
            return


class NvidiaSmi:
    """Polls `nvidia-smi` once per interval."""

    name = "nvidia-smi"

    def read(self) -> float | None:
        """Watts now, summed over the GPUs; None when nvidia-smi fails or reports none."""
        try:
            out = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return parse_nvidia_smi(out.stdout) if out.returncode == 0 else None

    def stream(self, interval_s: float, stop: threading.Event) -> Iterator[Reading]:
        for dt in ticks(interval_s, stop):
            watts = self.read()
            yield dt, None if watts is None else watts * dt

    def close(self) -> None:
        pass


class Tegrastats:
    """Reads the lines of `tegrastats --interval MS`, one per interval."""

    name = "tegrastats"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def stream(self, interval_s: float, stop: threading.Event) -> Iterator[Reading]:
        command = ["tegrastats", "--interval", str(max(1, round(interval_s * 1000)))]
        if stop.is_set():
            return
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        assert self.proc.stdout is not None
        try:
            t_prev = time.monotonic()
            for line in self.proc.stdout:  # ends when close() stops the process
                now = time.monotonic()
                watts = parse_tegrastats(line)
                yield now - t_prev, None if watts is None else watts * (now - t_prev)
                t_prev = now
                if stop.is_set():
                    return
        finally:
            self.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=5)


@dataclass(frozen=True)
class RaplZone:
    energy: Path  # energy_uj
    max_range: int  # max_energy_range_uj

    def read(self) -> int:
        return int(self.energy.read_text())


def rapl_zones(root: Path = RAPL_ROOT) -> list[RaplZone]:
    """The readable top-level RAPL zones: `psys` alone where there is one (it includes the
    packages), else every package zone."""
    zones: dict[str, RaplZone] = {}
    for folder in sorted(root.glob("intel-rapl:*")):
        if not RAPL_ZONE.fullmatch(folder.name):
            continue
        try:
            zone = RaplZone(folder / "energy_uj", int((folder / "max_energy_range_uj").read_text()))
            zone.read()
        except (OSError, ValueError):  # absent, or root-only (kernels since 5.10)
            continue
        name = (folder / "name").read_text().strip() if (folder / "name").exists() else ""
        zones[name or folder.name] = zone
    return [zones["psys"]] if "psys" in zones else list(zones.values())


class Rapl:
    """Energy counter deltas of RAPL zones, read once per interval."""

    name = "rapl"

    def __init__(self, zones: list[RaplZone]) -> None:
        self.zones = zones
        self.last = [z.read() for z in zones]

    def joules(self) -> float:
        """Energy counted by the zones since the previous call (or construction)."""
        counts = [z.read() for z in self.zones]
        total = sum(
            counter_delta(a, b, z.max_range) for a, b, z in zip(self.last, counts, self.zones)
        )
        self.last = counts
        return total / 1e6

    def stream(self, interval_s: float, stop: threading.Event) -> Iterator[Reading]:
        for dt in ticks(interval_s, stop):  # the first one counts from construction
            yield dt, self.joules()

    def close(self) -> None:
        pass


def detect_source(rapl_root: Path = RAPL_ROOT) -> Source | None:
    """The first power source that works here: nvidia-smi, tegrastats, RAPL; else None."""
    if shutil.which("nvidia-smi"):
        try:
            if NvidiaSmi().read() is not None:
                return NvidiaSmi()
        except (OSError, subprocess.SubprocessError):
            pass
    if shutil.which("tegrastats"):
        return Tegrastats()
    zones = rapl_zones(rapl_root)
    return Rapl(zones) if zones else None


@dataclass
class PowerSummary:
    """What the samples add up to (see the module docstring)."""

    source: str
    energy_j: float = 0.0
    seconds: float = 0.0

    def add(self, joules: float, dt: float) -> None:
        self.energy_j += joules
        self.seconds += dt

    @property
    def power_w(self) -> float | None:
        return self.energy_j / self.seconds if self.seconds > 0 else None

    def as_status(self) -> dict[str, Any]:
        """The status.json fields: power_w, energy_j, power_source (none without samples)."""
        if self.power_w is None:
            return {}
        return {"power_w": self.power_w, "energy_j": self.energy_j, "power_source": self.source}


class PowerSampler:
    """Samples `source` every interval_s in a thread into `<records>/power.jsonl`, from
    entering the context to leaving it; `summary` holds the totals."""

    def __init__(
        self, records: Path, source: Source | None = None, interval_s: float = 1.0
    ) -> None:
        self.records = records
        self.source = source
        self.interval_s = interval_s
        self.summary = PowerSummary(source.name if source else "")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        assert self.source is not None
        with RecordWriter(self.records) as writer:
            for dt, joules in self.source.stream(self.interval_s, self._stop):
                if joules is None:
                    continue
                self.summary.add(joules, dt)
                watts = joules / dt if dt > 0 else None
                sample = {"t": time.time(), "dt": dt, "watts": watts, "joules": joules}
                writer.write("power", {**sample, "source": self.source.name})

    def __enter__(self) -> PowerSampler:
        if self.source is not None:
            self._thread = threading.Thread(target=self._run, name="power", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (idempotent); `summary` is final afterwards."""
        self._stop.set()
        if self.source is not None:
            self.source.close()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 5)
            self._thread = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
