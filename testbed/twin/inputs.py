"""What the twin simulates of one condition, taken from the playbook the lab would run.

The devices and their hardware come from the playbook's topology (`lab.devices` of them), the
stood-for models and the server's hardware from the catalogue (`topologies/hardware.yaml`,
the step times the lab's pacing keeps), the link from the playbook's `link` profile, the
SLED settings from `sled`, the requests' prompt and answer lengths from the same problems the
lab would ask (`testbed.runner.workload.problems_for`), and the per-token acceptance from the
stood-for pair's published figure (`workloads.yaml`) unless a measured one is given.

A request held to a stood-for length has that length. One that is not ends where the target's
answer ends (its EOS): the twin counts the problem's prompt and reference answer in the
target's own tokens (the playbook's target folder, or the tiny pair's once built), which is
the length the lab's lossless answers have where the target writes the reference (the tiny
target on its held-out problems: 16, 14 and 25 tokens, the lab's own, in the validation of
2026-12-07). With no tokenizer at hand the prompt is its words x 1.3 and the answer the
playbook's whole `max_new_tokens`, which overstates a short answer's rate.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agents.emulation.stepcost import Hardware, ModelShape
from agents.workloads.arithmetic import prompt as prompt_of
from testbed.config.playbook import TWIN_MAX_DEVICES, Condition, Playbook, playbook_topology
from testbed.core.errors import BadInputError
from testbed.core.paths import cache_dir
from testbed.runner.draft_choice import stood_for_acceptance
from testbed.runner.emulation import hardware_of
from testbed.runner.workload import problems_for
from testbed.topo.catalogue import load_catalogue
from testbed.topo.profile import GilbertElliott, JitterDist, LinkProfile
from testbed.topo.schedule import timeline
from testbed.twin.measured import MeasuredAcceptance

PROMPT_TOKENS_PER_WORD = 1.3  # a request without prompt ids: its words, as tokens


@dataclass(frozen=True)
class Request:
    problem: str
    prompt_tokens: int
    answer_tokens: int
    cached_tokens: int = 0  # of the prompt, already in the draft's KV cache (a shared prefix)


@dataclass(frozen=True)
class LinkPhase:
    """From `at_s` seconds after the devices' start on, the link is this (static) one."""

    at_s: float
    rtt_s: float
    jitter_s: float
    loss_up: float | GilbertElliott
    loss_down: float | GilbertElliott


@dataclass(frozen=True)
class TwinDevice:
    name: str
    host_class: str | None
    hardware: Hardware
    requests: tuple[Request, ...]
    start_s: float = 0.0  # after the first device's start (the lab's agents start one by one)


@dataclass(frozen=True)
class TwinCondition:
    """One condition as the twin runs it."""

    id: str
    mode: str  # sled or centralized
    devices: tuple[TwinDevice, ...]
    server_class: str | None
    server: Hardware
    draft: ModelShape
    target: ModelShape
    acceptance: float  # per drafted token
    acceptance_source: str
    rtt_s: float
    jitter_s: float
    loss_up: float | GilbertElliott  # a rate (independent losses) or a Gilbert-Elliott chain
    loss_down: float | GilbertElliott
    draft_len: int
    draft_policy: str
    draft_min: int
    draft_max: int
    target_acceptance: float
    timeout_s: float
    timeout_policy: str
    timeout_min_s: float
    timeout_max_s: float
    retries: int
    copies: int
    probe_s: float
    max_batch: int
    batch_strategy: str
    window_s: float
    lookahead: int = 0  # greedy drafts a device makes ahead while a verdict is in flight
    kv_budget_tokens: int | None = None  # the server's KV pool (None: no limit)
    idle_s: float = 120.0  # a session idle this long leaves the pool
    kv_policy: str = "refuse"  # or queue: what does not fit waits, in one line
    kv_queue_max: int = 64
    kv_queue_timeout_s: float = 10.0
    link_phases: tuple[LinkPhase, ...] = ()  # a schedule or trace (empty: the link is steady)
    jitter_dist: JitterDist = "uniform"  # the law of every phase's jitter
    # the chance a draft is accepted at each position of a round (1st, 2nd, ...), given
    # those before it were; the last stands for every later position, the look-ahead's bet
    # included (empty: `acceptance` at every position, independent tokens)
    acceptance_by_position: tuple[float, ...] = ()
    # the spread of a device's acceptance against independent tokens' (1: independent; the
    # tiny pair's rejections come steadier, about 0.5)
    acceptance_dispersion: float = 1.0

    def acceptance_at(self, position: int) -> float:
        """The chance the draft at `position` (0: the round's first) is accepted, given
        those before it were."""
        profile = self.acceptance_by_position
        if not profile:
            return self.acceptance
        return profile[min(position, len(profile) - 1)]


def link_phases(link: LinkProfile, lead_s: float) -> tuple[LinkPhase, ...]:
    """The phases of a schedule or trace, timed from the devices' start: the lab applies the
    link `lead_s` seconds before its devices start (its probe, reference answers and server
    start come between), and the steps count from the apply."""
    if not link.varies:
        return ()
    phases = [
        LinkPhase(p.at_s - lead_s, p.profile.rtt_ms / 1e3, p.profile.jitter_ms / 1e3,
                  p.profile.loss_model("up"), p.profile.loss_model("down"))
        for p in timeline(link)
    ]  # fmt: skip
    return tuple(phases)


def twin_condition(
    cond: Condition,
    source: str,
    acceptance: float | MeasuredAcceptance | None = None,
    devices: int | None = None,
    link_lead_s: float = 0.0,
) -> TwinCondition:
    """The condition as the twin runs it (`devices`: that many, past the lab's limit, each
    of the topology's one device class; `link_lead_s`: how long before the devices' start
    a varying link's steps begin, as on the lab); BadInputError naming file and key where the
    playbook asks for what the twin cannot simulate."""
    pb = cond.playbook
    where = f"{source} ({cond.id})"
    if pb.mode not in ("sled", "centralized"):
        raise BadInputError(
            f"{where}: mode: the twin simulates sled and centralized, not {pb.mode}"
        )
    topo = playbook_topology(pb, source)
    hosts = [h for h in topo.hosts if h.role == "device"]
    key = "--devices" if devices is not None else "lab.devices"
    count = devices or pb.lab.devices or len(hosts)
    if count > TWIN_MAX_DEVICES:
        raise BadInputError(f"{where}: {key}: {count} is over the twin's {TWIN_MAX_DEVICES:,}")
    if count > len(hosts):
        if len({h.host_class for h in hosts}) != 1:
            raise BadInputError(
                f"{where}: {key}: {count} devices of a mixed fleet of {len(hosts)}: the twin "
                "rescales a one-class fleet only"
            )
        hosts = [hosts[0].model_copy(update={"name": f"dev{i + 1}"}) for i in range(count)]
    hosts = hosts[:count]
    cat = load_catalogue()
    draft = cat.model(pb.models.draft_as, f"{where}: models.draft_as")
    target = cat.model(pb.models.target_as, f"{where}: models.target_as")

    def hardware(cls: str | None, key: str) -> Hardware:
        name = hardware_of(cls, f"{where}: {key}")
        if name is None:
            raise BadInputError(f"{where}: {key}: a host with no class has no hardware to simulate")
        return cat.hardware(name, f"{where}: {key} (class {cls})")

    published = stood_for_acceptance(cond)
    if acceptance is None and published is None:
        raise BadInputError(
            f"{where}: workload.stands_for: the twin needs the stood-for pair's published "
            "acceptance (or a measured one: --acceptance)"
        )
    profile: tuple[float, ...] = ()
    dispersion = 1.0
    if isinstance(acceptance, MeasuredAcceptance):
        alpha, profile, how = acceptance.per_token, acceptance.profile, acceptance.source
        dispersion = acceptance.dispersion
    elif acceptance is not None:
        alpha, how = acceptance, "measured (--acceptance)"
    else:
        alpha, how = published.per_token, f"published: {published.source}"  # type: ignore[union-attr]
    asked = fleet_problems(cond, [d.name for d in hosts])
    encode = target_encoder(pb)
    s = pb.sled
    twins = tuple(
        TwinDevice(d.name, d.host_class, hardware(d.host_class, f"host {d.name}"),
                   device_requests(asked[d.name], pb.workload.max_new_tokens, encode))
        for d in hosts
    )  # fmt: skip
    return TwinCondition(
        id=cond.id, mode=pb.mode, devices=twins, server_class=topo.server.host_class,
        server=hardware(topo.server.host_class, f"host {topo.server.name}"),
        draft=draft, target=target, acceptance=float(alpha), acceptance_source=how,
        acceptance_by_position=profile, acceptance_dispersion=dispersion,
        rtt_s=pb.link.rtt_ms / 1e3, jitter_s=pb.link.jitter_ms / 1e3,
        loss_up=pb.link.loss_model("up"), loss_down=pb.link.loss_model("down"),
        draft_len=s.draft_len, draft_policy=s.draft_policy, draft_min=s.draft_min,
        draft_max=s.draft_max, target_acceptance=s.target_acceptance,
        timeout_s=s.timeout_ms / 1e3, timeout_policy=s.timeout_policy,
        timeout_min_s=s.timeout_min_ms / 1e3, timeout_max_s=s.timeout_max_ms / 1e3,
        retries=s.retries, copies=s.copies,
        probe_s=s.probe_ms / 1e3, max_batch=s.max_batch, batch_strategy=s.batch_strategy,
        window_s=s.window_ms / 1e3, lookahead=s.lookahead,
        kv_budget_tokens=kv_budget(pb, where, hardware(topo.server.host_class, "server"), target),
        idle_s=s.idle_s, link_phases=link_phases(pb.link, link_lead_s),
        kv_policy=s.kv_policy, kv_queue_max=s.kv_queue_max,
        kv_queue_timeout_s=s.kv_queue_timeout_s,
        jitter_dist=pb.link.jitter_dist,
    )  # fmt: skip


def fleet_problems(cond: Condition, names: list[str]) -> dict[str, list[object]]:
    """Each device's problems as the lab would ask them; a fleet larger than the workload's
    data set has distinct ones (halving until they fit), repeated in turn over the rest."""
    pb, distinct = cond.playbook, len(names)
    while True:
        try:
            base = problems_for(pb.workload, names[:distinct], None, pb.models.target_as)
            break
        except (BadInputError, ValueError):
            if distinct == 1:
                raise
            distinct = max(1, distinct // 2)
    firsts = list(base.values())
    return {name: firsts[i % distinct] for i, name in enumerate(names)}


Encode = Callable[[str], tuple[int, ...]]


def kv_budget(pb: Playbook, where: str, server: Hardware, target: ModelShape) -> int:
    """The server's KV pool in cached tokens: `sled.kv_cache_tokens`, else what the stood-for
    server's memory holds beside the stood-for target's weights (the catalogue's figures);
    BadInputError where the weights do not fit."""
    s = pb.sled
    if s.kv_cache_tokens is not None:
        return s.kv_cache_tokens
    free = server.memory_bytes - target.weight_bytes
    if free <= 0:
        raise BadInputError(
            f"{where}: models.target_as: {target.weight_bytes / 1e9:.0f} GB of weights do not fit "
            f"the server's {server.memory_bytes / 1e9:.0f} GB"
        )
    return int(free // target.kv_bytes_per_token)


def target_encoder(pb: Playbook) -> Encode | None:
    """A text's token ids in the playbook's target tokenizer (the pair's), where it is at hand
    without building anything: the target's folder, or the tiny pair's in the cache; else
    None."""
    from testbed.models.tiny import TinyRecipe, recipe_hash

    if pb.models.target == "tiny":
        path = cache_dir() / "tiny" / recipe_hash(TinyRecipe()) / "target" / "tokenizer.json"
    else:
        path = Path(pb.models.target) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))

    @functools.cache  # a fleet repeats its problems: each text encoded once
    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text).ids)

    return encode


def request_of(problem: object, max_new: int, encode: Encode | None = None) -> Request:
    """A problem's lengths: its stood-for prompt and answer (held); else its prompt and
    reference answer in the target's tokens (`encode`), the answer at most `max_new`; else its
    words and the whole `max_new`."""
    held = getattr(problem, "max_new", None)
    length = getattr(problem, "prompt_tokens", None)
    answer = getattr(problem, "answer", None)
    ids = getattr(problem, "prompt_ids", None)
    if ids is not None:
        prompt = len(ids)
    elif length:  # a stood-for prompt's length (its ids are built only with a tokenizer)
        prompt = int(length)
    elif encode is not None:
        prompt = len(encode(prompt_of(problem)))  # type: ignore[arg-type]
    else:
        prompt = round(len(str(getattr(problem, "question", "")).split()) * PROMPT_TOKENS_PER_WORD)
    if held:
        new = int(held)
    elif encode is not None and answer:
        new = max(1, min(max_new, len(encode(str(answer)))))
    else:
        new = max_new
    return Request(str(problem.id), max(1, prompt), new)  # type: ignore[attr-defined]


def prompt_ids_of(problem: object, encode: Encode | None) -> tuple[int, ...] | None:
    """The prompt's token ids: those the problem carries, else its plain prompt encoded
    (None for a stood-for prompt without its ids: its tokens are not the plain prompt's)."""
    ids = getattr(problem, "prompt_ids", None)
    if ids is not None:
        return tuple(ids)
    if getattr(problem, "prompt_tokens", None) or encode is None:
        return None
    return encode(prompt_of(problem))  # type: ignore[arg-type]


def device_requests(
    problems: list[object], max_new: int, encode: Encode | None
) -> tuple[Request, ...]:
    """One device's requests in turn, each prompt's prefix shared with the one before it
    counted as cached: the device's llama.cpp context keeps the previous session's tokens
    and decodes only what differs (`agents.engines.llama_cpp`)."""
    out, before = [], None
    for p in problems:
        req, ids = request_of(p, max_new, encode), prompt_ids_of(p, encode)
        if ids is not None and before is not None:
            shared = next((i for i, (a, b) in enumerate(zip(ids, before, strict=False)) if a != b),
                          min(len(ids), len(before)))  # fmt: skip
            req = dataclasses.replace(req, cached_tokens=min(shared, req.prompt_tokens - 1))
        out.append(req)
        before = ids
    return tuple(out)
