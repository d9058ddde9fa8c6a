"""CPU time the hypervisor took from this VM (`steal` in /proc/stat), to tell a VM stall from a
fault of the code measured: a run that lost tens of milliseconds to steal shows it in its tail."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

PROC_STAT = Path("/proc/stat")


def steal_ms(stat: Path = PROC_STAT) -> float | None:
    """Steal time of all CPUs together since boot, in ms; None where the kernel reports none."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if len(first) < 9 or first[0] != "cpu" or not first[8].isdigit():
        return None
    return int(first[8]) * 1000.0 / os.sysconf("SC_CLK_TCK")


class StealSampler:
    """Samples `steal_ms` every `every_s` seconds in a thread, so that the steal of any
    window inside the sampling (a calibration profile, a condition) can be told afterwards."""

    def __init__(self, every_s: float = 0.1, stat: Path = PROC_STAT) -> None:
        self.every_s, self.stat = every_s, stat
        self.samples: list[tuple[float, float]] = []  # (wall-clock s, steal ms since boot)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steal-sampler", daemon=True)

    def _sample(self) -> None:
        value = steal_ms(self.stat)
        if value is not None:
            self.samples.append((time.time(), value))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> StealSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def between(self, start: float, end: float) -> float | None:
        """Steal in ms between two wall-clock times inside the sampling (interpolated between
        samples); None where the kernel reports none or the window is not covered."""
        if len(self.samples) < 2 or start < self.samples[0][0] or end > self.samples[-1][0]:
            return None
        at, value = zip(*self.samples, strict=True)
        return float(np.interp(end, at, value) - np.interp(start, at, value))
