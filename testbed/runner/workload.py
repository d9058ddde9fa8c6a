"""Problems for each device, from the playbook's workload section.

With `workload.stands_for` every request stands for one question of that workload's data set
(drawn without replacement from `workload.seed`): it takes that question's stood-for prompt
and answer lengths (`testbed.topo.workloads`), its prompt is built as token ids of exactly
that length (`fit_prompt`) and its answer is held to that length (`agents.workloads.request`).
What the models read is still `workload.kind`'s problem (the tiny pair's own arithmetic, which
it can answer and be scored on, or the GSM8K question itself), after solved problems of the
same kind when the prompt is longer than the question, as in a few-shot prompt and in the
packed rows the tiny pair was trained on; a prompt shorter than its question keeps the
question's end (cut from the left, as serving stacks truncate).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from agents.workloads.arithmetic import (
    Problem,
    full_text,
    heldout_problems,
    prompt,
    train_problems,
)
from agents.workloads.arrival import poisson_offsets
from agents.workloads.gsm8k import (
    DatasetError,
    default_path,
    format_prompt,
    lm_eval_question,
    load_gsm8k,
    train_path,
)
from testbed.config.playbook import Playbook, WorkloadSection
from testbed.core.errors import BadInputError
from testbed.topo.workloads import Lengths, load_workloads

FILLER_PROBLEMS = 400  # solved problems that prompts longer than their question draw on


def problems_for(
    workload: WorkloadSection, devices: list[str], tokenizer: str | None = None,
    target_as: str | None = None,
) -> dict[str, list[Problem]]:  # fmt: skip
    """Distinct problems per device: device i gets the i-th slice of the problem list.

    With `workload.max_prompt_tokens`, GSM8K problems whose formatted prompt is longer (in
    tokens of `tokenizer`, a tokenizer.json or a folder holding one) are passed over, in file
    order, so a small-context model gets the first problems that fit it (no tokenizer, as in
    a dry run: no filtering). With `workload.stands_for`, each problem is shaped as a request
    of that workload with the model `target_as` (model@format) stands for (`shaped`; without
    a tokenizer, as in a dry run, the lengths are set but no prompt ids built)."""
    n = workload.problems_per_device
    total = n * len(devices)
    if workload.kind == "arithmetic":
        pool = formatted(heldout_problems(total, seed=workload.seed), workload)
    elif workload.stands_for:
        pool = formatted(load_gsm8k(workload.gsm8k_path), workload)
        pool = random.Random(workload.seed).sample(pool, min(total, len(pool)))
    else:
        limit = None if workload.max_prompt_tokens else total
        pool = formatted(load_gsm8k(workload.gsm8k_path, limit=limit), workload)
        if workload.max_prompt_tokens and tokenizer is not None:
            fits = prompt_fits(workload.max_prompt_tokens, tokenizer)
            pool = [p for p in pool if fits(prompt(p))][:total]
    if len(pool) < total:
        raise ValueError(
            f"workload.gsm8k_path {workload.gsm8k_path}: has {len(pool)} problems that fit, "
            f"the playbook needs {total} ({n} per device x {len(devices)} devices)"
        )
    if workload.stands_for:
        pool = shaped(pool, workload, target_as or "", tokenizer)
    return {dev: pool[i * n : (i + 1) * n] for i, dev in enumerate(devices)}


def stood_for_model(target_as: str) -> str:
    """The catalogue model of a `model@format` reference."""
    return target_as.split("@", 1)[0]


def stood_for_lengths(
    workload: WorkloadSection, target_as: str, count: int
) -> tuple[list[str], list[Lengths], list[Lengths]]:
    """The stood-for requests of a run: the ids of `count` questions of the workload's data set
    drawn from `workload.seed`, their lengths, and the lengths of every question of the data
    set (what the drawn ones are a sample of). BadInputError naming `workload.stands_for`."""
    name = str(workload.stands_for)
    where = f"workload.stands_for {name}"
    catalogue = load_workloads()
    catalogue.entry(name, where)
    path = Path(workload.gsm8k_path) if workload.gsm8k_path else default_path()
    try:
        data = load_gsm8k(path)
    except DatasetError as exc:
        raise BadInputError(f"{where}: needs the GSM8K test split ({exc})") from None
    if count > len(data):
        raise BadInputError(f"{where}: {count} requests, but {path} has {len(data)} questions")
    pairs = [(p.question, p.answer) for p in data]
    every = catalogue.lengths(name, stood_for_model(target_as), pairs, pairs, where,
                              workload.answer_scale)  # fmt: skip
    drawn = random.Random(workload.seed).sample(range(len(data)), count)
    return [data[i].id for i in drawn], [every[i] for i in drawn], every


def shaped(
    pool: list[Problem], workload: WorkloadSection, target_as: str, tokenizer: str | None
) -> list[Problem]:
    """The problems as requests of `workload.stands_for`: each with the lengths of one drawn
    question, its answer held to min(that length, max_new_tokens), its prompt ids built to the
    stood-for prompt length with `tokenizer` (none in a dry run)."""
    if workload.kind == "gsm8k":  # the GSM8K questions are themselves the stood-for ones
        ids, lengths = [p.id for p in pool], lengths_of(workload, target_as, pool)
    else:
        ids, lengths, _ = stood_for_lengths(workload, target_as, len(pool))
    fitter = PromptFitter.load(tokenizer, filler_texts(workload)) if tokenizer else None
    out = []
    for i, (p, sid, length) in enumerate(zip(pool, ids, lengths)):
        answer = min(length.answer, workload.max_new_tokens)
        if fitter and fitter.context and length.prompt + answer > fitter.context:
            raise BadInputError(
                f"workload.stands_for {workload.stands_for}: request {sid} needs "
                f"{length.prompt} prompt + {answer} answer tokens, more than the target's "
                f"context of {fitter.context} (lower workload.max_new_tokens or use a model "
                "with a longer context)"
            )
        fitted = fitter.fit(prompt(p), length.prompt, seed=workload.seed + i) if fitter else None
        out.append(dataclasses.replace(
            p, id=f"{p.id}-{workload.stands_for}", prompt_ids=fitted, max_new=answer,
            stands_for=sid, prompt_tokens=length.prompt,
        ))  # fmt: skip
    return out


def lengths_of(workload: WorkloadSection, target_as: str, pool: list[Problem]) -> list[Lengths]:
    """The stood-for lengths of GSM8K problems themselves (their question and solution)."""
    name = str(workload.stands_for)
    path = Path(workload.gsm8k_path) if workload.gsm8k_path else default_path()
    everything = [(p.question, p.answer) for p in load_gsm8k(path)]
    return load_workloads().lengths(
        name, stood_for_model(target_as), [(p.question, p.answer) for p in pool], everything,
        f"workload.stands_for {name}", workload.answer_scale,
    )  # fmt: skip


def filler_texts(workload: WorkloadSection) -> list[str]:
    """Solved problems of the workload's kind, in its prompt format: what a prompt longer than
    its question is filled with (training problems, never a held-out one)."""
    if workload.kind == "arithmetic":
        return [full_text(p) for p in train_problems(FILLER_PROBLEMS, seed=workload.seed + 1)]
    test = Path(workload.gsm8k_path) if workload.gsm8k_path else default_path()
    solved = load_gsm8k(train_path(test), limit=FILLER_PROBLEMS)
    return [f"{lm_eval_question(p.question)} {p.answer}" for p in solved]


@dataclasses.dataclass
class PromptFitter:
    """Builds prompts of an exact length in token ids of one tokenizer."""

    encode: Callable[[str], list[int]]
    filler: list[int]  # solved problems end to end, each `[BOS] text [EOS]`
    ends: list[int]  # where in filler each solved problem ends
    context: int | None  # the model's context (max_position_embeddings), where known

    @classmethod
    def load(cls, tokenizer: str, texts: Sequence[str]) -> PromptFitter:
        """From a tokenizer.json (or a model folder holding it and its config.json)."""
        from tokenizers import Tokenizer

        path = Path(tokenizer)
        tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
        config = path / "config.json" if path.is_dir() else path.with_name("config.json")
        cfg = json.loads(config.read_text()) if config.is_file() else {}
        eos = cfg.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) else eos
        encode = lambda text: tok.encode(text).ids  # noqa: E731 - BOS first, as engines do
        filler: list[int] = []
        ends: list[int] = []
        for text in texts:
            filler += [*encode(text), *([eos] if eos is not None else [])]
            ends.append(len(filler))
        return cls(encode, filler, ends, cfg.get("max_position_embeddings"))

    def fit(self, text: str, length: int, seed: int) -> tuple[int, ...]:
        """Exactly `length` ids ending with text's: whole solved problems before it (the first
        of them cut from the left, as a packed training row begins; which ones drawn from
        seed), or its last `length` ids when it is longer."""
        ids = self.encode(text)
        need = length - len(ids)
        if need <= 0:
            return tuple(ids[-length:])
        ends = [e for e in self.ends if e >= need]
        if not ends:
            raise BadInputError(
                f"workload.stands_for: a prompt of {length} tokens is longer than the "
                f"{len(self.filler)} tokens of solved problems there are to fill it with"
            )
        end = random.Random(seed).choice(ends)
        return tuple(self.filler[end - need : end] + ids)


def prompt_fits(max_tokens: int, tokenizer: str) -> Callable[[str], bool]:
    """A test: does a prompt take at most max_tokens tokens of this tokenizer?"""
    from tokenizers import Tokenizer

    path = Path(tokenizer)
    tok = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    return lambda text: len(tok.encode(text).ids) <= max_tokens


def fewshot_examples(workload: WorkloadSection) -> list[Problem]:
    """The first `fewshot` solved problems of the train split (lm-eval's first_n sampler):
    `fewshot_path`, else GSM8K's train.jsonl beside the test file, else arithmetic train
    problems."""
    if workload.fewshot == 0:
        return []
    if workload.fewshot_path:
        return load_gsm8k(workload.fewshot_path, limit=workload.fewshot)
    if workload.kind == "gsm8k":
        test = Path(workload.gsm8k_path) if workload.gsm8k_path else default_path()
        return load_gsm8k(train_path(test), limit=workload.fewshot)
    return train_problems(workload.fewshot)


def formatted(pool: list[Problem], workload: WorkloadSection) -> list[Problem]:
    """Problems with their prompt in the workload's format; a non-plain format is part of the
    problem id, so reference answers of different prompts never mix."""
    if workload.prompt_format == "plain" and workload.fewshot == 0:
        return pool
    examples = fewshot_examples(workload)
    tag = f"{workload.prompt_format}{workload.fewshot}"
    return [
        dataclasses.replace(
            p, id=f"{p.id}-{tag}", prompt_text=format_prompt(p, workload.prompt_format, examples)
        )
        for p in pool
    ]


def arrivals_for(workload: WorkloadSection, devices: list[str]) -> dict[str, list[float] | None]:
    """Per device: arrival offsets of its problems (Poisson; device i draws from seed + i), or
    None for a closed loop."""
    a = workload.arrival
    if a.process == "closed" or a.rate_per_s is None:
        return {dev: None for dev in devices}
    n = workload.problems_per_device
    return {dev: poisson_offsets(n, a.rate_per_s, a.seed + i) for i, dev in enumerate(devices)}


def request_item(p: Problem) -> dict[str, object]:
    """A problem as the agents read a request (`agents.workloads.request`): id and prompt, and
    for a request held to a stood-for length its prompt ids, answer length and `hold`."""
    item: dict[str, object] = {"id": p.id, "prompt": prompt(p)}
    if p.prompt_ids is not None:
        item["prompt_ids"] = list(p.prompt_ids)
    if p.max_new is not None:
        item.update(max_new=p.max_new, hold=True)
    if p.stands_for is not None:
        item["stands_for"] = p.stands_for
    return item


def write_problem_file(
    problems: list[Problem], path: Path, arrivals: list[float] | None = None
) -> None:
    """The device agent's input: one JSON line per problem (`request_item`, its reference,
    and its arrival offset `arrive_s` for an open-loop workload)."""
    lines = []
    for i, p in enumerate(problems):
        item: dict[str, object] = {**request_item(p), "reference": p.result}
        if arrivals is not None:
            item["arrive_s"] = arrivals[i]
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def check_workload(pb: Playbook, where: str) -> None:
    """Refuse, before the lab comes up, a workload that cannot be shaped: an unknown
    `workload.stands_for`, a stood-for target without a published answer length, a missing
    data set, requests longer than the target's context, an unknown `models.draft_grade`."""
    from testbed.models.configs import DRAFT_GRADES, TARGET
    from testbed.models.tiny import DEFAULT_DRAFT

    grades = {DEFAULT_DRAFT, "auto", *(g.name for g in DRAFT_GRADES)}
    if pb.models.draft == "tiny" and pb.models.draft_grade not in grades:
        raise BadInputError(
            f"{where}: models.draft_grade: unknown grade {pb.models.draft_grade!r} (expected "
            f"one of {', '.join(sorted(grades))})"
        )
    w = pb.workload
    if not w.stands_for:
        return
    _, _, every = stood_for_lengths(w, pb.models.target_as, 0)
    tiny = pb.models.target == "tiny"
    context = TARGET.max_positions if tiny else model_context(pb.models.target)
    longest = max(x.prompt + min(x.answer, w.max_new_tokens) for x in every)
    if context is not None and longest > context:
        raise BadInputError(
            f"{where}: workload.stands_for {w.stands_for}: its longest request takes {longest} "
            f"tokens (prompt and answer, answers capped at workload.max_new_tokens "
            f"{w.max_new_tokens}), more than the target model's context of {context}"
        )


def model_context(model: str) -> int | None:
    """max_position_embeddings of an HF model folder's config.json (None where not known)."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) else None
