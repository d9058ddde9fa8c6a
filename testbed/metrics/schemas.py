"""Typed records, one dataclass per table, and the pyarrow schema each one defines.

Agents write plain JSON lines (they must not import the controller); the controller reads
them into these records. A table's pyarrow schema is derived from its dataclass, so a column
is declared once: `int`/`float`/`str`/`bool` map to int64/float64/string/bool, and an
`X | None` field is a nullable column that may be absent from the agent's file.

Times (`t_*`) are seconds since the epoch *on the host that wrote the record*; durations are
taken between two times of one host (see `testbed.metrics.condition_stats`), and a time set
against another host's is first moved onto the controller's clock with its host's measured
offset (`testbed.metrics.clocks`; the hosts table carries each host's). The link_changes
table's times are on the controller's clock already.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

ARROW_TYPES: dict[type, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
}


@dataclass(frozen=True)
class RoundRecord:
    """One device round: draft, then a verdict (`verified`) or the draft kept (`fallback`); in
    the centralized mode one `centralized` round per token, at the time a streaming client
    would have seen it, its decoding steps spread evenly (agents/sled/central_rounds.py).

    Beside these columns the agents write `conf` (the drafter's probability of each drafted
    token, a list) and look-ahead counters; they are kept as extra columns."""

    table: ClassVar[str] = "rounds"
    condition: str
    dev: str
    problem: str
    round: int
    t_start: float
    t_end: float
    mode: str  # verified, fallback, local (device-only), centralized, server-ad, server-sd
    tokens: int  # tokens the round added to the answer (after EOS / budget cut)
    drafted: int = 0
    draft_len: int | None = None  # the draft length the device chose (adaptive drafting)
    accepted: int | None = None  # verified rounds: drafts the target accepted
    attempts: int = 0
    retry_drafts: int | None = None  # drafts a retry carried (the confident prefix), if fewer
    rtt_ms: float | None = None
    waited_ms: float = 0.0
    draft_ms: float = 0.0
    draft_modelled_ms: float | None = None  # the emulated hardware's time for those drafts
    batch: int | None = None
    server_queue_ms: float | None = None
    server_compute_ms: float | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One answered problem on one device (times on that device's clock)."""

    table: ClassVar[str] = "requests"
    condition: str
    dev: str
    problem: str
    t_start: float
    t_end: float
    tokens: int
    verified_tokens: int
    fallback_tokens: int
    rounds: int
    prompt_tokens: int = 0
    asked_tokens: int | None = None  # the answer length it was held to (workload.stands_for)
    stands_for: str | None = None  # the stood-for request it took its lengths from
    t_arrival: float | None = None  # open-loop arrivals: when the request arrived (may wait)
    text: str = ""
    reference: str | None = None
    strict_correct: bool | None = None
    flexible_correct: bool | None = None
    target_text: str | None = None  # the target's own greedy answer (AD, on the server host)
    matches_target: bool | None = None
    target_strict_correct: bool | None = None  # the target's own answer, scored alike
    target_flexible_correct: bool | None = None


@dataclass(frozen=True)
class HostRecord:
    """One host's part in a condition: when its agent ran, its class, its clock offset.

    Agents report their own start and end (status file, `clock` "own"); a server that left no
    status (killed) has the span the controller timed around starting and stopping it (`clock`
    "controller"). Power and energy are the agent's own samples (`agents.power`) over its
    span; `power_source` None: none measured, cost uses the class's nominal power.
    """

    table: ClassVar[str] = "hosts"
    condition: str
    dev: str  # the host's name
    t_start: float
    t_end: float
    answered: int = 0
    role: str = "device"
    host_class: str | None = None
    clock: str = "own"  # whose clock t_start / t_end are on: "own" or "controller"
    clock_offset_s: float | None = None  # host clock - controller clock, as the condition began
    clock_offset_err_s: float | None = None  # its error bound (metrics.clocks)
    power_w: float | None = None  # mean measured power, where the host reports it
    energy_j: float | None = None  # measured energy over the span
    power_source: str | None = None  # "nvidia-smi", "tegrastats", "rapl"; None: nominal


@dataclass(frozen=True)
class LinkRecord:
    """One device-server path of a condition: the profile asked for and what the probe saw."""

    table: ClassVar[str] = "links"
    condition: str
    dev: str
    backend: str | None = None
    rtt_requested_ms: float | None = None
    loss_requested: float | None = None  # per direction (a round trip survives (1-p)^2)
    rtt_measured_ms: float | None = None
    rtt_error_p99_ms: float | None = None
    loss_up_measured: float | None = None
    loss_down_measured: float | None = None
    loss_within_95: bool | None = None


@dataclass(frozen=True)
class LinkChangeRecord:
    """A change of a device's link during a condition: a profile phase the packet holder
    applied (`kind` "change": a schedule step, a trace row, a cut, a heal; one row per
    direction) or a failover of the backup path's monitor (`kind` "failover"). `t` is on the
    controller's clock: the time the holder or monitor stamped, moved by the offset of the
    machine that stamped it (`clock_offset_s`, metrics.clocks)."""

    table: ClassVar[str] = "link_changes"
    condition: str
    dev: str  # the link (`dev1`, `dev1/backup`) or, for a failover, the device
    t: float  # controller clock
    kind: str = "change"  # "change" or "failover"
    phase: int | None = None  # the holder's phase (0: the profile as first applied)
    rtt_ms: float | None = None
    loss: float | None = None
    rate_mbit: float | None = None
    note: str = ""
    reaction_s: float | None = None  # to the end of the device's next round (link_reaction)
    clock_offset_s: float | None = None  # of the machine that stamped t (host - controller)
    clock_offset_err_s: float | None = None


@dataclass(frozen=True)
class VerificationRecord:
    """One verification on the server (server clock)."""

    table: ClassVar[str] = "verifications"
    condition: str
    dev: str
    t: float
    rid: int
    sid: str
    drafted: int
    accepted: int
    fed: int
    batch: int
    queue_ms: float
    compute_ms: float


@dataclass(frozen=True)
class BatchRecord:
    """One batched target forward on the server (server clock)."""

    table: ClassVar[str] = "batches"
    condition: str
    t: float
    batch: int
    tokens: int
    compute_ms: float
    modelled_ms: float | None = None  # the emulated hardware's time for this forward


@dataclass(frozen=True)
class PacingRecord:
    """One engine of one host in a condition, paced to (or, on real hardware, predicted as) a
    model on the hardware its host stands for (`agents.emulation.pacing`). Times are in
    emulated seconds but the pacing error, which is real milliseconds (call - budget)."""

    table: ClassVar[str] = "pacing"
    condition: str
    dev: str  # the host
    role: str  # the engine: draft or target
    hardware: str
    model: str
    paced: bool  # False: real hardware, the model's time only predicted
    forwards: int
    behind: int  # forwards whose real computation took longer than their modelled time
    modelled_s: float
    computed_s: float
    error_ms_p50: float | None = None
    error_ms_p99: float | None = None
    computed_share_p50: float | None = None  # real computation / modelled time, per forward
    computed_share_max: float | None = None


@dataclass(frozen=True)
class ConditionRecord:
    """One condition of a run, from its journal entry. Beside these columns the table holds
    `sweep.<key>` (the swept values), `link_requested.<field>` and the figures of
    `ConditionStats.as_row`."""

    table: ClassVar[str] = "conditions"
    condition: str
    index: int
    status: str  # "done", "faulted" (an agent stopped before the runner stopped it), "failed"
    label: str
    reason: str = ""
    faults: int = 0  # faults the condition saw that nobody asked for (testbed.runner.watch)
    faults_injected: int = 0  # faults the playbook's `faults` section asked for
    seconds: float | None = None  # controller clock, start to journal
    backend: str | None = None
    rtt_measured_ms: float | None = None
    rtt_error_p99_ms: float | None = None
    loss_up_measured: float | None = None
    loss_down_measured: float | None = None
    loss_measured: float | None = None
    loss_within_95: bool | None = None


@dataclass(frozen=True)
class FaultRecord:
    """An agent that stopped before the runner stopped it (detected), or a fault the playbook's
    `faults` section asked for (injected). Times are on the controller's clock; `t_condition_s`
    counts emulated seconds from the condition's start (the devices' start, where they run)."""

    table: ClassVar[str] = "faults"
    condition: str
    host: str
    agent: str  # the process the runner started: sled-server, sled-device, balance-client, ...
    reason: str  # one line naming host, agent, signal or exit status and time
    t: float
    t_condition_s: float
    injected: bool = False
    exit_status: int | None = None  # None: no status (its process group was killed, host lost)
    signal: str | None = None  # SIGKILL, ... where the status says a signal ended it
    log_tail: str = ""  # the agent's last log lines
    action: str | None = None  # injected: kill, freeze, cut, fill_kv
    back_t: float | None = None  # injected: when the agent ran (or the link carried) again
    recovery_s: float | None = None  # back -> every device's next verified round (emulated s)
    unverified_tokens: int | None = None  # tokens the devices kept unverified meanwhile


RECORDS: tuple[type, ...] = (
    ConditionRecord,
    RoundRecord,
    RequestRecord,
    HostRecord,
    LinkRecord,
    LinkChangeRecord,
    VerificationRecord,
    BatchRecord,
    PacingRecord,
    FaultRecord,
)


def _arrow_field(name: str, hint: Any) -> pa.Field:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return pa.field(name, ARROW_TYPES[inner], nullable=True)
    return pa.field(name, ARROW_TYPES[hint], nullable=False)


def schema_of(record: type) -> pa.Schema:
    """The pyarrow schema of a record dataclass (field order kept)."""
    hints = typing.get_type_hints(record)
    return pa.schema([_arrow_field(f.name, hints[f.name]) for f in dataclasses.fields(record)])


SCHEMAS: dict[str, pa.Schema] = {r.table: schema_of(r) for r in RECORDS}  # type: ignore[attr-defined]


def defaults_of(record: type) -> dict[str, Any]:
    """Field name -> default value, for the fields that have one (None for nullable ones)."""
    return {
        f.name: f.default
        for f in dataclasses.fields(record)
        if f.default is not dataclasses.MISSING
    }


DEFAULTS: dict[str, dict[str, Any]] = {r.table: defaults_of(r) for r in RECORDS}  # type: ignore[attr-defined]
