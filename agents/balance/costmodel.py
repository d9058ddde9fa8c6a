"""The server's cost model: what one step of the engine loop costs and what it yields.

Measured on the server host by `agents.balance.measure`, stored as JSON, and read back by
the scheduler (per-user demands), the server's loop and the controller's simulator (step
times, tokens per round). Step times are those of the loop's own steps (an AD step, an SD
round, as `agents.balance.engine` runs them), back to back and after an idle wait, linear in
the batch size b: t(b) = fixed_s + per_seq_s * b, fitted by least squares. An SD round's
tokens follow the distribution measured on the workload.

Plain dataclasses (the agents carry no schema library); `parse_cost_model` checks a JSON
document field by field and names the key that is wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from agents.balance.modes import AD, SD


class CostModelError(ValueError):
    """A cost-model document that is not one; the message names the key."""


@dataclass(frozen=True)
class StepCost:
    """Time of one batched forward: t(b) = fixed_s + per_seq_s * b (seconds)."""

    fixed_s: float
    per_seq_s: float

    def time(self, batch: float) -> float:
        return self.fixed_s + self.per_seq_s * batch


@dataclass(frozen=True)
class LoopStep:
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


@dataclass(frozen=True)
class ModelCost:
    """One model: weights, KV bytes per token and prefill cost."""

    weights_bytes: int
    kv_bytes_per_token: int
    prefill_per_token_s: float


@dataclass(frozen=True)
class CostModel:
    """The large (target) and small (draft) model on one server, the loop's step costs and
    what an SD round yields."""

    target: ModelCost
    draft: ModelCost
    ad_step: LoopStep  # one batched target decode, as the loop runs it
    sd_round: LoopStep  # g batched draft forwards, a verification, acceptance and rollback
    draft_len: int
    acceptance: float  # per-position acceptance probability a (MLE)
    round_tokens: list[float]  # probability that an SD round yields 1, 2, ..., g+1 tokens
    logits_row_bytes: int  # one position's logits (float32 x vocabulary)
    host: str = ""
    points: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # fitted from

    def __post_init__(self) -> None:
        p = self.round_tokens
        if len(p) != self.draft_len + 1 or min(p) < 0 or abs(sum(p) - 1) > 1e-6:
            raise CostModelError(
                f"round_tokens: expected {self.draft_len + 1} probabilities (1..draft_len+1 "
                f"tokens per round) summing to 1, got {p}"
            )

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")


# --- reading a document, naming the key that is wrong ---------------------------------------


def _number(value: Any, key: str, minimum: float, integer: bool = False, below: float = math.inf):
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok or value < minimum or value >= below:
        kind = "a whole number" if integer else "a number"
        bounds = f" >= {minimum:g}" + (f" and < {below:g}" if below < math.inf else "")
        raise CostModelError(f"key {key!r}: expected {kind}{bounds}, got {value!r}")
    return int(value) if integer else float(value)


def _mapping(data: Any, key: str, cls: type) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise CostModelError(f"key {key!r}: expected a mapping of {cls.__name__} fields")
    names = {f.name for f in fields(cls)}
    for name in data:
        if name not in names:
            raise CostModelError(f"key '{key}.{name}': not a field of {cls.__name__}")
    return data


def _required(data: dict[str, Any], key: str, name: str) -> Any:
    if name not in data:
        raise CostModelError(f"key '{key}.{name}': field required" if key else
                             f"key {name!r}: field required")  # fmt: skip
    return data[name]


def _step(data: Any, key: str) -> StepCost:
    d = _mapping(data, key, StepCost)
    return StepCost(
        *(_number(_required(d, key, n), f"{key}.{n}", 0) for n in ("fixed_s", "per_seq_s"))
    )


def _loop(data: Any, key: str) -> LoopStep:
    d = _mapping(data, key, LoopStep)
    return LoopStep(*(_step(_required(d, key, n), f"{key}.{n}") for n in ("busy", "after_idle")))


def _model(data: Any, key: str) -> ModelCost:
    d = _mapping(data, key, ModelCost)
    return ModelCost(
        weights_bytes=_number(_required(d, key, "weights_bytes"), f"{key}.weights_bytes", 0, True),
        kv_bytes_per_token=_number(
            _required(d, key, "kv_bytes_per_token"), f"{key}.kv_bytes_per_token", 1, True
        ),
        prefill_per_token_s=_number(
            _required(d, key, "prefill_per_token_s"), f"{key}.prefill_per_token_s", 0
        ),
    )


def parse_cost_model(data: Any) -> CostModel:
    """The cost model a JSON document describes; CostModelError naming the key otherwise."""
    d = _mapping(data, "", CostModel) if isinstance(data, dict) else None
    if d is None:
        raise CostModelError("expected a JSON object of cost-model fields")
    target = _model(_required(d, "", "target"), "target")  # in field order: the first wrong
    draft = _model(_required(d, "", "draft"), "draft")  # key is the one named
    ad_step = _loop(_required(d, "", "ad_step"), "ad_step")
    sd_round = _loop(_required(d, "", "sd_round"), "sd_round")
    rounds = _required(d, "", "round_tokens")
    if not isinstance(rounds, list):
        raise CostModelError("key 'round_tokens': expected a list of probabilities")
    try:
        points = {
            str(k): [(int(b), float(t)) for b, t in v] for k, v in d.get("points", {}).items()
        }
    except (AttributeError, TypeError, ValueError):
        raise CostModelError(
            "key 'points': expected a mapping of step kind to (batch, seconds) pairs"
        ) from None
    host = d.get("host", "")
    if not isinstance(host, str):
        raise CostModelError("key 'host': expected a string")
    return CostModel(
        target=target,
        draft=draft,
        ad_step=ad_step,
        sd_round=sd_round,
        draft_len=_number(_required(d, "", "draft_len"), "draft_len", 1, True),
        acceptance=_number(_required(d, "", "acceptance"), "acceptance", 0, below=1),
        round_tokens=[_number(p, f"round_tokens.{i}", -math.inf) for i, p in enumerate(rounds)],
        logits_row_bytes=_number(_required(d, "", "logits_row_bytes"), "logits_row_bytes", 1, True),
        host=host,
        points=points,
    )


def load_cost_model(path: Path) -> CostModel:
    """Read a cost-model JSON file; CostModelError naming the file and the key otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CostModelError(f"{path}: no such cost-model file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CostModelError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_cost_model(data)
    except CostModelError as exc:
        raise CostModelError(f"{path}: {exc}") from None
