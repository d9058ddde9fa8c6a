"""Admission control: a user the schedule cannot serve in time is refused at once, with a reason.

At each period boundary the users who arrived during the period are admitted by the scheduler
(`algorithm.schedule`) on the compute share and memory still free, without moving anyone
already admitted; each user left out is refused and told which resource is short. Which
modes may open is planned on a window of recent arrivals (`plan_modes`).
The plan also prices compute and memory (its LP's dual values); the hybrid then admits each
arrival into the open mode where its priced demand is least, and refuses one whose priced
demand is too high (`offer_priced`). A user's compute demand is its work over its deadline;
it keeps that share until it finishes (at the latest by its deadline), when `release`
returns both resources. When the plan finds that nothing binds (`Plan.slack`), a user who
fits nowhere now may be admitted with a later start within its slack, on a timeline of what
every admitted user holds until its deadline (`AdmissionController.start_due` starts it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.balance.algorithm import prices, schedule, served_all_open
from agents.balance.modes import AD, MODE_NAMES, SD, UNSERVED
from agents.balance.problem import TOLERANCE, Instance, Schedule, Timing


@dataclass(frozen=True)
class Decision:
    mode: int  # UNSERVED when refused
    reason: str
    waits: bool = False  # admitted with a later start (`AdmissionController.start_due`)

    @property
    def admitted(self) -> bool:
        return self.mode != UNSERVED


def refusal_reason(
    compute: np.ndarray,
    memory: np.ndarray,
    free_c: float,
    free_m: float,
    modes: tuple[int, ...] = (AD, SD),
    setup_compute: np.ndarray | None = None,
    setup_memory: np.ndarray | None = None,
    runs: tuple[int, ...] | None = None,
) -> str:
    """Why a user with demands (AD, SD) fits in none of `modes` (those it was offered; the
    server runs `runs`, default `modes`), naming the short resource.

    setup_compute and setup_memory: what opening each mode would still cost (zero for a
    mode already open)."""
    runs = modes if runs is None else runs
    setup_c = np.zeros(2) if setup_compute is None else setup_compute
    setup_m = np.zeros(2) if setup_memory is None else setup_memory
    can = [m for m in (AD, SD) if np.isfinite(compute[m - 1])]
    if not can:
        return "deadline too short: neither mode steps fast enough to make its tokens in time"
    usable = [m for m in can if m in modes]
    if not usable:
        names = " or ".join(MODE_NAMES[m] for m in can)
        ran = " and ".join(MODE_NAMES[m] for m in runs)
        return f"only {names} can make its deadline, and this server runs {ran} only"
    best = min(usable, key=lambda m: compute[m - 1])
    col = best - 1
    if compute[col] > 1:
        return (
            f"deadline too short: even alone it needs {compute[col]:.2f}x the server's time "
            "before its deadline"
        )
    parts = []
    setup = " with the mode's setup" if setup_c[col] or setup_m[col] else ""
    need_c, need_m = compute[col] + setup_c[col], memory[col] + setup_m[col]
    if need_c > free_c:
        parts.append(f"compute: needs {need_c:.3f} of the server's time{setup}, {free_c:.3f} free")
    if need_m > free_m:
        mib = 2**20
        parts.append(f"memory: needs {need_m / mib:.2f} MiB{setup}, {free_m / mib:.2f} MiB free")
    detail = "; ".join(parts) or "what is free went to other users, more of whom fit"
    if len(runs) == 1:
        return f"no room in {MODE_NAMES[best]}: {detail}"
    return f"no mode fits ({MODE_NAMES[best]} would be cheapest): {detail}"


def refusals(
    inst: Instance,
    sched: Schedule,
    modes: tuple[int, ...] = (AD, SD),
    runs: tuple[int, ...] | None = None,
) -> dict[int, str]:
    """Reasons for every user an offline schedule over `modes` leaves out (the server runs
    `runs`, default `modes`)."""
    free_c = inst.compute_capacity - sched.usage.compute
    free_m = inst.memory_capacity - sched.usage.memory
    opened = [bool((sched.modes == m).any()) for m in (AD, SD)]
    setup_c = np.where(opened, 0.0, inst.setup_compute)
    setup_m = np.where(opened, 0.0, inst.setup_memory)
    return {
        int(i): refusal_reason(
            inst.compute[i], inst.memory[i], free_c, free_m, modes, setup_c, setup_m, runs
        )
        for i in np.flatnonzero(sched.modes == UNSERVED)
    }


PLAN_HEADROOM = 0.9  # the plan fills this share of each capacity: arrivals come in bursts
PRICE_LIMIT = 1.5  # a user whose priced demand exceeds this is refused (the LP's cut-off is 1)
PRICE_MIN_USERS = 5  # a plan on fewer arrivals sets no prices: too few to tell what binds


@dataclass(frozen=True)
class Plan:
    """Which modes may open, and what compute and memory are worth (the plan LP's duals).

    A user's priced demand in mode m is (price_compute u_im + price_memory w_im) times its
    hold, the share of the plan's window it holds them (its deadline over the window's span).
    """

    modes: tuple[int, ...]
    allowed: tuple[int, ...] = (AD, SD)
    priced: bool = False  # False: too few arrivals to price; admit by the scheduler
    price_compute: float = 0.0
    price_memory: float = 0.0
    span_s: float = 1.0

    @property
    def slack(self) -> bool:
        """Neither resource binds over the plan's window: a user who waits for a later start
        then takes capacity no later arrival needs (under load such waits crowd out the
        users who would arrive into the freed capacity, so none is offered)."""
        return self.priced and self.price_compute == 0 and self.price_memory == 0

    def cost(self, compute: np.ndarray, memory: np.ndarray, deadline: float) -> np.ndarray:
        """A user's priced demand in each mode (columns AD, SD)."""
        hold = deadline / self.span_s
        finite = np.isfinite(compute)  # inf: the mode cannot step fast enough for the user
        c = np.where(finite, compute, 0.0)
        return np.where(
            finite, (self.price_compute * c + self.price_memory * memory) * hold, np.inf
        )


def plan_modes(
    inst: Instance,
    window: np.ndarray,
    deadline: np.ndarray,
    span_s: float,
    allowed: tuple[int, ...],
) -> Plan:
    """Plan on a window of recent arrivals: the modes worth opening and the resources' prices.

    The window's users arrived over span_s seconds and each holds its share for about its
    deadline, so over the span it takes its demands times deadline / span_s on average
    (Little's law): the plan solves that time-averaged problem, at PLAN_HEADROOM of each
    capacity, which sees the resource that binds in the long run, where admitting each
    period's few arrivals on what is free cannot. Both modes open when the scheduler uses
    both, or when paying both setups serves more (users only the other mode can serve in
    time then find it open). At a tie the second mode stays shut: its setup would only load
    the loop (its fixed steps, and plans that weigh two modes), which in the lab made
    periods start late and cost a user near SD's pace its window, at a memory budget where
    SD alone served everyone; so where memory does not bind the hybrid serves as SD-only
    does. Fewer than PRICE_MIN_USERS arrivals set no prices
    and open only the modes their schedule uses: on a user or two, paying both setups always
    "serves as many", and a server that opened both for its first arrivals kept paying both
    while those users ran (100 simulated users, 12 MiB: 31 in time, against 39 and 41 for
    the single modes). A user only a shut mode can serve may still open it
    (`AdmissionController.offer_batch`).
    """
    hold = deadline[window] / span_s
    sub = Instance(
        compute=inst.compute[window] * hold[:, None],
        memory=inst.memory[window] * hold[:, None],
        compute_capacity=inst.compute_capacity * PLAN_HEADROOM,
        memory_capacity=inst.memory_capacity * PLAN_HEADROOM,
        setup_compute=inst.setup_compute,
        setup_memory=inst.setup_memory,
    )
    best = schedule(sub, allowed)
    modes = tuple(m for m in allowed if (best.modes == m).any()) or allowed
    if len(window) < PRICE_MIN_USERS:  # provisional: the modes these few users need
        return Plan(modes, allowed)
    if len(modes) < len(allowed) and served_all_open(sub, allowed) > best.served:
        modes = allowed
    return Plan(modes, allowed, True, *prices(sub, modes), span_s)


@dataclass
class Hold:
    """What an admitted user holds, from `start` until it finishes (at most `end`)."""

    mode: int
    compute: float
    memory: float
    start: float
    end: float
    started: bool = False


@dataclass(frozen=True)
class Start:
    """A user the loop serves from now: its mode, pace (tokens/s) and when its pace counts from."""

    uid: int
    mode: int
    pace: float
    since: float


class AdmissionController:
    """Online admission against the compute share and memory of one server, over time.

    Every admitted user holds its mode's demands from its start until it finishes, at the
    latest by its deadline. With `timing`, a user that fits no mode now but would fit once
    running users reach their deadlines is admitted at once with a later start (it waits
    within its slack, and its pace and share grow for the shorter time left), and later
    arrivals are admitted only where they leave every such start intact. Without it, users
    start on admission and hold until released.
    """

    def __init__(self, inst: Instance, timing: Timing | None = None) -> None:
        self.inst = inst
        self.timing = timing
        self.holds: dict[int, Hold] = {}
        self.now = 0.0

    @property
    def members(self) -> dict[int, int]:
        """Started users per mode."""
        started = [h.mode for h in self._started()]
        return {m: started.count(m) for m in (AD, SD)}

    @property
    def free_compute(self) -> float:
        """Compute share the started users leave (the engine's use, setups included)."""
        return self.inst.compute_capacity - self._usage(self._started())[0]

    @property
    def free_memory(self) -> float:
        """Memory the started users leave (the engine's use, setups included)."""
        return self.inst.memory_capacity - self._usage(self._started())[1]

    def offer_batch(
        self,
        users: np.ndarray,
        allowed: tuple[int, ...] = (AD, SD),
        now: float = 0.0,
        may_wait: bool = False,
        shut: tuple[int, ...] = (),
    ) -> list[Decision]:
        """Admit the most of the users arriving in one period (the scheduler on what is free).

        Users already admitted are never moved; each new one gets a mode (now, or a later
        start within its slack) or a refusal now. A user no `allowed` mode can serve in time
        may open a `shut` one (whose setup it then pays).
        """
        self.now = now
        users = np.asarray(users, dtype=int)
        used_c, used_m, active = self._committed(now)
        compute = self.inst.compute[users].copy()
        needy = ~np.isfinite(compute[:, [m - 1 for m in allowed]]).any(axis=1)
        for m in shut:
            compute[~needy, m - 1] = np.inf
        sub = Instance(
            compute=compute,
            memory=self.inst.memory[users],
            compute_capacity=self.inst.compute_capacity - used_c,
            memory_capacity=self.inst.memory_capacity - used_m,
            setup_compute=np.array(
                [self.inst.setup_compute[m - 1] * (m not in active) for m in (AD, SD)]
            ),
            setup_memory=np.array(
                [self.inst.setup_memory[m - 1] * (m not in active) for m in (AD, SD)]
            ),
        )
        opened = tuple(m for m in (AD, SD) if m in allowed or (m in shut and needy.any()))
        sched = schedule(sub, opened)
        reasons = refusals(sub, sched, opened, tuple(sorted({*allowed, *shut})))
        decisions: dict[int, Decision] = {}
        for k, i in enumerate(users):
            mode = int(sched.modes[k])
            if mode != UNSERVED and self._admit_now(int(i), mode):
                decisions[k] = Decision(mode, f"admitted in {MODE_NAMES[mode]}")
        for k, i in enumerate(users):
            if k not in decisions:
                modes = opened if needy[k] else allowed
                why = self._too_late(int(i), modes) or reasons.get(
                    k, "what the scheduler found for it is promised to a waiting user"
                )
                decisions[k] = self._defer(int(i), modes, why, may_wait)
        return [decisions[k] for k in range(len(users))]

    def offer_priced(
        self, users: np.ndarray, plan: Plan, deadline: np.ndarray, now: float = 0.0
    ) -> list[Decision]:
        """Admit the period's arrivals by the plan's prices, cheapest priced demand first
        (the most urgent first among equals: a user with slack can wait, one without cannot).

        Each user goes to the open mode whose priced demand is least among those that fit
        now, else to the one it fits earliest within its slack; it is refused when none
        fits in time, or when even its cheapest priced demand exceeds PRICE_LIMIT (it would
        take capacity that serves more users later). A user no open mode can serve in time
        may open a mode the plan left shut. Users may wait when the plan has slack.
        """
        self.now = now
        may_wait = plan.slack
        users = np.asarray(users, dtype=int)
        cols = [m - 1 for m in plan.modes]
        priced = {
            int(i): plan.cost(self.inst.compute[i], self.inst.memory[i], deadline[i]) for i in users
        }
        offered = {}
        for i in priced:
            offered[i] = plan.modes
            if not np.isfinite(priced[i][cols]).any():  # only a mode the plan left shut can
                offered[i] = tuple(m for m in plan.allowed if np.isfinite(priced[i][m - 1]))
        cheapest = {
            i: float(priced[i][[m - 1 for m in modes]].min()) if modes else np.inf
            for i, modes in offered.items()
        }
        decisions: dict[int, Decision] = {}
        for i in sorted(priced, key=lambda u: (cheapest[u], self._end(u))):
            modes = offered[i]
            if not modes:  # no mode of this server can make its deadline
                why = refusal_reason(self.inst.compute[i], self.inst.memory[i], 0, 0, plan.allowed)
                decisions[i] = Decision(UNSERVED, why)
                continue
            if cheapest[i] > PRICE_LIMIT:
                decisions[i] = Decision(
                    UNSERVED,
                    f"not worth its share: priced demand {cheapest[i]:.2f} above {PRICE_LIMIT} "
                    "(the plan's prices of compute and memory)",
                )
                continue
            for mode in sorted(modes, key=lambda m: priced[i][m - 1]):
                if self._admit_now(i, mode):
                    decisions[i] = Decision(mode, f"admitted in {MODE_NAMES[mode]}")
                    break
            else:
                used_c, used_m, open_modes = self._committed(now)
                shut = np.array([m not in open_modes for m in (AD, SD)])
                why = self._too_late(i, modes) or refusal_reason(
                    self.inst.compute[i],
                    self.inst.memory[i],
                    self.inst.compute_capacity - used_c,
                    self.inst.memory_capacity - used_m,
                    modes,
                    self.inst.setup_compute * shut,
                    self.inst.setup_memory * shut,
                    plan.allowed,
                )
                decisions[i] = self._defer(i, modes, why, may_wait)
        return [decisions[int(i)] for i in users]

    def start_due(self, now: float) -> list[Start]:
        """Start the waiting users whose resources are free now: at their reserved start,
        or earlier if what they wait for finished early. (Users admitted into a start now
        are started on admission.) A wait whose start was missed (a user ran past its
        deadline and still holds what it needs) goes on while its window lasts."""
        self.now = now
        started = []
        for uid in sorted((u for u, h in self.holds.items() if not h.started), key=self._end):
            hold = self.holds.pop(uid)
            assert self.timing is not None  # only users admitted with a wait are not started
            if self.timing.slowdown(uid, hold.mode, now) is None:
                continue  # its window is gone: it can no longer make it (it ends unfinished)
            found = self.earliest_start(uid, hold.mode, now, latest=now)
            if found is None:
                self.holds[uid] = hold
                continue
            _, share = found
            pace, since = self._pace(uid, hold.mode, now)
            self.holds[uid] = Hold(hold.mode, share, hold.memory, now, hold.end, True)
            started.append(Start(uid, hold.mode, pace, since))
        return started

    @property
    def waiting(self) -> bool:
        """Whether some admitted user has not started yet."""
        return any(not h.started for h in self.holds.values())

    def move(self, uid: int, mode: int, share: float, now: float) -> bool:
        """Move started user uid to mode, holding `share` of the compute (what the rest of its
        work needs) and the mode's memory until its deadline, if that fits beside every other
        hold (the mode's setup included when it is shut); otherwise leave it as it is."""
        self.now = now
        hold = self.holds.pop(uid)
        memory = float(self.inst.memory[uid, mode - 1])
        if self._fits_from(mode, share, memory, now, hold.end):
            self.holds[uid] = Hold(mode, share, memory, hold.start, hold.end, True)
            return True
        self.holds[uid] = hold
        return False

    def release(self, uid: int) -> None:
        """Give back what user uid held (it finished, or left before it started)."""
        del self.holds[uid]

    def earliest_start(
        self, i: int, mode: int, now: float, latest: float = np.inf
    ) -> tuple[float, float] | None:
        """(start, compute share) of user i in mode: the first time from now, and no later
        than `latest`, at which it fits beside every hold until its deadline; None if none."""
        col = mode - 1
        if not np.isfinite(self.inst.compute[i, col]):
            return None
        end = self._end(i)
        candidates = [now]  # then the moments held resources come free, when it may wait
        if latest > now:
            candidates += sorted(h.end for h in self.holds.values() if now < h.end < end)
        for start in candidates:
            if start > latest:
                return None
            factor = 1.0 if self.timing is None else self.timing.slowdown(i, mode, start)
            if factor is None:
                return None  # later starts only need more
            share = float(self.inst.compute[i, col]) * factor
            if self._fits_from(mode, share, float(self.inst.memory[i, col]), start, end):
                return start, share
        return None

    def _admit_now(self, i: int, mode: int) -> bool:
        """Start user i in mode now if it fits now and until its deadline."""
        found = self.earliest_start(i, mode, self.now, latest=self.now)
        if found is not None:
            memory = float(self.inst.memory[i, mode - 1])
            self.holds[i] = Hold(mode, found[1], memory, self.now, self._end(i), True)
        return found is not None

    def _defer(self, i: int, modes: tuple[int, ...], why_not_now: str, may_wait: bool) -> Decision:
        """Admit user i at its earliest start in any of modes (if it may wait), or refuse it,
        saying why."""
        may_wait = may_wait and self.timing is not None
        options = [
            (found[0], float(self.inst.memory[i, m - 1]), m, found[1])
            for m in modes
            if may_wait and (found := self.earliest_start(i, m, self.now))
        ]
        if not options:
            servable = any(np.isfinite(self.inst.compute[i, m - 1]) for m in modes)
            wait = "; no later start meets its deadline" if may_wait and servable else ""
            return Decision(UNSERVED, why_not_now + wait)
        start, memory, mode, share = min(options)
        self.holds[i] = Hold(mode, share, memory, start, self._end(i))
        return Decision(
            mode,
            f"admitted in {MODE_NAMES[mode]}, starting in {start - self.now:.2f} s "
            f"when held resources free up (now: {why_not_now})",
            waits=True,
        )

    def _too_late(self, i: int, modes: tuple[int, ...]) -> str | None:
        """Why user i cannot start now, if it is that it is offered a start too late: the
        modes that could serve it on arrival no longer step fast enough for its tokens in
        the time left (the period it arrived in ran late). None otherwise."""
        if self.timing is None:
            return None
        could = [m for m in modes if np.isfinite(self.inst.compute[i, m - 1])]
        if not could or any(self.timing.slowdown(i, m, self.now) is not None for m in could):
            return None
        since = self.now - float(self.timing.arrival[i])
        names = " or ".join(MODE_NAMES[m] for m in could)
        return (
            f"offered a start {since * 1000:.0f} ms after it arrived: too late for "
            f"{names} to step fast enough for its tokens before its deadline"
        )

    def _end(self, i: int) -> float:
        return np.inf if self.timing is None else self.timing.end(i)

    def _pace(self, i: int, mode: int, now: float) -> tuple[float, float]:
        """Pace and since of user i started now: from its arrival on admission, else from now."""
        assert self.timing is not None
        col, arrival = mode - 1, float(self.timing.arrival[i])
        factor = self.timing.slowdown(i, mode, now) or np.inf
        if factor == 1.0:
            return float(self.timing.pace[i, col]), arrival
        return float(self.timing.pace[i, col]) * factor, now

    def _active(self, hold: Hold, t: float) -> bool:
        """Whether hold is held at t (a started user past its deadline holds until it ends)."""
        return hold.start <= t and (t < hold.end or (hold.started and t <= self.now))

    def _committed(self, t: float) -> tuple[float, float, set[int]]:
        """Compute and memory held at t, setups included, and the modes open then."""
        return self._usage([h for h in self.holds.values() if self._active(h, t)])

    def _started(self) -> list[Hold]:
        return [h for h in self.holds.values() if h.started]

    def _usage(self, holds: list[Hold]) -> tuple[float, float, set[int]]:
        """Compute and memory of `holds`, the setups of their modes included, and the modes."""
        modes = {h.mode for h in holds}
        compute = sum(h.compute for h in holds) + sum(self.inst.setup_compute[m - 1] for m in modes)
        memory = sum(h.memory for h in holds) + sum(self.inst.setup_memory[m - 1] for m in modes)
        return float(compute), float(memory), modes

    def _fits_from(
        self, mode: int, compute: float, memory: float, start: float, end: float
    ) -> bool:
        """Whether a user's demands fit beside every hold from start to end (checked where
        holds begin: between those points what is held only falls)."""
        points = [start] + [h.start for h in self.holds.values() if start < h.start < end]
        slack = 1 + TOLERANCE
        for t in points:
            used_c, used_m, open_modes = self._committed(t)
            setup = mode not in open_modes
            need_c = compute + setup * self.inst.setup_compute[mode - 1]
            need_m = memory + setup * self.inst.setup_memory[mode - 1]
            if used_c + need_c > self.inst.compute_capacity * slack:
                return False
            if used_m + need_m > self.inst.memory_capacity * slack:
                return False
        return True
