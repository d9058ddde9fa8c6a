"""The one link-profile schema: what a link does to packets, read from playbooks and topologies.

Delay: `rtt_ms` is the round-trip delay, split evenly (rtt_ms / 2 each way). Jitter:
`jitter_ms` is the spread added to each direction's delay, drawn from `jitter_dist` (netem's
names: uniform is netem's default, [-j, +j]; normal, pareto and paretonormal have sigma j; a
delay is never below 0). `order` says what jitter may do to the order of packets: `keep` (the
default) releases each packet no earlier than the one before it, as one FIFO link does, so a
packet whose jitter would take it past its predecessor waits for it and the realized delays
shift upward where jitter exceeds the spacing of packets; `reorder` releases each when its own
delay says, so packets pass each other and the delays are the drawn ones (netem's default).
`testbed.links.model` is this model in numbers. Loss per direction (up = device -> server): a
number is random loss (netem `loss random P`); a mapping is Gilbert-Elliott (netem `loss
gemodel p r 1-h 1-k`).
`queue_limit` is the most packets held per direction (netem `limit`). A `schedule` (steps) or a
`trace` (CSV of delay and loss over time) changes the profile while it runs; times count from
when the profile is applied.

Loss semantics (stated in every result): per-direction independent packet loss; a
request/response round trip survives with probability (1 - loss_up) * (1 - loss_down), i.e.
(1 - p)^2 for a symmetric random `loss` p.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from testbed.core.loading import validate

LOSS_SEMANTICS = (
    "per-direction independent packet loss (up = device->server, down = server->device); "
    "a round trip survives with (1 - loss_up) * (1 - loss_down)"
)
JitterDist = Literal["uniform", "normal", "pareto", "paretonormal"]
Order = Literal["keep", "reorder"]
DEFAULT_QUEUE_LIMIT = 100_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GilbertElliott(Strict):
    """Gilbert-Elliott loss, named as netem names it (`loss gemodel p r 1-h 1-k`), as fractions.

    p: good -> bad transition probability per packet; r: bad -> good; one_minus_h (`1-h`): loss
    probability in the bad state; one_minus_k (`1-k`): loss probability in the good state.
    """

    p: float = Field(ge=0, le=1)
    r: float = Field(ge=0, le=1)
    one_minus_h: float = Field(1.0, ge=0, le=1, alias="1-h")
    one_minus_k: float = Field(0.0, ge=0, le=1, alias="1-k")

    @model_validator(mode="after")
    def _can_leave_bad(self) -> GilbertElliott:
        if self.p > 0 and self.r == 0:
            raise ValueError("r must be > 0 when p > 0 (the bad state would never end)")
        return self

    @property
    def bad_share(self) -> float:
        """Long-run share of packets seen in the bad state: p / (p + r)."""
        return 0.0 if self.p == 0 else self.p / (self.p + self.r)

    @property
    def mean_loss(self) -> float:
        """Long-run loss rate of the chain."""
        b = self.bad_share
        return (1 - b) * self.one_minus_k + b * self.one_minus_h

    @property
    def mean_burst(self) -> float:
        """Mean length of a run of consecutive losses: 1 / (1 - q), q = (1-r)(1-h) + r(1-k).

        A packet is lost by the state it meets, then the chain steps (as netem does), so a loss
        in the bad state is followed by another with probability q. Exact when 1-k = 0 (then
        every loss is met in the bad state); 1 / r when also 1-h = 1.
        """
        q = (1 - self.r) * self.one_minus_h + self.r * self.one_minus_k
        return 1 / (1 - q) if q < 1 else float("inf")

    @classmethod
    def random(cls, loss: float) -> GilbertElliott:
        """Independent loss `loss` written as a chain that never leaves the good state."""
        return cls(p=0.0, r=1.0, one_minus_h=1.0, one_minus_k=loss)


def _loss_kind(value: Any) -> str:
    return "gemodel" if isinstance(value, dict | GilbertElliott) else "random"


Rate = Annotated[float, Field(ge=0, le=1)]
Loss = Annotated[
    Annotated[Rate, Tag("random")] | Annotated[GilbertElliott, Tag("gemodel")],
    Discriminator(_loss_kind),
]


def _mean(loss: Loss) -> float:
    return loss.mean_loss if isinstance(loss, GilbertElliott) else loss


class ScheduleStep(Strict):
    """From `at_s` seconds after apply on, these fields replace the profile's (unset: kept)."""

    at_s: float = Field(ge=0)
    rtt_ms: float | None = Field(None, ge=0, le=60_000)
    jitter_ms: float | None = Field(None, ge=0)
    loss: Loss | None = None
    loss_up: Loss | None = None
    loss_down: Loss | None = None


class LinkProfile(Strict):
    """Requested impairment of one link (see the module docstring for every field's meaning).

    `loss` sets both directions unless `loss_up` / `loss_down` override it. `seed` seeds jitter
    and loss in the userspace holder (netem's own randomness cannot be seeded).
    """

    rtt_ms: float = Field(0.0, ge=0, le=60_000, description="round-trip delay, split evenly")
    jitter_ms: float = Field(0.0, ge=0)
    jitter_dist: JitterDist = "uniform"
    order: Order = Field(
        "keep",
        description="keep: no packet passes another; reorder: each leaves when its own delay says",
    )
    loss: Loss = 0.0
    loss_up: Loss | None = None
    loss_down: Loss | None = None
    rate_mbit: float | None = Field(None, gt=0)
    queue_limit: int = Field(DEFAULT_QUEUE_LIMIT, ge=1, le=1_000_000)
    seed: int | None = None
    schedule: tuple[ScheduleStep, ...] = ()
    trace: Path | None = Field(None, description="CSV: t_s, rtt_ms, loss[, jitter_ms, ...]")

    @model_validator(mode="after")
    def _consistent(self) -> LinkProfile:
        if self.jitter_ms > self.rtt_ms / 2 and self.jitter_dist == "uniform":
            raise ValueError(
                f"jitter_ms ({self.jitter_ms}) must not exceed the one-way delay rtt_ms/2 "
                f"({self.rtt_ms / 2})"
            )
        if self.schedule and self.trace is not None:
            raise ValueError("give either schedule or trace, not both")
        times = [s.at_s for s in self.schedule]
        if times != sorted(times):
            raise ValueError(f"schedule: at_s must increase, got {times}")
        return self

    @classmethod
    def build(cls, source: str = "link profile", **fields: object) -> LinkProfile:
        """Validate, raising BadInputError that names `source` and the bad field."""
        return validate(cls, fields, source)

    def loss_model(self, direction: Literal["up", "down"]) -> Loss:
        """The loss of one direction as given (a rate or a Gilbert-Elliott chain)."""
        own = self.loss_up if direction == "up" else self.loss_down
        return self.loss if own is None else own

    def gilbert_elliott(self, direction: Literal["up", "down"]) -> GilbertElliott:
        """One direction's loss as a Gilbert-Elliott chain (random loss: a one-state chain)."""
        loss = self.loss_model(direction)
        return loss if isinstance(loss, GilbertElliott) else GilbertElliott.random(loss)

    @property
    def up_loss(self) -> float:
        """Mean loss device -> server."""
        return _mean(self.loss_model("up"))

    @property
    def down_loss(self) -> float:
        """Mean loss server -> device."""
        return _mean(self.loss_model("down"))

    @property
    def one_way_ms(self) -> float:
        return self.rtt_ms / 2

    @property
    def round_trip_loss(self) -> float:
        """Probability a request/response pair is lost (mean rates)."""
        return 1 - (1 - self.up_loss) * (1 - self.down_loss)

    @property
    def varies(self) -> bool:
        """True when the profile changes over time (a schedule or a trace)."""
        return bool(self.schedule) or self.trace is not None

    @property
    def is_null(self) -> bool:
        """True when the profile changes nothing, now or later."""
        return (
            self.rtt_ms == 0
            and self.jitter_ms == 0
            and self.up_loss == 0
            and self.down_loss == 0
            and self.rate_mbit is None
            and not self.varies
        )
