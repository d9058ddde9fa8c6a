"""The server's cost model: what one forward costs and what one token of KV cache weighs.

Measured on the host by `testbed profile` (see `profile.py`), stored as JSON, and read back
by the scheduler (per-user demands) and the simulator (step times). Step times are linear in
the batch size b: t(b) = fixed_s + per_seq_s * b, fitted by least squares.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from agents.balance.modes import AD, SD
from testbed.errors import BadInputError


class StepCost(BaseModel):
    """Time of one batched forward: t(b) = fixed_s + per_seq_s * b (seconds)."""

    fixed_s: float = Field(ge=0)
    per_seq_s: float = Field(ge=0)

    def time(self, batch: float) -> float:
        return self.fixed_s + self.per_seq_s * batch


class ModelCost(BaseModel):
    """One model: weights, KV bytes per token, decode step and prefill cost."""

    weights_bytes: int = Field(ge=0)
    kv_bytes_per_token: int = Field(gt=0)
    decode: StepCost  # one new token per sequence
    prefill_per_token_s: float = Field(ge=0)


class CostModel(BaseModel):
    """The large (target) and small (draft) model on one server, and the pair's acceptance."""

    target: ModelCost
    draft: ModelCost
    verify: StepCost  # the target scoring draft_len + 1 tokens per sequence
    draft_len: int = Field(ge=1)
    acceptance: float = Field(ge=0, lt=1)  # per-position acceptance probability a
    verify_workspace_bytes: int = Field(ge=0)  # logits and scratch of one verification batch
    host: str = ""
    points: dict[str, list[tuple[int, float]]] = {}  # the measurements the fits came from

    @property
    def tokens_per_round(self) -> float:
        """Expected tokens an SD round yields: (1 - a^(g+1)) / (1 - a)."""
        a, g = self.acceptance, self.draft_len
        return (1 - a ** (g + 1)) / (1 - a)

    def step_cost(self, mode: int) -> StepCost:
        """One AD step (a target decode) or one SD round (g draft steps and a verification)."""
        if mode == AD:
            return self.target.decode
        g = self.draft_len
        return StepCost(
            fixed_s=g * self.draft.decode.fixed_s + self.verify.fixed_s,
            per_seq_s=g * self.draft.decode.per_seq_s + self.verify.per_seq_s,
        )

    def tokens_per_step(self, mode: int) -> float:
        return 1.0 if mode == AD else self.tokens_per_round

    def prefill_s(self, mode: int, prompt_tokens: int | float) -> float:
        """Prefill of a prompt: the target's, and the draft's too in SD."""
        per_token = self.target.prefill_per_token_s
        if mode == SD:
            per_token += self.draft.prefill_per_token_s
        return per_token * prompt_tokens

    def kv_bytes(self, mode: int, tokens: int | float) -> float:
        """KV cache of one user; SD holds both caches, up to draft_len tokens ahead."""
        if mode == AD:
            return self.target.kv_bytes_per_token * tokens
        per_token = self.target.kv_bytes_per_token + self.draft.kv_bytes_per_token
        return per_token * (tokens + self.draft_len)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")


def load_cost_model(path: Path) -> CostModel:
    """Read a profile JSON; errors name the file, the key and what was expected."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such cost-model file (run `testbed profile`)") from None
    except json.JSONDecodeError as exc:
        raise BadInputError(f"{path}: not valid JSON ({exc})") from None
    try:
        return CostModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise BadInputError(f"{path}: key {key!r}: {first['msg']}") from None
