"""The workloads a lab's requests stand for (`topologies/workloads.yaml`), with their sources.

    sources:    {key: "Author et al., title, year, where in it", ...}
    tokenizers: {llama-3: {tokens_per_word, source}, ...}
    workloads:  {gsm8k-cot-0shot: {description, dataset, tokenizer,
                                   prompt: {template_tokens, source},
                                   answer: {targets: [<model>, ...],
                                            mean_tokens: {<model>: N, ...}, source}}, ...}
    acceptance: [{draft, target, workload, alpha | (tau, draft_len), source}, ...]

A workload entry says how long the prompts and answers of that workload are with the models a
playbook stands for (`models.draft_as`, `models.target_as`), in tokens of their tokenizer:

- a prompt is its data set question, counted in words and turned into tokens at the
  tokenizer's `tokens_per_word`, plus the chat template around it (`template_tokens`);
- an answer is as long as that question's reference solution (its words, the data set's
  calculator annotations and final `#### N` line left out, at `tokens_per_word`); where the
  catalogue has a published mean answer length of the stood-for target
  (`answer.mean_tokens`), scaled so that the answers' mean over the whole data set is it: the
  lengths keep the data set's spread and its per-question order (longer solutions, longer
  answers), the mean is the model's. `answer.targets` names the stood-for targets the shape
  applies to.

`acceptance` lists published speculative-decoding acceptances of draft/target pairs on a
workload: a per-token acceptance `alpha`, or a mean accepted length `tau` (tokens a
verification yields, the bonus token included) at draft length `draft_len`, turned into the
per-token alpha by the i.i.d. model `tau = (1 - alpha^(k+1)) / (1 - alpha)`
(`agents.spec.rates.alpha_from_tau`). Model names are the hardware catalogue's. Errors name
the file, the key and what was expected.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agents.spec.rates import alpha_from_tau
from testbed.core.errors import BadInputError
from testbed.core.loading import read_yaml, validate
from testbed.core.paths import REPO_ROOT
from testbed.topo.catalogue import load_catalogue

DEFAULT_PATH = REPO_ROOT / "topologies" / "workloads.yaml"
_CALCULATOR = re.compile(r"<<[^>]*>>")
_WORD = re.compile(r"\S+")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizerEntry(_Strict):
    """How many tokens an English word takes in a stood-for tokenizer, and why."""

    tokens_per_word: float = Field(gt=0, le=10, allow_inf_nan=False)
    source: str


class PromptShape(_Strict):
    template_tokens: int = Field(ge=0, le=100_000)
    source: str


class AnswerShape(_Strict):
    targets: list[str] = Field(min_length=1)
    mean_tokens: dict[str, float] = Field(default_factory=dict)
    source: str

    @model_validator(mode="after")
    def _positive(self) -> AnswerShape:
        for model, mean in self.mean_tokens.items():
            if not 1 <= mean <= 100_000:
                raise ValueError(f"mean_tokens.{model}: expected 1..100000 tokens, got {mean}")
            if model not in self.targets:
                raise ValueError(f"mean_tokens.{model}: not one of this answer's targets")
        return self


class WorkloadEntry(_Strict):
    description: str
    dataset: Literal["gsm8k"]
    tokenizer: str
    prompt: PromptShape
    answer: AnswerShape


class AcceptanceEntry(_Strict):
    """A published acceptance of a draft/target pair on a workload."""

    draft: str
    target: str
    workload: str
    alpha: float | None = Field(None, gt=0, lt=1)
    tau: float | None = Field(None, ge=1)
    draft_len: int | None = Field(None, ge=1, le=64)
    source: str
    note: str = ""

    @model_validator(mode="after")
    def _one_figure(self) -> AcceptanceEntry:
        if (self.alpha is None) == (self.tau is None):
            raise ValueError("give exactly one of alpha and tau")
        if self.tau is not None and self.draft_len is None:
            raise ValueError("tau needs the draft_len it was measured at")
        if self.tau is not None and self.tau >= self.draft_len + 1:
            raise ValueError(f"tau {self.tau} must be below draft_len + 1 ({self.draft_len + 1})")
        return self

    @property
    def per_token(self) -> float:
        """The per-token acceptance alpha (from tau at draft_len where that is what was
        published)."""
        if self.alpha is not None:
            return self.alpha
        assert self.tau is not None and self.draft_len is not None
        return alpha_from_tau(self.tau, self.draft_len)


class WorkloadFile(_Strict):
    sources: dict[str, str] = Field(default_factory=dict)
    tokenizers: dict[str, TokenizerEntry]
    workloads: dict[str, WorkloadEntry]
    acceptance: list[AcceptanceEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> WorkloadFile:
        for name, w in self.workloads.items():
            if w.tokenizer not in self.tokenizers:
                raise ValueError(
                    f"workloads.{name}.tokenizer: unknown tokenizer {w.tokenizer!r} (expected "
                    f"one of {', '.join(sorted(self.tokenizers))})"
                )
        for i, a in enumerate(self.acceptance):
            if a.workload not in self.workloads:
                raise ValueError(f"acceptance[{i}].workload: unknown workload {a.workload!r}")
        return self


@dataclass(frozen=True)
class Lengths:
    """One request's stood-for lengths, in tokens of the stood-for tokenizer."""

    prompt: int
    answer: int


def words(text: str) -> int:
    """Whitespace-separated words of text."""
    return len(_WORD.findall(text))


def solution_words(solution: str) -> int:
    """Words of a GSM8K reference solution without its calculator annotations (`<<4*2=8>>`)
    and its final `#### N` line (what a chat model's worked answer has of it)."""
    body = solution.rsplit("####", 1)[0]
    return words(_CALCULATOR.sub("", body))


@dataclass(frozen=True)
class WorkloadCatalogue:
    path: Path
    spec: WorkloadFile

    def entry(self, name: str, where: str) -> WorkloadEntry:
        """The workload called name; BadInputError naming `where` when there is none."""
        if name not in self.spec.workloads:
            known = ", ".join(sorted(self.spec.workloads))
            raise BadInputError(f"{where}: unknown workload {name!r} (known: {known}; {self.path})")
        return self.spec.workloads[name]

    def tokens_per_word(self, name: str) -> float:
        return self.spec.tokenizers[self.spec.workloads[name].tokenizer].tokens_per_word

    def mean_answer(self, name: str, target: str, where: str) -> float | None:
        """The published mean answer length of the stood-for target on workload name (None
        where none is published: the reference solutions' own lengths stand)."""
        answer = self.entry(name, where).answer
        if target not in answer.targets:
            raise BadInputError(
                f"{where}: workload {name!r} has no answer length for target {target!r} (it "
                f"has: {', '.join(sorted(answer.targets))}; {self.path})"
            )
        return answer.mean_tokens.get(target)

    def lengths(
        self, name: str, target: str, questions: Sequence[tuple[str, str]],
        everything: Sequence[tuple[str, str]], where: str, answer_scale: float = 1.0,
    ) -> list[Lengths]:  # fmt: skip
        """The stood-for lengths of each (question, solution) of `questions`, the answers
        scaled by the mean over `everything` (the whole data set), then by `answer_scale`
        (a playbook's `workload.answer_scale`)."""
        entry = self.entry(name, where)
        per_word = self.tokens_per_word(name)
        counted = [solution_words(s) * per_word for _, s in everything]
        if not counted or sum(counted) <= 0:
            raise BadInputError(f"{where}: the data set of workload {name!r} has no solutions")
        mean = self.mean_answer(name, target, where)
        scale = answer_scale * (1.0 if mean is None else mean / (sum(counted) / len(counted)))
        return [
            Lengths(
                entry.prompt.template_tokens + max(1, round(words(q) * per_word)),
                max(1, round(solution_words(s) * per_word * scale)),
            )
            for q, s in questions
        ]

    def acceptance(self, draft: str, target: str, workload: str) -> AcceptanceEntry | None:
        """The published acceptance of the pair on the workload, if the catalogue has one."""
        for a in self.spec.acceptance:
            if (a.draft, a.target, a.workload) == (draft, target, workload):
                return a
        return None


def load_workloads(path: Path = DEFAULT_PATH) -> WorkloadCatalogue:
    """The workload catalogue (cached per file modification time)."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        raise BadInputError(f"{path}: no such workload catalogue") from None
    return _load(path, stamp)


@functools.lru_cache(maxsize=8)
def _load(path: Path, stamp: int) -> WorkloadCatalogue:
    spec = validate(WorkloadFile, read_yaml(path), str(path))
    models = load_catalogue().spec.models
    for i, a in enumerate(spec.acceptance):
        for role in ("draft", "target"):
            if getattr(a, role) not in models:
                raise BadInputError(
                    f"{path}: acceptance[{i}].{role}: unknown model {getattr(a, role)!r} (the "
                    "hardware catalogue's model names, topologies/hardware.yaml)"
                )
    for name, w in spec.workloads.items():
        for model in w.answer.targets:
            if model not in models:
                raise BadInputError(
                    f"{path}: workloads.{name}.answer.targets: unknown model {model!r} (the "
                    "hardware catalogue's model names)"
                )
    return WorkloadCatalogue(path, spec)
