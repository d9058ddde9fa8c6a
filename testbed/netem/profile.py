"""A link profile: the delay, jitter, loss and rate asked of a device <-> server link.

Loss semantics (stated in every result): `loss_up` / `loss_down` are independent per-packet
losses in each direction (up = device -> server); a request/response round trip survives with
probability (1 - loss_up) * (1 - loss_down), i.e. (1 - p)^2 for a symmetric `loss` p.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from testbed.config.loading import validate

LOSS_SEMANTICS = (
    "per-direction independent packet loss (up = device->server, down = server->device); "
    "a round trip survives with (1 - loss_up) * (1 - loss_down)"
)


class LinkProfile(BaseModel):
    """Requested impairment of each device <-> server link.

    `rtt_ms` is split evenly: half added device->server, half server->device. `jitter_ms` adds
    a uniform [-j, +j] to each direction's delay without reordering packets. `loss` sets both
    directions unless `loss_up` / `loss_down` override it. `seed` seeds the jitter (kernel-side
    random loss cannot be seeded).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rtt_ms: float = Field(0.0, ge=0, le=60_000)
    jitter_ms: float = Field(0.0, ge=0)
    loss: float = Field(0.0, ge=0, le=1)
    loss_up: float | None = Field(None, ge=0, le=1)
    loss_down: float | None = Field(None, ge=0, le=1)
    rate_mbit: float | None = Field(None, gt=0)
    seed: int | None = None

    @model_validator(mode="after")
    def _jitter_fits(self) -> LinkProfile:
        if self.jitter_ms > self.rtt_ms / 2:
            raise ValueError(
                f"jitter_ms ({self.jitter_ms}) must not exceed the one-way delay rtt_ms/2 "
                f"({self.rtt_ms / 2})"
            )
        return self

    @classmethod
    def build(cls, source: str = "link profile", **fields: object) -> LinkProfile:
        """Validate, raising BadInputError that names `source` and the bad field."""
        return validate(cls, fields, source)

    @property
    def up_loss(self) -> float:
        return self.loss if self.loss_up is None else self.loss_up

    @property
    def down_loss(self) -> float:
        return self.loss if self.loss_down is None else self.loss_down

    @property
    def one_way_ms(self) -> float:
        return self.rtt_ms / 2

    @property
    def round_trip_loss(self) -> float:
        """Probability a request/response pair is lost."""
        return 1 - (1 - self.up_loss) * (1 - self.down_loss)

    @property
    def is_null(self) -> bool:
        """True when the profile changes nothing."""
        return (
            self.rtt_ms == 0
            and self.jitter_ms == 0
            and self.up_loss == 0
            and self.down_loss == 0
            and self.rate_mbit is None
        )
