"""Experiment playbooks: what to run, on which lab, with which workload, sweeping what.

A playbook is a YAML file validated by `Playbook`. Its `sweep` maps dotted keys of the
playbook (e.g. `link.loss`) to lists of values; the run is the cartesian product of them, one
*condition* per combination, each validated again as a whole playbook so a bad swept value is
named with its key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from testbed.config.costs import load_cost_table
from testbed.config.faults import FaultSpec
from testbed.config.slo import Slo
from testbed.config.strict import Strict
from testbed.core.errors import BadInputError
from testbed.core.loading import read_yaml, validate
from testbed.core.paths import REPO_ROOT
from testbed.topo.classes import host_classes
from testbed.topo.files import MAX_DEVICES, load_topology, topology_profiles
from testbed.topo.profile import LinkProfile
from testbed.topo.schedule import timeline
from testbed.topo.topology import Topology

# Settings fixed for a whole run (the lab, the models, the topology): sweeping them would need
# a new lab or new models per condition, so a sweep naming them is refused. The one exception
# are `lab.devices` (the lab comes up with the largest count swept and each condition runs its
# agents on the first `lab.devices` devices), `lab.time_dilation` and `lab.device_class` (an
# emulated device computes at its class's hardware speed, set per condition).
RUN_WIDE_KEYS = ("name", "sweep", "topology", "lab", "models.draft", "models.target", "paper")
SWEEPABLE_LAB_KEYS = ("lab.devices", "lab.time_dilation", "lab.device_class")
# A lab holds up to LAB_MAX_DEVICES devices (topology files' limit); the twin (`testbed
# simulate`) takes a playbook up to TWIN_MAX_DEVICES.
LAB_MAX_DEVICES = MAX_DEVICES
TWIN_MAX_DEVICES = 100_000


Mode = Literal["sled", "centralized", "balance", "device-only", "server-ad", "server-sd"]


MAX_DILATION = 1000.0
TINY_DRAFT_AS = "tiny-draft@f32"
TINY_TARGET_AS = "tiny-target@f32"


class LabSection(Strict):
    """Which lab kind runs the playbook (see `testbed.labs.kinds`) and how many devices."""

    kind: Literal["namespaces", "mininet", "inventory"] = "namespaces"
    devices: int | None = Field(
        None, ge=1, le=TWIN_MAX_DEVICES,
        description=f"rescale the topology's (one-class) fleet to this count (a lab run: up "
        f"to {LAB_MAX_DEVICES}; testbed simulate: up to {TWIN_MAX_DEVICES:,})",
    )  # fmt: skip
    device_class: str | None = Field(
        None,
        description="run every device of the topology as this host class (topologies/"
        "host-classes.yaml, a device class): an emulated device computes at that hardware's "
        "speed; an inventory lab's devices are the hardware they are",
    )
    inventory: str | None = Field(
        None, description="Ansible YAML inventory of the hosts (lab.kind inventory)"
    )

    time_dilation: float | Literal["auto"] = Field(
        1.0,
        description="every time the lab imposes (link delays, rates, schedules, timeouts, "
        "arrivals, deadlines, pacing) runs this many times slower, and every figure is "
        "reported in emulated time; auto: the smallest N at which a short pilot of each "
        "condition has no forward behind its modelled time",
    )

    @field_validator("time_dilation")
    @classmethod
    def _dilation_positive(cls, v: float | str) -> float | str:
        if v != "auto" and not (isinstance(v, int | float) and 0 < v <= MAX_DILATION):
            raise ValueError(f"expected a positive number up to {MAX_DILATION}, or auto")
        return v

    @field_validator("device_class")
    @classmethod
    def _device_class_known(cls, v: str | None) -> str | None:
        if v is None:
            return v
        classes = host_classes()
        devices = [n for n, c in classes.items() if "device" in c.roles]
        if v not in devices:
            raise ValueError(f"expected a device class ({', '.join(devices)}), got {v!r}")
        return v

    @model_validator(mode="after")
    def _inventory_given(self) -> LabSection:
        if self.kind == "inventory" and not self.inventory:
            raise ValueError("inventory: required when kind is inventory")
        if self.kind == "inventory" and self.device_class is not None:
            raise ValueError(
                f"device_class: {self.device_class!r} on an inventory lab; its devices are "
                "the hardware they are (leave device_class out)"
            )
        return self


class ModelsSection(Strict):
    draft: str = Field("tiny", description="'tiny' or a path to the draft .gguf")
    target: str = Field("tiny", description="'tiny' or a path to the target HF folder")
    server_device: str = Field("cpu", description="torch device of the verifier (cpu, cuda)")
    draft_as: str = Field(
        TINY_DRAFT_AS,
        description="the catalogue model (model@format, topologies/hardware.yaml) the draft "
        "stands for: emulated hosts pace its forwards to that model on their hardware",
    )
    target_as: str = Field(
        TINY_TARGET_AS,
        description="the catalogue model the target stands for (model@format)",
    )
    draft_grade: str = Field(
        "auto",
        description="tiny pair only: which draft of its graded family runs ('draft', "
        "'draft-xs', ...); auto: the one whose measured acceptance on the workload is nearest "
        "the stood-for pair's published acceptance (topologies/workloads.yaml), else 'draft'",
    )


class ArrivalSection(Strict):
    """When a device starts its next request: at once after the last answer (closed loop), or
    at the times of a Poisson process of `rate_per_s` per device, drawn from `seed`."""

    process: Literal["closed", "poisson"] = "closed"
    rate_per_s: float | None = Field(None, gt=0, description="poisson: requests/s per device")
    seed: int = 0

    @model_validator(mode="after")
    def _rate_given(self) -> ArrivalSection:
        if self.process == "poisson" and self.rate_per_s is None:
            raise ValueError("rate_per_s: required when process is poisson")
        return self


class WorkloadSection(Strict):
    kind: Literal["arithmetic", "gsm8k"] = Field(
        "arithmetic",
        description="what the models read and answer: the tiny pair's own arithmetic problems, "
        "or GSM8K questions from gsm8k_path",
    )
    stands_for: str | None = Field(
        None,
        description="the workload the requests stand for (topologies/workloads.yaml, e.g. "
        "gsm8k-cot-0shot): each request takes the prompt and answer lengths of one of its "
        "questions with the models.target_as model, its answer held to that length",
    )
    answer_scale: float = Field(
        1.0, gt=0, le=16,
        description="with stands_for: every held answer length times this (a chat model's "
        "worked answers run longer than the data set's reference solutions); still capped by "
        "max_new_tokens",
    )  # fmt: skip
    problems_per_device: int = Field(3, ge=1)
    seed: int = 7
    max_new_tokens: int = Field(
        48, ge=1, le=4096,
        description="most new tokens an answer takes (with stands_for: a cap on the held lengths)",
    )  # fmt: skip
    gsm8k_path: str | None = None
    prompt_format: Literal["plain", "lm-eval"] = Field(
        "plain",
        description="plain: the tiny models' `Q: ... A:`; lm-eval: lm-evaluation-harness's "
        "gsm8k format (`Question: ... Answer:`, after `fewshot` solved train problems)",
    )
    fewshot: int = Field(0, ge=0, le=16, description="solved examples before each question")
    fewshot_path: str | None = Field(None, description="jsonl the examples come from")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="gsm8k: pass over problems whose prompt is longer (tokens)"
    )
    repetitions: int = Field(
        1, ge=1, description="times each sweep point is run; repetition r adds r to the seeds"
    )
    arrival: ArrivalSection = ArrivalSection()
    slo: Slo = Slo()

    @model_validator(mode="after")
    def _fewshot_needs_lm_eval(self) -> WorkloadSection:
        if self.fewshot and self.prompt_format != "lm-eval":
            raise ValueError("fewshot: few-shot examples need prompt_format lm-eval")
        if self.answer_scale != 1.0 and self.stands_for is None:
            raise ValueError("answer_scale: scales the stood-for answer lengths; needs stands_for")
        return self


def device_setting(default: Any, flag: str | None = None, **field: Any) -> Any:
    """A SLED setting the device agent takes (`agents.sled.device --<name>`, or `flag`)."""
    return Field(default, json_schema_extra={"agent": "device", "flag": flag}, **field)


def server_setting(default: Any, flag: str | None = None, **field: Any) -> Any:
    """A SLED setting the verification server takes (`agents.sled.server --<name>`)."""
    return Field(default, json_schema_extra={"agent": "server", "flag": flag}, **field)


class SledSection(Strict):
    """The agents' settings (device: drafting, timeouts, redundancy, sampling; server:
    batching and KV budget). Each is declared once, here, with the agent that takes it: the
    runner passes it as the agent's flag of the same name (`testbed.runner.agents`)."""

    draft_len: int = device_setting(4, ge=1, le=64, description="fixed policy: tokens per draft")
    draft_policy: Literal["fixed", "adaptive"] = device_setting("fixed")
    draft_min: int = device_setting(3, ge=1, le=64, description="adaptive: shortest draft")
    draft_max: int = device_setting(8, ge=1, le=64, description="adaptive: longest draft")
    target_acceptance: float = device_setting(
        0.75, gt=0, lt=1, description="adaptive: acceptance aimed at"
    )
    timeout_ms: float = device_setting(200.0, gt=0)
    timeout_policy: Literal["fixed", "adaptive", "backoff"] = device_setting(
        "fixed",
        description="fixed: timeout_ms a try; adaptive: SRTT + 4 RTTVAR of first-try round "
        "trips (RFC 6298, Karn's rule) within [timeout_min_ms, timeout_max_ms]; backoff: "
        "adaptive that doubles the wait on each unanswered try until a fresh sample (RFC 6298 "
        "5.5)",
    )
    timeout_min_ms: float = device_setting(20.0, gt=0, description="adaptive timeout: floor")
    timeout_max_ms: float = device_setting(1000.0, gt=0, description="adaptive timeout: ceiling")
    retries: int = device_setting(3, ge=0)
    copies: int = device_setting(
        1, ge=1, le=4, description="redundant sends of each draft and verdict"
    )
    retry_confidence: float = device_setting(
        0.0, ge=0, lt=1, description="a retry sends only the drafts at least this confident"
    )
    lookahead: int = device_setting(
        0, ge=0, le=64, description="tokens drafted ahead while in flight"
    )
    min_confidence: float = device_setting(0.0, ge=0, lt=1, description="stop a draft below this")
    temperature: float = device_setting(0.0, ge=0, description="0: greedy; else sampled SD")
    top_k: int = device_setting(32, ge=1, description="sampling: draft from the top k")
    probe_ms: float = device_setting(200.0, gt=0)
    max_batch: int = server_setting(16, ge=1)
    batch_strategy: Literal["arrival", "best_fit"] = server_setting("arrival")
    window_ms: float = server_setting(2.0, ge=0)
    kv_cache_tokens: int | None = server_setting(None, ge=1, description="server KV pool budget")
    max_seq_length: int | None = server_setting(None, ge=8, description="longest session, tokens")
    max_seq_policy: Literal["truncate", "refuse"] = server_setting("truncate")
    kv_policy: Literal["refuse", "queue"] = server_setting("refuse")
    kv_queue_max: int = server_setting(
        64, ge=1, description="queue policy: requests waiting at most"
    )
    kv_queue_timeout_s: float = server_setting(10.0, gt=0, description="queue policy: longest wait")
    prefill_chunk: int | None = server_setting(
        None, ge=1, description="server: new tokens per forward"
    )
    idle_s: float = server_setting(
        120.0, gt=0, description="server: expire sessions idle this long"
    )
    server_threads: int = server_setting(1, "--threads", ge=1)
    device_threads: int = device_setting(1, "--threads", ge=1)

    @model_validator(mode="after")
    def _ranges_ordered(self) -> SledSection:
        if self.draft_min > self.draft_max:
            raise ValueError("draft_min: must not exceed draft_max")
        if self.timeout_min_ms > self.timeout_max_ms:
            raise ValueError("timeout_min_ms: must not exceed timeout_max_ms")
        return self


class BalanceSection(Strict):
    """BALANCE mode: users with mixed deadlines and lengths send their requests from the
    devices over their links to one server that serves each autoregressively (AD) or
    speculatively (SD) under a memory budget (docs/balance.md). Their problems come from
    `workload.seed`; their arrival times and deadlines from `seed` plus
    `workload.arrival.seed` (so each repetition draws new ones); user k is on device
    k mod the condition's devices."""

    policy: Literal["ad-only", "sd-only", "hybrid"] = "hybrid"
    users: int = Field(20, ge=1, le=1000, description="users (arithmetic problems) arriving")
    rate_per_s: float = Field(10.0, gt=0, description="Poisson arrivals per second")
    memory_gb: float = Field(
        20.0,
        gt=0,
        description="server memory budget in GB (1e9 bytes) of the hardware it "
        "stands for: the large model's weights, the KV caches, the steps' logits and, while SD "
        "serves, the small model's weights; at least the large model's weights",
    )
    copies: int = Field(
        1,
        ge=1,
        le=4,
        description="sends of each request over a device's link, and of each final answer back",
    )
    deadline_base_s: float = Field(0.2, ge=0, description="every user's deadline starts here")
    deadline_per_token_s: tuple[float, float] = Field(
        (0.01, 0.05), description="plus its output tokens times a value drawn from this range"
    )
    draft_len: int = Field(4, ge=1, le=16, description="tokens drafted per SD round")
    fixed_share: float = Field(
        0.25, gt=0, lt=0.5, description="share of the server each open mode's fixed step cost takes"
    )
    period_s: float = Field(0.05, gt=0, description="scheduling period of the engine loop")
    profile: str | None = Field(
        None,
        description="cost-model JSON (`testbed profile`) of real hardware (an inventory "
        "lab); unset: measured on the server host once per run, as its engines run (an "
        "emulated lab's paced to its hardware, memory in the catalogue models' bytes)",
    )
    profile_repeats: int = Field(15, ge=1, description="timing rounds when profiling")
    threads: int = Field(1, ge=1, description="torch threads of the server")

    @model_validator(mode="after")
    def _range_ordered(self) -> BalanceSection:
        low, high = self.deadline_per_token_s
        if not 0 <= low <= high:
            raise ValueError("deadline_per_token_s: expected [low, high] with 0 <= low <= high")
        return self


class PaperFigure(Strict):
    """One published figure the run reproduces: a metric of the conditions whose swept values
    match `where`, beside the paper's `value`, with the reason for a gap (`why`)."""

    label: str = Field(description="what the figure is, e.g. 'SLED, 70B target'")
    metric: str = Field(description="a column of the conditions table, e.g. system_verified_tok_s")
    value: float = Field(description="the paper's figure")
    where: dict[str, Any] = Field(
        default_factory=dict, description="swept values a condition must have to count"
    )
    why: str = Field("", description="why ours differs by more than 20 %, from a measurement")


class PaperSection(Strict):
    """The published figures a playbook reproduces (shown beside ours in report and dashboard)."""

    source: str = Field(description="the paper and where in it the figures are")
    figures: list[PaperFigure] = Field(default_factory=list)


RTT_TOLERANCE_MS = 1.0  # the link guard's default where kernel stamps time the probe's echoes
USER_SPACE_RTT_TOLERANCE_MS = 2.0  # where it timed most in user space (adds 0.2-1 ms)


class ImpairmentSection(Strict):
    """Run-only knobs of the impairment (the link itself is the `link` profile)."""

    backend: Literal["auto", "netem", "nfqueue"] = "auto"
    rtt_tolerance_ms: float | None = Field(
        None,
        gt=0,
        description=f"max |measured - requested| median RTT; default {RTT_TOLERANCE_MS} ms, and "
        f"{USER_SPACE_RTT_TOLERANCE_MS} ms for a probe that timed most echoes in user space "
        "(adds 0.2-1 ms; only where packets held after the kernel's stamp had no release stamp "
        "from the holder)",
    )
    probe_packets: int = Field(200, ge=10)
    probe_retries: int = Field(
        1,
        ge=0,
        description="probes a link that does not measure as requested again, up to this many "
        "times, before the condition fails (a stall of the machine during a probe is not the "
        "link; a broken impairment fails every probe)",
    )

    def rtt_tolerance(self, user_space_rx: bool) -> float:
        """The median RTT tolerance: as set, else the default for how the probe timed echoes."""
        if self.rtt_tolerance_ms is not None:
            return self.rtt_tolerance_ms
        return USER_SPACE_RTT_TOLERANCE_MS if user_space_rx else RTT_TOLERANCE_MS


class Playbook(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""
    mode: Mode = Field(
        "sled",
        description="sled: devices draft, the server verifies; centralized: devices send "
        "prompts only and the server's target generates every token (the baseline); "
        "balance: one hybrid AD/SD server serves arriving users (the `balance` section); "
        "device-only: each device answers with its draft alone (no server, all unverified); "
        "server-ad / server-sd: every device's problems on the server alone, with the target "
        "(AD) or draft + target (SD)",
    )
    seed: int = 1
    topology: str | None = Field(None, description="topologies/*.yaml: hosts, classes, links")
    lab: LabSection = LabSection()
    models: ModelsSection = ModelsSection()
    workload: WorkloadSection = WorkloadSection()
    sled: SledSection = SledSection()
    link: LinkProfile = Field(
        LinkProfile(rtt_ms=85.0), description="every device's primary link (a LinkProfile)"
    )
    link_profile: str | None = Field(
        None,
        description="one of the topology's named `profiles` as every device's primary "
        "link, in place of `link` (sweepable: one profile per condition)",
    )
    impairment: ImpairmentSection = ImpairmentSection()
    balance: BalanceSection = BalanceSection()
    costs: str | None = Field(
        None, description="cost table YAML (`testbed costs --file`) over the default per-class one"
    )
    paper: PaperSection | None = Field(
        None, description="published figures this playbook reproduces, shown beside ours"
    )
    condition_timeout_s: float = Field(300.0, gt=0)
    faults: list[FaultSpec] = Field(
        default_factory=list,
        description="faults injected on purpose (testbed.runner.inject), at emulated times",
    )
    sweep: dict[str, list[Any]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _named_link(cls, data: Any) -> Any:
        """`link_profile` names a topology profile: `link` becomes that profile."""
        if not isinstance(data, dict) or data.get("link_profile") is None:
            return data
        name, topology = data["link_profile"], data.get("topology")
        if not isinstance(topology, str):
            raise ValueError("link_profile: names one of a topology's profiles; set `topology`")
        profiles = topology_profiles(topology)
        if name not in profiles:
            raise ValueError(
                f"link_profile: {name!r} is not one of {topology}'s profiles "
                f"({', '.join(profiles)})"
            )
        return {**data, "link": profiles[name].model_dump(mode="json", exclude_defaults=True)}

    @field_validator("sweep")
    @classmethod
    def _sweep_lists(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"sweep.{key}: expected a non-empty list of values")
            run_wide = any(key == k or key.startswith(k + ".") for k in RUN_WIDE_KEYS)
            if run_wide and key not in SWEEPABLE_LAB_KEYS:
                raise ValueError(
                    f"sweep.{key}: fixed for the whole run, cannot be swept "
                    f"(run-wide: {', '.join(RUN_WIDE_KEYS)})"
                )
        return v

    @model_validator(mode="after")
    def _sweep_keys_exist(self) -> Playbook:
        data = self.model_dump()
        for key in self.sweep:
            node: Any = data
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    raise ValueError(f"sweep key {key!r} does not name a playbook setting")
                node = node[part]
        return self


def lab_playbook(pb: Playbook) -> Playbook:
    """The playbook the lab is built from: with a swept `lab.devices`, its largest value (every
    condition then uses the first `lab.devices` devices of that lab)."""
    counts = pb.sweep.get("lab.devices")
    if not counts:
        return pb
    lab = pb.lab.model_copy(update={"devices": max(int(n) for n in counts)})
    return pb.model_copy(update={"lab": lab})


class Condition(BaseModel):
    """One point of the sweep: its id, the swept values and the full resolved playbook."""

    id: str
    index: int
    values: dict[str, Any]
    playbook: Playbook


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def shown_value(value: Any) -> Any:
    """A swept value as ids and labels show it: a list of named entries (a `faults` list) by
    their names (`server-crash+dev-cut`, `none` for an empty one), anything else as it is."""
    if isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value):
        return "+".join(str(v["name"]) for v in value) or "none"
    return value


def condition_id(index: int, values: dict[str, Any]) -> str:
    """Stable, readable id: index plus swept values, e.g. `c01-link.loss=0.1-<digest>`."""
    label = ",".join(f"{k}={shown_value(v)}" for k, v in values.items()) or "base"
    digest = hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()
    safe = "".join(ch if ch.isalnum() or ch in "._=-," else "_" for ch in label)[:60]
    return f"c{index:02d}-{safe}-{digest[:6]}"


DEFAULT_MAX_CONDITIONS = 1000
REPETITION = "repetition"  # the sweep value naming a repetition of a sweep point


class Sweep:
    """The conditions of a playbook, expanded lazily: the count and the ids come at once from
    the sweep's lists; each condition is resolved and validated only when iterated to.

    With `workload.repetitions` r > 1 every sweep point runs r times; repetition k (value
    `repetition`) adds k to `workload.seed` and `workload.arrival.seed`. Repetitions are the
    outer loop: the whole sweep runs once, then again, so conditions compared within one
    repetition (policies, say) run back to back, and a slow spell of the host falls on one
    repetition of several points rather than on every repetition of one.
    """

    def __init__(self, playbook: Playbook, source: str = "playbook") -> None:
        self.playbook = playbook
        self.source = source
        self.keys = list(playbook.sweep)
        self.repetitions = playbook.workload.repetitions
        self.count = math.prod(len(v) for v in playbook.sweep.values()) * self.repetitions

    def __len__(self) -> int:
        return self.count

    def values(self) -> Iterator[dict[str, Any]]:
        """The swept values of each condition, in order."""
        for rep in range(self.repetitions):
            for combo in itertools.product(*(self.playbook.sweep[k] for k in self.keys)):
                values = dict(zip(self.keys, combo, strict=True))
                yield values if self.repetitions == 1 else {REPETITION: rep, **values}

    def ids(self) -> Iterator[str]:
        """Condition ids in order, without resolving any condition."""
        for index, values in enumerate(self.values()):
            yield condition_id(index, values)

    def check_values(self) -> None:
        """Validate every swept value on its own (applied to the base playbook): a cheap check
        for sweeps too large to resolve whole; combinations are checked as a run reaches them."""
        base = self.playbook.model_dump()
        base["sweep"] = {}
        for key in self.keys:
            for value in self.playbook.sweep[key]:
                data = copy.deepcopy(base)
                _set(data, key, value)
                validate(Playbook, data, f"{self.source} (sweep {key}={value!r})")

    def __iter__(self) -> Iterator[Condition]:
        base = self.playbook.model_dump()
        base["sweep"] = {}
        for index, values in enumerate(self.values()):
            data = copy.deepcopy(base)
            for key, value in values.items():
                if key != REPETITION:
                    _set(data, key, value)
            rep = values.get(REPETITION, 0)
            data["workload"]["seed"] += rep
            data["workload"]["arrival"]["seed"] += rep
            resolved = validate(Playbook, data, f"{self.source} (sweep {values})")
            yield Condition(
                id=condition_id(index, values), index=index, values=values, playbook=resolved
            )


def planned_ids(sweep: Sweep, limit: int = 10_000) -> list[str] | None:
    """The condition ids a manifest lists: all of them, or None past `limit` (a huge allowed
    sweep starts at once; its ids follow from the saved playbook)."""
    return list(sweep.ids()) if len(sweep) <= limit else None


def expand(
    playbook: Playbook, source: str = "playbook", max_conditions: int = DEFAULT_MAX_CONDITIONS
) -> Sweep:
    """The playbook's sweep (the cartesian product of its lists), refused at once when it has
    more than max_conditions conditions; the message names the count and every key's size."""
    sweep = Sweep(playbook, source)
    if sweep.count > max_conditions:
        sizes = " x ".join(
            [f"{k} ({len(v)})" for k, v in playbook.sweep.items()]
            + ([f"repetitions ({sweep.repetitions})"] if sweep.repetitions > 1 else [])
        )
        raise BadInputError(
            f"{source}: sweep: {sweep.count:,} conditions ({sizes}) exceed the limit of "
            f"{max_conditions:,}; narrow the sweep or raise the limit with --max-conditions"
        )
    return sweep


def find_topology(name: object, source: Path) -> Path:
    """The topology file a playbook names: beside the playbook, else in the repository."""
    if not isinstance(name, str):
        raise BadInputError(f"{source}: topology: expected a path to a topology file")
    candidates = [source.parent / name, REPO_ROOT / name]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise BadInputError(
            f"{source}: topology: {name} not found (looked in {source.parent} and {REPO_ROOT})"
        )
    return found.resolve()


def apply_topology(data: dict[str, Any], source: Path) -> None:
    """Resolve `topology` to its file and fill `link` fields the playbook does not set from the
    topology's primary profile (the first device's)."""
    found = find_topology(data["topology"], source)
    data["topology"] = str(found)
    topo = load_topology(found)
    primary = topo.link(topo.devices[0].name)
    section = data.setdefault("link", {})
    if primary is not None and isinstance(section, dict):
        for k, v in primary.profile.model_dump(exclude_defaults=True).items():
            if k == "trace":  # a topology's trace: beside the topology, else in the repository
                v = str(next((p for p in (found.parent / v, REPO_ROOT / v) if p.is_file()),
                             found.parent / v).resolve())  # fmt: skip
            section.setdefault(k, v)
        section.setdefault("rtt_ms", primary.profile.rtt_ms)


def playbook_topology(pb: Playbook, source: str = "playbook") -> Topology:
    """The topology a playbook runs on: its file (or a star of 2), its devices of class
    `lab.device_class` if set, rescaled to `lab.devices`, with every primary link set to the
    playbook's `link` profile."""
    topo = load_topology(pb.topology) if pb.topology else Topology.star(2)
    if pb.lab.device_class is not None:
        topo = topo.with_device_class(pb.lab.device_class)
    if pb.lab.devices is not None:
        try:
            topo = topo.with_devices(pb.lab.devices)
        except ValueError as exc:
            raise BadInputError(f"{source}: lab.devices: {exc}") from None
    return topo.with_primary_profile(pb.link)


def with_lab(pb: Playbook, source: str, kind: str | None, inventory: str | None) -> Playbook:
    """The playbook with its lab kind (and inventory) replaced, as `testbed run --lab` asks."""
    if kind is None and inventory is None:
        return pb
    data = pb.model_dump(mode="json")
    data["lab"]["kind"] = kind or ("inventory" if inventory else pb.lab.kind)
    if inventory is not None:
        data["lab"]["inventory"] = str(Path(inventory).resolve())
    return validate(Playbook, data, f"{source} (--lab)")


# Settings naming a file: a relative path in a playbook is relative to the playbook's folder,
# in the playbook and in the values its sweep gives them (`link.trace: [...]`, or `link: [{trace:
# ...}]`).
FILE_KEYS = ("costs", "lab.inventory", "workload.gsm8k_path", "workload.fewshot_path",
             "balance.profile", "link.trace")  # fmt: skip


def _resolve_at(node: Any, dotted: str, folder: Path) -> None:
    """Make the path at `dotted` under the mapping `node` absolute (relative to `folder`)."""
    *parents, leaf = dotted.split(".") if dotted else [""]
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(leaf), str):
        node[leaf] = str((folder / node[leaf]).resolve())


def resolve_file_keys(data: dict[str, Any], folder: Path) -> None:
    """Make every FILE_KEYS path in the raw playbook `data` and in its sweep's values absolute
    (relative to `folder`)."""
    sweep = data.get("sweep") if isinstance(data.get("sweep"), dict) else {}
    for dotted in FILE_KEYS:
        _resolve_at(data, dotted, folder)
        for key, values in sweep.items():
            if not isinstance(values, list):
                continue
            if key == dotted:
                sweep[key] = [str((folder / v).resolve()) if isinstance(v, str) else v
                              for v in values]  # fmt: skip
            elif dotted.startswith(key + "."):
                for value in values:
                    _resolve_at(value, dotted[len(key) + 1 :], folder)


def swept_links(pb: Playbook, source: str) -> list[tuple[str, LinkProfile]]:
    """Every link profile a playbook may run: its `link`, and the one each value of a swept
    `link` or `link.<field>` makes of it (each validated, naming `source` and the value)."""
    out = [("link", pb.link)]
    base = pb.link.model_dump()
    for key, values in pb.sweep.items():
        if key != "link" and not key.startswith("link."):
            continue
        for value in values:
            whole = key == "link" and isinstance(value, dict)
            fields = dict(value) if whole else copy.deepcopy(base)
            if key != "link":
                _set(fields, key[len("link.") :], value)
            out.append((f"sweep {key}={value!r}", LinkProfile.build(f"{source}: sweep {key}",
                                                                    **fields)))  # fmt: skip
    return out


def check_link_files(pb: Playbook, source: str) -> None:
    """Read every trace a playbook's links name (its `link` and each swept one): BadInputError
    naming the playbook, the setting, and the trace's file, row and column."""
    for where, profile in swept_links(pb, source):
        if profile.trace is None:
            continue
        try:
            timeline(profile)
        except BadInputError as exc:
            raise BadInputError(f"{source}: {where}: trace: {exc}") from None


def load_playbook(path: str | Path) -> Playbook:
    """Read and validate a playbook file (with its topology's defaults, if it names one)."""
    path = Path(path)
    data = read_yaml(path)
    if isinstance(data, dict) and data.get("topology") is not None:
        apply_topology(data, path)
    if isinstance(data, dict):
        resolve_file_keys(data, path.parent)
    pb = validate(Playbook, data, str(path))
    if pb.workload.kind == "gsm8k" and not pb.workload.gsm8k_path:
        raise BadInputError(f"{path}: workload.gsm8k_path: required when workload.kind is gsm8k")
    check_link_files(pb, str(path))
    if pb.costs:  # checked now, not after the first condition
        load_cost_table(Path(pb.costs))
    return pb
