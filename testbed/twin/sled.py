"""The twin's discrete-event model of SLED and of the centralized server (SimPy).

SLED: each device prefills its draft over the prompt, then runs rounds: it drafts k tokens
at its hardware's decode step times (k fixed, or from the agents' own adaptive controller),
sends a VERIFY (`copies` copies, each lost with the uplink's loss), and waits per attempt as
the agents' own retry policy says (fixed, or RFC 6298 from the RTTs) for a verdict,
`retries` times more; the verdict accepts n of the k drafts, each
in turn with the per-token acceptance, and adds n + 1 tokens. With every attempt unanswered
the round keeps its drafts unverified (fallback) and the device goes offline: it drafts on
alone and, between rounds as the agents do, probes the server once `probe_s` has passed
since the last probe (or since it went offline), and comes back at the first round's end
that finds a probe answered.
With `lookahead` a device drafts on, one step at a time, while it waits for a verdict (the
agents' `LookAhead`): it reads the verdict once the step in hand ends; the drafts made after
the first are the next round's when every draft was accepted and the target's next token was
the draft's own (drawn with the per-token acceptance), and all of them after a fallback.
The server takes what arrived within `window_s` of the first waiting verification, groups it
as the agents' server does (`agents.sled.batching.plan_groups`, at most `max_batch` each)
and runs each group as one target forward at the catalogue's step time; a repeated attempt
of a verification it already verified is answered again without a forward.

Centralized: each device sends its prompt; the server runs continuous batching (up to
`max_batch` sequences; one at a time with `max_batch` 1): every forward prefills the newly
admitted prompts and decodes one token of each running sequence; a finished answer goes back
whole. The device sends its request again every timeout until the answer comes, as the
agents do.

Records are the lab's (`rounds`, `requests`, `hosts`), times in seconds from 0, so every
figure is computed by the same `ConditionStats` as a lab run's.
"""

from __future__ import annotations

import bisect
import functools
import random
from collections import OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import simpy

from agents.emulation.stepcost import (
    Hardware,
    ModelShape,
    decode_seconds,
    prefill_seconds,
    step_seconds,
)
from agents.sled.batching import Shape, plan_groups
from agents.sled.central_rounds import centralized_rounds
from agents.sled.draft_length import DraftLengthController
from agents.sled.retry import AdaptiveTimeout, FixedTimeout
from testbed.topo.profile import GilbertElliott
from testbed.twin.inputs import LinkPhase, TwinCondition, TwinDevice
from testbed.twin.jitter import JitterDraws

Direction = Literal["up", "down"]
UNPACED = {"model": "twin", "paced": False, "forwards": 0, "behind": 0, "modelled_s": 0.0,
           "computed_s": 0.0}  # fmt: skip
"""A simulated round computes nothing: no forward to pace."""
IDLE_POLL_S = 0.1  # an idle agents' server wakes this often (its select timeout)
EPOCH = 1_000_000.0  # records' times start here (a lab's are epoch seconds; none is 0)


@dataclass(eq=False)  # each one itself: compared by identity
class Ask:
    """One verification (or centralized request) and what became of it."""

    dev: str
    shape: Shape  # cached tokens before it, tokens it feeds
    answer: simpy.Event
    tokens: int = 0  # centralized: the answer's length
    served: bool = False
    pending: bool = False  # queued, being verified or generated on the server
    generated: simpy.Event | None = None  # centralized: fires when the server has generated it
    batch: int = 0
    refused: bool = False  # the KV pool had no room: `kv_pool_full`
    first_s: float | None = None  # centralized: the end of its first token's step
    last_s: float = 0.0  # and of its latest


@dataclass
class ProbeState:
    """A SLED device's probing while offline: when it last probed, and when the answers to
    its probes (those not lost) arrive."""

    last: float = float("-inf")
    answers: list[float] = field(default_factory=list)

    def offline(self, now: float) -> None:
        """Gone offline now: the first probe waits `probe_s`, as the agents' does."""
        self.last, self.answers = now, []

    def answered_by(self, now: float) -> bool:
        return any(t <= now for t in self.answers)


@dataclass
class Records:
    rounds: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    hosts: list[dict[str, Any]] = field(default_factory=list)


@functools.lru_cache(maxsize=256)
def independent(loss: float) -> GilbertElliott:
    """A loss rate as a one-state chain (built once per rate: it is asked per packet)."""
    return GilbertElliott.random(loss)


@functools.lru_cache(maxsize=1 << 16)
def decode_s(hw: Hardware, model: ModelShape, context: int) -> float:
    """One token drafted after `context` (cached: every device of a class asks alike)."""
    return decode_seconds(hw, model, 1, context)


GOLDEN = (5**0.5 - 1) / 2  # the golden ratio's fraction: the most even rotation of [0, 1)


class Twin:
    """One condition's simulation (`run()` returns its records)."""

    def __init__(self, tc: TwinCondition, seed: int = 0) -> None:
        self.tc, self.env = tc, simpy.Environment(initial_time=EPOCH)
        self.rng = random.Random(seed)
        self.jitter = JitterDraws(tc.jitter_dist, self.rng, seed)
        self.queue: simpy.Store = simpy.Store(self.env)
        self.records = Records()
        self.steady = LinkPhase(0.0, tc.rtt_s, tc.jitter_s, tc.loss_up, tc.loss_down)
        self.phase_starts = [p.at_s for p in tc.link_phases]
        self.bad: dict[tuple[str, Direction], bool] = {}  # (device, direction): in the bad state
        # device -> (tokens its session holds, last use), in order of last use
        self.kv: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.kv_total = 0  # tokens every session holds together
        self.kv_wait: OrderedDict[str, tuple[Ask, float]] = OrderedDict()  # queue policy
        self.weyl: dict[str, float] = {}  # device -> its acceptance's low-discrepancy phase
        self.refusals = 0
        # the end of the server's forward steps in hand: it reads no datagram before (the
        # agents' server is one loop), so a HELLO arriving meanwhile is answered then
        self.free_at = EPOCH

    # --- the link --------------------------------------------------------------------------

    def _phase(self) -> LinkPhase:
        """The link as it is now: the steady one, or the schedule's phase in force."""
        phases = self.tc.link_phases
        if not phases:
            return self.steady
        i = bisect.bisect_right(self.phase_starts, self.env.now - EPOCH)  # asked per packet
        return phases[max(0, i - 1)]

    def _one_way(self) -> float:
        phase = self._phase()
        jitter = phase.jitter_s * self.jitter.draw() if phase.jitter_s else 0
        return max(0.0, phase.rtt_s / 2 + jitter)

    def _arrives(self, dev: str, direction: Direction) -> bool:
        """Whether at least one of the copies gets through `dev`'s link in `direction`: each
        copy is lost as the link's chain's state says, then the chain steps (netem's gemodel;
        a loss rate is a chain that never leaves its good state)."""
        chain = self._chain(direction)
        if chain.mean_loss <= 0:
            return True
        arrived, key = False, (dev, direction)
        for _ in range(self.tc.copies):
            bad = self.bad.get(key, False)
            arrived |= self.rng.random() >= (chain.one_minus_h if bad else chain.one_minus_k)
            step = self.rng.random()
            self.bad[key] = step >= chain.r if bad else step < chain.p
        return arrived

    def _chain(self, direction: Direction) -> GilbertElliott:
        """The loss of one direction now, as a Gilbert-Elliott chain (a rate: one state)."""
        phase = self._phase()
        loss = phase.loss_up if direction == "up" else phase.loss_down
        return loss if isinstance(loss, GilbertElliott) else independent(loss)

    def _after(self, delay: float, then: Callable[[], None]) -> None:
        """Call `then` `delay` seconds from now (a timeout's callback: no process)."""
        self.env.timeout(delay).callbacks.append(lambda _event: then())

    def _send_up(self, ask: Ask) -> None:
        if self._arrives(ask.dev, "up"):
            self._after(self._one_way(), lambda: self._receive(ask))

    def _receive(self, ask: Ask) -> None:
        """As the agents' server takes a repeated VERIFY or GENERATE (the same request id):
        once answered, answered again from its cache of replies; while queued, verified or
        generated, dropped (the device waits on)."""
        if ask.served:
            self._send_down(ask)
        elif not ask.pending:
            ask.pending = True
            self.queue.put(ask)

    def _send_down(self, ask: Ask) -> None:
        if self._arrives(ask.dev, "down"):
            self._after(self._one_way(), lambda: self._answer(ask))

    def _answer(self, ask: Ask) -> None:
        if not ask.answer.triggered:
            ask.answer.succeed()

    # --- the SLED server -------------------------------------------------------------------

    def _sled_server(self) -> Generator:
        tc = self.tc
        while True:
            get = self.queue.get()
            if self.kv_wait:  # as the agents' server: it looks at its wait line when idle
                fired = yield get | self.env.timeout(IDLE_POLL_S)
                if get not in fired:
                    get.cancel()
            else:
                yield get
            if get.triggered:
                yield self.env.timeout(tc.window_s)
            waiting = [get.value] if get.triggered else []
            waiting += self.queue.items  # each request once (`_receive`)
            self.queue.items.clear()
            fresh = self._admitted(waiting)
            groups = plan_groups([a.shape for a in fresh], tc.batch_strategy, tc.max_batch)  # type: ignore[arg-type]
            steps = [step_seconds(tc.server, tc.target,
                                  [(fresh[i].shape.new, fresh[i].shape.past) for i in group])
                     for group in groups]  # fmt: skip
            self.free_at = self.env.now + sum(steps)
            for group, step in zip(groups, steps):
                asks = [fresh[i] for i in group]
                yield self.env.timeout(step)
                for a in asks:
                    a.served, a.batch = True, len(asks)
                    self._send_down(a)

    def _admitted(self, arrived: list[Ask]) -> list[Ask]:
        """What the KV pool takes of the queued (oldest first), then the arrived verifications,
        as the agents' server admits them. Refuse policy: one that does not fit is answered
        `kv_pool_full`. Queue policy: it waits in one line (at most `kv_queue_max`, each for
        `kv_queue_timeout_s`, then `kv_queue_timeout`), and once one waits, new sessions line
        up behind it; a repeat of a waiting one keeps its place."""
        tc, now = self.tc, self.env.now
        for dev, (ask, since) in list(self.kv_wait.items()):
            if now - since > tc.kv_queue_timeout_s:
                del self.kv_wait[dev]
                self._refuse(ask)
        for a in arrived:  # a device's newer verification takes its waiting one's place
            if a.dev in self.kv_wait and self.kv_wait[a.dev][0] is not a:
                self.kv_wait[a.dev] = (a, now)
        queued = [ask for ask, _ in self.kv_wait.values()]
        candidates = queued + [a for a in arrived if a.dev not in self.kv_wait]
        admitted, waiting = [], False
        for ask in candidates:
            opening = ask.dev not in self.kv
            if not (waiting and opening) and self._fits(ask):
                self.kv_wait.pop(ask.dev, None)
                admitted.append(ask)
            elif tc.kv_policy == "queue" and (
                ask.dev in self.kv_wait or len(self.kv_wait) < tc.kv_queue_max
            ):
                self.kv_wait.setdefault(ask.dev, (ask, now))
                waiting = True
            else:
                self._refuse(ask)
        return admitted

    def _refuse(self, ask: Ask) -> None:
        self.refusals += 1
        ask.refused, ask.pending = True, False  # a repeat is considered again
        self._send_down(ask)

    def _fits(self, ask: Ask) -> bool:
        """Whether the pool takes `ask`'s session at its new length (sessions idle past
        `idle_s` leave first, the longest idle first); if so it is booked. A session keeps
        what it holds: only growth can fail."""
        budget, now = self.tc.kv_budget_tokens, self.env.now
        need = ask.shape.past + ask.shape.new
        if budget is None:
            return True
        held = self.kv.get(ask.dev, (0, now))[0]
        while self.kv_total - held + need > budget and self.kv:
            dev, (_, last) = next(iter(self.kv.items()))
            if dev == ask.dev or now - last <= self.tc.idle_s:
                break
            self._leave(dev)
        if self.kv_total - held + need > budget and need > held:
            return False
        self.kv_total += need - held
        self.kv[ask.dev] = (need, now)
        self.kv.move_to_end(ask.dev)  # in order of last use
        return True

    def _leave(self, dev: str) -> None:
        """The device's session leaves the pool."""
        tokens, _ = self.kv.pop(dev, (0, 0.0))
        self.kv_total -= tokens

    def _end_session(self, dev: str) -> None:
        """The device's END after its answer (one datagram: lost, the session waits to expire)."""
        if self._arrives(dev, "up"):
            self._after(self._one_way(), lambda: self._leave(dev))

    # --- a SLED device ---------------------------------------------------------------------

    def _sled_device(self, dev: TwinDevice) -> Generator:
        tc, env = self.tc, self.env
        yield env.timeout(dev.start_s)
        control = (DraftLengthController(tc.draft_min, tc.draft_max, tc.target_acceptance)
                   if tc.draft_policy == "adaptive" else None)  # fmt: skip
        retry = self._handshake(dev.name)
        online, t_first = [True], env.now
        probes = ProbeState()
        for req in dev.requests:
            t0 = env.now
            fed = req.prompt_tokens - req.cached_tokens  # a prefix shared with the last prompt
            yield env.timeout(prefill_seconds(dev.hardware, tc.draft, fed))
            ctx, done, verified, kept, n_round, synced = req.prompt_tokens, 0, 0, 0, 0, 0
            carry = 0  # look-ahead drafts valid for the next round
            while done < req.answer_tokens:
                # the agents draft the whole length even when fewer tokens are left to write
                k = control.current if control else tc.draft_len
                t_round = env.now
                used, carry = min(carry, k), 0
                draft_s = sum(decode_s(dev.hardware, tc.draft, ctx + i) for i in range(used, k))
                yield env.timeout(draft_s)
                got, attempts, t_wait = False, 0, env.now
                if not online[0]:
                    online[0] = self._probe(dev.name, probes)
                if online[0]:
                    # it carries what the server has not cached: the prompt first, then the
                    # last verdict's token, and any tokens kept unverified since
                    new = ctx - synced + k
                    ask = Ask(dev.name, Shape(synced, new), env.event())
                    while attempts <= tc.retries:
                        attempts += 1
                        sent = env.now
                        self._send_up(ask)
                        yield ask.answer | env.timeout(retry.timeout_s())
                        if ask.answer.triggered and ask.refused:  # this round falls back
                            break
                        if ask.answer.triggered:
                            got = True
                            if attempts == 1:  # Karn's rule, as the agents keep it
                                retry.observe((env.now - sent) * 1e3)
                            break
                        retry.expired()  # unanswered: a back-off policy waits longer next
                    if not got:
                        online[0] = False
                        probes.offline(env.now)
                ahead = 0
                if tc.lookahead and env.now > t_wait:
                    ahead, finish_s = self._drafted_ahead(dev, ctx + k, env.now - t_wait)
                    yield env.timeout(finish_s)  # the verdict is read once the step in hand ends
                row = {"dev": dev.name, "problem": req.problem, "round": n_round,
                       "t_start": t_round, "drafted": k, "draft_len": k, "attempts": attempts,
                       "draft_ms": draft_s * 1e3, "lookahead_used": used,
                       "lookahead_drafted": ahead, **UNPACED}  # fmt: skip
                if got:
                    accepted, bet = self._accepted(dev.name, k)
                    # the bet: every draft accepted and the target's next token the draft's own
                    if accepted == k and ahead and bet:
                        carry = ahead - 1
                    tokens = min(accepted + 1, req.answer_tokens - done)
                    verified += tokens
                    synced = ctx + tokens - 1  # all but the bonus / correction token
                    if control:
                        control.observe(accepted, k)
                    row |= {"mode": "verified", "accepted": accepted, "batch": ask.batch,
                            "rtt_ms": (env.now - t_round - draft_s) * 1e3}  # fmt: skip
                else:
                    tokens = min(k, req.answer_tokens - done)
                    kept += tokens
                    carry = ahead  # after a fallback the whole look-ahead extends the answer
                    row |= {"mode": "fallback"}
                row |= {"t_end": env.now, "tokens": tokens, "lookahead_kept": carry}
                self.records.rounds.append(row)
                ctx, done, n_round = ctx + tokens, done + tokens, n_round + 1
            self.records.requests.append(self._request(dev, req, t0, done, verified, kept, n_round))
            self._end_session(dev.name)
        self._host(dev, t_first)

    def _drafted_ahead(self, dev: TwinDevice, ctx: int, waited_s: float) -> tuple[int, float]:
        """Look-ahead while a verdict was awaited for `waited_s`: the drafts made (one step at
        a time, at most `lookahead`, the step in hand when the verdict came finished), and
        how long after the verdict that step ends."""
        t = 0.0
        for i in range(self.tc.lookahead):
            if t >= waited_s:
                return i, 0.0
            t += decode_s(dev.hardware, self.tc.draft, ctx + i)
            if t > waited_s:
                return i + 1, t - waited_s
        return self.tc.lookahead, 0.0

    def _judge(self, dev: str) -> float:
        """The uniform draw that settles one of `dev`'s rounds. Under `acceptance_dispersion`
        d < 1 a share 1 - d^2 of them come from the device's own golden-ratio sequence (a
        low-discrepancy one), so a device's accepted share varies about d times as much from
        device to device as with independent draws, each round's outcome keeping its law."""
        if self.rng.random() < 1 - self.tc.acceptance_dispersion**2:
            phase = self.weyl.get(dev)
            phase = self.rng.random() if phase is None else (phase + GOLDEN) % 1.0
            self.weyl[dev] = phase
            return phase
        return self.rng.random()

    def _accepted(self, dev: str, k: int) -> tuple[int, bool]:
        """A round's drafts accepted in turn, each with its position's acceptance, up to the
        first miss, and whether the look-ahead's bet (position k + 1) wins: one draw through
        the outcomes' law (0, 1, ..., k accepted; k and the bet)."""
        u, reach, below = self._judge(dev), 1.0, 0.0
        for i in range(k + 1):
            p = self.tc.acceptance_at(i)
            below += reach * (1 - p)
            if u < below:
                return i, False
            reach *= p
        return k, True

    def _probe(self, dev: str, probes: ProbeState) -> bool:
        """Offline, between two rounds, as the agents' `probe()`: back online if an answer to
        an earlier probe has arrived; else a new probe when `probe_s` has passed since the
        last (or since going offline), its answer due a round trip later unless either leg
        loses it."""
        now = self.env.now
        if probes.answered_by(now):
            return True
        if now - probes.last >= self.tc.probe_s:
            probes.last = now
            if self._arrives(dev, "up") and self._arrives(dev, "down"):
                probes.answers.append(now + self._one_way() + self._one_way())
        return False

    def _handshake(self, dev: str) -> AdaptiveTimeout | FixedTimeout:
        """The device's retry policy after its HELLO: the agents' adaptive timeout takes the
        HELLO's round trip as its first sample when the first attempt was answered; a HELLO
        that arrives while the server computes is answered once its steps in hand end."""
        tc = self.tc
        if tc.timeout_policy not in ("adaptive", "backoff"):
            return FixedTimeout(tc.timeout_s * 1e3)
        retry = AdaptiveTimeout(tc.timeout_s * 1e3, tc.timeout_min_s * 1e3, tc.timeout_max_s * 1e3,
                                backoff=tc.timeout_policy == "backoff")  # fmt: skip
        if self._arrives(dev, "up") and self._arrives(dev, "down"):
            up, down = self._one_way(), self._one_way()
            held = max(0.0, self.free_at - (self.env.now + up))
            retry.observe((up + held + down) * 1e3)
        else:  # the first HELLO unanswered: a back-off policy waits longer from then on
            retry.expired()
        return retry

    # --- centralized -----------------------------------------------------------------------

    def _central_server(self) -> Generator:
        tc, env = self.tc, self.env
        running: list[list[Any]] = []  # [ask, tokens still to make, context]
        while True:
            if not running and not self.queue.items:
                first = yield self.queue.get()
                self.queue.items.insert(0, first)
            fresh: list[Ask] = []  # the queue holds each request once (`_receive`)
            while self.queue.items and len(running) + len(fresh) < tc.max_batch:
                fresh.append(self.queue.items.pop(0))
            batch = [(a.shape.new, 0) for a in fresh] + [(1, c) for _, _, c in running]
            step = step_seconds(tc.server, tc.target, batch)
            self.free_at = env.now + step
            yield env.timeout(step)
            running += [[a, a.tokens - 1, a.shape.new + 1] for a in fresh]
            for r in running:
                r[0].first_s = env.now if r[0].first_s is None else r[0].first_s
                r[0].last_s = env.now
                if r[0] not in fresh:
                    r[1], r[2] = r[1] - 1, r[2] + 1
            for r in [r for r in running if r[1] <= 0]:
                running.remove(r)
                r[0].served, r[0].batch = True, len(batch)
                if r[0].generated is not None:
                    r[0].generated.succeed()
                self._send_down(r[0])

    def _central_device(self, dev: TwinDevice) -> Generator:
        yield self.env.timeout(dev.start_s)
        env, t_first = self.env, self.env.now
        retry = self._handshake(dev.name)
        for req in dev.requests:
            t0 = env.now
            ask = Ask(dev.name, Shape(0, req.prompt_tokens), env.event(), tokens=req.answer_tokens)
            attempts, period = 0, retry.timeout_s()  # no sample is taken per request
            while not ask.answer.triggered:
                # as the agents do: the same GENERATE again every timeout until the RESULT
                # comes (the server ignores a repeat while it generates and answers one
                # from its cache once done)
                attempts += 1
                self._send_up(ask)
                yield ask.answer | env.timeout(period)
                if ask.pending and not ask.served and not ask.answer.triggered:
                    # the server holds it, so every repeat until it is generated is dropped:
                    # count them instead of sending them (those in the last one-way delay
                    # before it is done, which the cache would answer, count as dropped too)
                    t_next, ask.generated = env.now, env.event()
                    yield ask.answer | ask.generated
                    sent = int((env.now - t_next) // period) + 1
                    attempts += sent
                    yield ask.answer | env.timeout(t_next + sent * period - env.now)
            decode_ms = None if ask.first_s is None else (ask.last_s - ask.first_s) * 1000
            first = {"attempts": attempts, "batch": ask.batch}
            for row in centralized_rounds(dev.name, req.problem, t0, env.now, req.answer_tokens,
                                          decode_ms, first):  # fmt: skip
                self.records.rounds.append({**row, **UNPACED})
            self.records.requests.append(
                self._request(dev, req, t0, req.answer_tokens, req.answer_tokens, 0, 1)
            )
        self._host(dev, t_first)

    # --- records ---------------------------------------------------------------------------

    def _request(self, dev: TwinDevice, req: Any, t0: float, tokens: int, verified: int,
                 kept: int, rounds: int) -> dict[str, Any]:  # fmt: skip
        return {"dev": dev.name, "problem": req.problem, "t_start": t0, "t_end": self.env.now,
                "tokens": tokens, "verified_tokens": verified, "fallback_tokens": kept,
                "rounds": rounds, "prompt_tokens": req.prompt_tokens,
                "asked_tokens": req.answer_tokens}  # fmt: skip

    def _host(self, dev: TwinDevice, t_first: float) -> None:
        self.records.hosts.append({"dev": dev.name, "t_start": t_first, "t_end": self.env.now,
                                   "answered": len(dev.requests), "role": "device",
                                   "host_class": dev.host_class})  # fmt: skip

    def run(self) -> Records:
        sled = self.tc.mode == "sled"
        self.env.process(self._sled_server() if sled else self._central_server())
        devices = [self.env.process((self._sled_device if sled else self._central_device)(d))
                   for d in self.tc.devices]  # fmt: skip
        self.env.run(until=simpy.AllOf(self.env, devices))
        server = {"dev": "server", "t_start": EPOCH, "t_end": self.env.now, "role": "server",
                  "host_class": self.tc.server_class}  # fmt: skip
        self.records.hosts.append(server)
        return self.records
