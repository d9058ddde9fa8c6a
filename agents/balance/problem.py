"""The scheduling problem (docs/balance.md): users, modes, demands, capacities, schedules.

Each user i has, per mode m in (AD, SD), a compute demand u[i, m] (the fraction of the
server's time it needs to finish by its deadline: its server work over its deadline) and a
memory demand w[i, m] (bytes of KV cache, and its rows of the step's logits). A mode that
serves anyone also pays a setup: setup_compute[m] and setup_memory[m] (the small model's
weights for SD). The large model's weights are always resident and are taken out of the
memory capacity before it reaches an `Instance`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from agents.balance.costmodel import CostModel
from agents.balance.modes import AD, SD, UNSERVED

TOLERANCE = 1e-9  # relative slack allowed on a capacity (floating point only)


@dataclass(frozen=True)
class Users:
    """Per-user prompt and output lengths (tokens) and deadline (seconds from arrival)."""

    prompt: np.ndarray
    output: np.ndarray
    deadline: np.ndarray

    def __len__(self) -> int:
        return len(self.prompt)


@dataclass(frozen=True)
class Instance:
    """Demands (n x 2: columns AD, SD) and capacities of one scheduling problem."""

    compute: np.ndarray
    memory: np.ndarray
    compute_capacity: float = 1.0
    memory_capacity: float = 1.0
    setup_compute: np.ndarray = field(default_factory=lambda: np.zeros(2))
    setup_memory: np.ndarray = field(default_factory=lambda: np.zeros(2))

    def __len__(self) -> int:
        return len(self.compute)


@dataclass(frozen=True)
class Service:
    """How the server runs its modes: step rates (the compute split) and the period."""

    ad_steps_per_s: float
    sd_rounds_per_s: float
    period_s: float = 0.05

    def rate(self, mode: int) -> float:
        return self.ad_steps_per_s if mode == AD else self.sd_rounds_per_s


def default_service(cost: CostModel, fixed_share: float = 0.25, period_s: float = 0.05) -> Service:
    """Step rates at which each mode's fixed step cost takes fixed_share of the server."""
    return Service(
        ad_steps_per_s=fixed_share / cost.step_cost(AD).fixed_s,
        sd_rounds_per_s=fixed_share / cost.step_cost(SD).fixed_s,
        period_s=period_s,
    )


SD_PACE_HEADROOM = 0.9  # SD serves a user only up to this share of its rounds' mean pace


def top_pace(cost: CostModel, service: Service, mode: int) -> float:
    """The fastest pace (tokens/s) mode serves a user at. An AD step gives every user one
    token, so AD's is its step rate. An SD round gives a user 1..g+1 tokens, and the mean is
    the workload's: a user paced at SD's very mean rate is in every round and finishes late
    whenever its rounds yield less than the mean (in the lab a user at 91 % of it did), so
    SD's is its round rate times the mean tokens per round, less a headroom."""
    if mode == AD:
        return service.rate(AD)
    return SD_PACE_HEADROOM * service.rate(SD) * cost.tokens_per_step(SD)


@dataclass(frozen=True)
class Demands:
    """Per user and mode (n x 2, columns AD, SD): compute share, memory, pace (tokens/s),
    and window: the seconds a user started on arrival has to make its tokens (d_eff)."""

    compute: np.ndarray
    memory: np.ndarray
    pace: np.ndarray
    window: np.ndarray


def user_demands(cost: CostModel, users: Users, service: Service) -> Demands:
    """What each user needs in each mode; np.inf compute where the mode cannot make it.

    A user waits up to one period to be admitted, then its prompt is prefilled, and its last
    step may come up to a period late (steps run in bursts each period); in the time left,
    d_eff = d - 2 period - prefill, it needs o tokens: a pace of o / d_eff tokens per second,
    which its mode's step rate must reach. Its compute share is its own work (prefill, and
    the per-sequence cost of the steps it is in) over d_eff; the steps' fixed cost is the
    mode's setup.
    """
    cols = []
    for mode in (AD, SD):
        step = cost.step_cost(mode)
        per_step = cost.tokens_per_step(mode)
        prefill = cost.prefill_s(mode, users.prompt.astype(float))
        d_eff = users.deadline - 2 * service.period_s - prefill
        pace = np.where(d_eff > 0, users.output / np.maximum(d_eff, 1e-12), np.inf)
        work = prefill + step.per_seq_s * users.output / per_step
        ok = pace <= top_pace(cost, service, mode)
        share = np.where(ok, work / np.maximum(d_eff, 1e-12), np.inf)
        memory = cost.user_bytes(mode, (users.prompt + users.output).astype(float))
        cols.append((share, memory, pace, d_eff))
    ad, sd = cols
    return Demands(*(np.stack([ad[k], sd[k]], axis=1) for k in range(4)))


@dataclass(frozen=True)
class Timing:
    """When users arrive and how a later start raises what they need.

    A user's first period of waiting is inside its margin (`user_demands`). Started w seconds
    after that, it has window - w seconds left for the same tokens and work, so its pace and
    compute share grow by window / (window - w); the start is too late once the window is
    gone or the pace exceeds what its mode can step at (`top_pace`). Whatever start, it holds
    its resources until at most its absolute deadline (`end`).
    """

    arrival: np.ndarray  # absolute, seconds
    deadline: np.ndarray  # seconds from arrival
    window: np.ndarray  # n x 2
    pace: np.ndarray  # n x 2, tokens/s when started on arrival
    top_pace: np.ndarray  # per mode (AD, SD): tokens/s its step rate gives a user
    period_s: float

    def end(self, i: int) -> float:
        return float(self.arrival[i] + self.deadline[i])

    def slowdown(self, i: int, mode: int, start: float) -> float | None:
        """Factor on user i's pace and share in mode when started at `start`; None: too late."""
        col = mode - 1
        late = max(0.0, start - float(self.arrival[i]) - self.period_s)
        left = float(self.window[i, col]) - late
        if left <= 0:
            return None
        factor = float(self.window[i, col]) / left
        return factor if self.pace[i, col] * factor <= self.top_pace[col] else None


def timing_of(
    cost: CostModel, users: Users, arrival: np.ndarray, service: Service, demands: Demands
) -> Timing:
    """The users' timing on a server running `service`."""
    top = np.array([top_pace(cost, service, m) for m in (AD, SD)])
    return Timing(
        arrival=np.asarray(arrival, dtype=float),
        deadline=np.asarray(users.deadline, dtype=float),
        window=demands.window,
        pace=demands.pace,
        top_pace=top,
        period_s=service.period_s,
    )


def make_instance(
    cost: CostModel,
    users: Users,
    memory_budget: float,
    service: Service,
    demands: Demands | None = None,
) -> Instance:
    """The instance for users on a server with memory_budget bytes in all (`demands`: the
    users' `user_demands`, when the caller has them already)."""
    demands = demands or user_demands(cost, users, service)
    return Instance(
        compute=demands.compute,
        memory=demands.memory,
        compute_capacity=1.0,
        memory_capacity=memory_budget - cost.target.weights_bytes,
        setup_compute=np.array([_setup_share(cost, service, m) for m in (AD, SD)]),
        setup_memory=np.array([0.0, float(cost.draft.weights_bytes)]),
    )


def _setup_share(cost: CostModel, service: Service, mode: int) -> float:
    """Server share an open mode takes whoever it serves: its steps' fixed cost at its rate,
    and one step per period that runs after the loop slept (caches cold)."""
    step = cost.loop_step(mode)
    return step.busy.fixed_s * service.rate(mode) + step.wake_s / service.period_s


def servable_alone(inst: Instance) -> np.ndarray:
    """Per user: whether some mode could serve it in time on an otherwise empty server (its
    share and memory fit beside that mode's setup). Admission refuses every other user, so
    no policy serves more than these."""
    fits = [
        (inst.compute[:, col] + inst.setup_compute[col] <= inst.compute_capacity)
        & (inst.memory[:, col] + inst.setup_memory[col] <= inst.memory_capacity)
        for col in (0, 1)
    ]
    return fits[0] | fits[1]


@dataclass(frozen=True)
class Usage:
    compute: float
    memory: float
    ad_compute: float  # the AD share of server time (setup included)
    sd_compute: float


def usage(inst: Instance, modes: np.ndarray) -> Usage:
    """Compute and memory a mode assignment uses, setups included."""
    parts = []
    for col, mode in ((0, AD), (1, SD)):
        chosen = modes == mode
        opened = bool(chosen.any())
        parts.append(
            (
                inst.compute[chosen, col].sum() + opened * inst.setup_compute[col],
                inst.memory[chosen, col].sum() + opened * inst.setup_memory[col],
            )
        )
    (ad_c, ad_m), (sd_c, sd_m) = parts
    return Usage(ad_c + sd_c, ad_m + sd_m, ad_c, sd_c)


def is_feasible(inst: Instance, modes: np.ndarray) -> bool:
    """Whether the assignment fits both capacities."""
    use = usage(inst, modes)
    return use.compute <= inst.compute_capacity * (1 + TOLERANCE) and (
        use.memory <= inst.memory_capacity * (1 + TOLERANCE)
    )


@dataclass(frozen=True)
class Schedule:
    """A mode per user (UNSERVED, AD or SD) and what it uses."""

    modes: np.ndarray
    usage: Usage

    @property
    def served(self) -> int:
        return int((self.modes != UNSERVED).sum())

    @property
    def ad_share(self) -> float:
        """Fraction of the used server time that goes to the AD batch (the compute split)."""
        total = self.usage.compute
        return self.usage.ad_compute / total if total > 0 else 0.0


def schedule_of(inst: Instance, modes: np.ndarray) -> Schedule:
    modes = np.asarray(modes, dtype=np.int8)
    return Schedule(modes=modes, usage=usage(inst, modes))
