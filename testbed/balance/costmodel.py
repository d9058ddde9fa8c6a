"""The server's cost model: what one step of the engine loop costs and what it yields.

Measured on the host by `testbed profile` (see `profile.py`), stored as JSON, and read back
by the scheduler (per-user demands) and the simulator (step times, tokens per round). Step
times are those of the loop's own steps (an AD step, an SD round, as `agents.balance.engine`
runs them), back to back and after an idle wait, linear in the batch size b:
t(b) = fixed_s + per_seq_s * b, fitted by least squares. An SD round's tokens follow the
distribution measured on the workload.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, model_validator

from agents.balance.modes import AD, SD
from testbed.errors import BadInputError


class StepCost(BaseModel):
    """Time of one batched forward: t(b) = fixed_s + per_seq_s * b (seconds)."""

    fixed_s: float = Field(ge=0)
    per_seq_s: float = Field(ge=0)

    def time(self, batch: float) -> float:
        return self.fixed_s + self.per_seq_s * batch


class LoopStep(BaseModel):
    """One step of the engine loop, timed two ways: right after another step (`busy`), and
    as the first step after the loop slept out a period (`after_idle`: the CPU's caches gone
    cold; on the 2-core VM 14-47 % slower, 0.8-2.1 ms at batch 1-4)."""

    busy: StepCost
    after_idle: StepCost

    def time(self, batch: float, after_idle: bool) -> float:
        return (self.after_idle if after_idle else self.busy).time(batch)

    @property
    def wake_s(self) -> float:
        """What a step after idle costs more than one back to back (at batch size 1)."""
        return max(0.0, self.after_idle.time(1) - self.busy.time(1))


class ModelCost(BaseModel):
    """One model: weights, KV bytes per token and prefill cost."""

    weights_bytes: int = Field(ge=0)
    kv_bytes_per_token: int = Field(gt=0)
    prefill_per_token_s: float = Field(ge=0)


class CostModel(BaseModel):
    """The large (target) and small (draft) model on one server, the loop's step costs and
    what an SD round yields."""

    target: ModelCost
    draft: ModelCost
    ad_step: LoopStep  # one batched target decode, as the loop runs it
    sd_round: LoopStep  # g batched draft forwards, a verification, acceptance and rollback
    draft_len: int = Field(ge=1)
    acceptance: float = Field(ge=0, lt=1)  # per-position acceptance probability a (MLE)
    round_tokens: list[float]  # probability that an SD round yields 1, 2, ..., g+1 tokens
    logits_row_bytes: int = Field(gt=0)  # one position's logits (float32 x vocabulary)
    host: str = ""
    points: dict[str, list[tuple[int, float]]] = {}  # the measurements the fits came from

    @model_validator(mode="after")
    def _round_tokens_is_a_distribution(self) -> CostModel:
        p = self.round_tokens
        if len(p) != self.draft_len + 1 or min(p) < 0 or abs(sum(p) - 1) > 1e-6:
            raise ValueError(
                f"round_tokens: expected {self.draft_len + 1} probabilities (1..draft_len+1 "
                f"tokens per round) summing to 1, got {p}"
            )
        return self

    @property
    def tokens_per_round(self) -> float:
        """Expected tokens an SD round yields (the bonus or correction token included)."""
        return sum((k + 1) * p for k, p in enumerate(self.round_tokens))

    def loop_step(self, mode: int) -> LoopStep:
        """One AD step or one SD round of the engine loop."""
        return self.ad_step if mode == AD else self.sd_round

    def step_cost(self, mode: int) -> StepCost:
        """A step as the scheduler budgets its rate: back to back (a mode's steps in a period
        follow one another); the first step of a period is budgeted apart (`LoopStep.wake_s`,
        `problem.make_instance`)."""
        return self.loop_step(mode).busy

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

    def workspace_bytes(self, mode: int) -> float:
        """The logits one user's rows take in a step of its mode: one position in an AD step;
        in an SD round the verification's draft_len + 1 positions, and the last draft
        forward's one, still held while the target verifies."""
        rows = 1 if mode == AD else self.draft_len + 2
        return float(rows * self.logits_row_bytes)

    def user_bytes(self, mode: int, tokens: int | float) -> float:
        """What serving one user holds: its KV cache and its share of the step's logits."""
        return self.kv_bytes(mode, tokens) + self.workspace_bytes(mode)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")


def load_cost_model(path: Path) -> CostModel:
    """Read a profile JSON; errors name the file, the key and what was expected."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such cost-model file (run `testbed profile`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(f"{path}: not valid JSON ({exc})") from None
    try:
        return CostModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise BadInputError(
            f"{path}: key {key!r}: {first['msg']} (a profile of this version: `testbed profile`)"
        ) from None
