"""The packet holder's model of a link (holder.c), in numbers: what it does to a stream of packets.

One direction of a link, as the holder runs it: a packet that reaches the holder at `at` is lost
by the direction's loss in force, or is due at `at + delay + jitter`, never before `at`, with
`jitter` drawn from the profile's distribution (holder.c's `jitter`):
- uniform: [-j, +j] (netem's default);
- normal: sigma j;
- pareto: Pareto(shape 3, scale 1) moved to mean 0 and scaled to sigma j (a long upper tail;
  its median is 0.28 j below its mean);
- paretonormal: pareto with probability 1/4, else normal.
With `order: keep` a packet due before its predecessor waits for it (due = the larger of its
own and the previous packet's), so where jitter exceeds the spacing of packets the realized
delays shift upward; with `order: reorder` each packet leaves when its own delay says. Lost
packets hold nothing up. A round trip is the up leg plus the down leg, the echo entering the
down direction as its request leaves the up one.

`round_trips` simulates that for given packets, many times over with the profile's seed: the
expected RTT of each packet as a sample, from which the link guard and calibration take
quantiles and distances. Loss here is independent per packet at the mean rate in force (a
Gilbert-Elliott chain's bursts change which packets hold others up, not the delays' law).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.topo.profile import JitterDist, Order

PARETO_SHAPE = 3.0
PARETO_MEAN, PARETO_SIGMA = 1.5, 0.8660254037844386  # of Pareto(3, 1): 3/2 and sqrt(3)/2
PARETONORMAL_PARETO_SHARE = 0.25
REPLICAS = 200  # simulated runs of the probe's packets


def standard_jitter(
    rng: np.random.Generator, dist: JitterDist, shape: tuple[int, ...]
) -> np.ndarray:
    """Draws of `dist` for jitter 1 (a half-width of 1 for uniform, else a sigma of 1)."""
    if dist == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    if dist == "normal":
        return rng.standard_normal(shape)
    pareto = (rng.uniform(0.0, 1.0, shape) ** (-1 / PARETO_SHAPE) - PARETO_MEAN) / PARETO_SIGMA
    if dist == "pareto":
        return pareto
    return np.where(rng.uniform(0.0, 1.0, shape) < PARETONORMAL_PARETO_SHARE, pareto,
                    rng.standard_normal(shape))  # fmt: skip


@dataclass(frozen=True)
class Leg:
    """One direction as each packet meets it: arrival (ms, any origin), and the one-way delay,
    jitter (ms) and mean loss in force then; one value per packet, in arrival order."""

    at_ms: np.ndarray
    delay_ms: np.ndarray
    jitter_ms: np.ndarray
    loss: np.ndarray


def hold(
    rng: np.random.Generator,
    leg: Leg,
    dist: JitterDist,
    order: Order,
    replicas: int = REPLICAS,
    at_ms: np.ndarray | None = None,
) -> np.ndarray:
    """(replicas, packets) release times (ms) of the packets of `leg`, NaN where lost; `at_ms`
    (replicas, packets) replaces the leg's arrivals where each replica has its own."""
    n = len(leg.delay_ms)
    at = np.broadcast_to(leg.at_ms if at_ms is None else at_ms, (replicas, n))
    due = at + leg.delay_ms + leg.jitter_ms * standard_jitter(rng, dist, (replicas, n))
    due = np.maximum(due, at)
    lost = rng.uniform(0.0, 1.0, (replicas, n)) < leg.loss
    if order == "keep":  # in arrival order, each no earlier than the last one held before it
        arrival = np.argsort(at, axis=1, kind="stable")
        ordered = np.take_along_axis(np.where(lost, -np.inf, due), arrival, axis=1)
        np.put_along_axis(due, arrival, np.maximum.accumulate(ordered, axis=1), axis=1)
    return np.where(lost, np.nan, due)


def round_trips(
    seed: int | None,
    up: Leg,
    down: Leg,
    dist: JitterDist,
    order: Order,
    replicas: int = REPLICAS,
) -> np.ndarray:
    """(replicas, packets) simulated RTTs (ms) of the packets of `up`, NaN where lost either
    way; `down`'s arrivals are ignored (each echo enters as its request leaves) but its delay,
    jitter and loss are each packet's down leg."""
    rng = np.random.default_rng(seed)
    up_out = hold(rng, up, dist, order, replicas)
    back = hold(rng, down, dist, order, replicas, at_ms=np.nan_to_num(up_out, nan=np.inf))
    return np.where(np.isnan(up_out), np.nan, back - np.asarray(up.at_ms))
