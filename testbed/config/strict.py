"""The base of every playbook section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base: unknown keys are errors (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid")
