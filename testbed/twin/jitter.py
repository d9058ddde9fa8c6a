"""The twin's jitter draws, of the law the packet holder uses (`links.model.standard_jitter`).

Uniform is drawn one at a time from the twin's own generator (as before); normal, pareto and
paretonormal come in blocks from a numpy generator seeded with the twin's seed, since a draw
each from numpy costs microseconds and a fleet sends millions of packets."""

from __future__ import annotations

import random

import numpy as np

from testbed.links.model import standard_jitter
from testbed.topo.profile import JitterDist

BLOCK = 4096


class JitterDraws:
    """Standard draws of `dist` (half-width 1 for uniform, else sigma 1), one per call."""

    def __init__(self, dist: JitterDist, rng: random.Random, seed: int) -> None:
        self.dist, self.rng = dist, rng
        self.np_rng = np.random.default_rng(seed)
        self.block: list[float] = []

    def draw(self) -> float:
        if self.dist == "uniform":
            return self.rng.uniform(-1.0, 1.0)
        if not self.block:
            self.block = standard_jitter(self.np_rng, self.dist, (BLOCK,)).tolist()
        return self.block.pop()
