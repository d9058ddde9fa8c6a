"""Service-level objectives a workload is judged against (goodput)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Slo(BaseModel):
    """Per-request latency limits; a request meets the SLO when it is within every limit given.

    Limits left out are not checked; with none given every request meets the SLO.
    """

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(None, gt=0, description="time to first token, ms")
    tpot_ms: float | None = Field(None, gt=0, description="mean time per output token, ms")
    e2e_s: float | None = Field(None, gt=0, description="end-to-end latency, s")
