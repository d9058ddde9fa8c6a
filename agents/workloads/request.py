"""One request of a problem file, read the same way by every agent that answers one.

A problem file has one JSON object a line with `id` and `prompt` (text). A workload that stands
for another (`workload.stands_for`: GSM8K to a Llama-3 chat model, say) adds, per request:

- `prompt_ids`: the prompt as token ids, exactly as long as the stood-for prompt (the controller
  built them with the models' tokenizer, so no agent re-tokenizes a cut text);
- `max_new` with `hold: true`: the answer is held to exactly `max_new` tokens, generation going
  on past EOS, the way serving benchmarks hold output lengths (vLLM's `ignore_eos`). Tokens
  after the first EOS are real tokens of the models, verified like the rest; the answer a
  reader sees, and scores, ends at that EOS (`answer_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

NO_STOP = -1
"""The stop token of a held answer: no token id is negative, so none ends it."""


class Tokenizing(Protocol):
    eos_id: int

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]: ...

    def detokenize(self, ids: Sequence[int]) -> str: ...


def prompt_ids(engine: Tokenizing, item: dict[str, Any]) -> list[int]:
    """The request's prompt as token ids: `prompt_ids` where given, else its text tokenized."""
    ids = item.get("prompt_ids")
    if ids is not None:
        return [int(t) for t in ids]
    return engine.tokenize(str(item["prompt"]))


def answer_limit(item: dict[str, Any], default: int) -> int:
    """How many tokens the request's answer may take (held answers: exactly this many)."""
    return int(item.get("max_new") or default)


def is_held(item: dict[str, Any]) -> bool:
    """Whether the answer is held to its length (EOS does not end it)."""
    return bool(item.get("hold"))


def stop_token(engine: Tokenizing, item: dict[str, Any]) -> int:
    """The token that ends the request's answer: the engine's EOS, or NO_STOP when held."""
    return NO_STOP if is_held(item) else engine.eos_id


def answer_text(engine: Tokenizing, ids: Sequence[int]) -> str:
    """The answer a reader sees: the tokens up to the first EOS (kept out), detokenized."""
    ids = list(ids)
    if engine.eos_id in ids:
        ids = ids[: ids.index(engine.eos_id)]
    return engine.detokenize(ids)


def check_item(item: dict[str, Any], where: str) -> None:
    """ValueError naming where and the field when a request's optional fields are malformed."""
    ids = item.get("prompt_ids")
    if ids is not None and (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids)
    ):
        raise ValueError(f"{where}.prompt_ids: expected a non-empty list of token ids (ints >= 0)")
    max_new = item.get("max_new")
    if max_new is not None and (
        not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 1
    ):
        raise ValueError(f"{where}.max_new: expected a whole number >= 1, got {max_new!r}")
    if not isinstance(item.get("hold", False), bool):
        raise ValueError(f"{where}.hold: expected true or false, got {item['hold']!r}")
