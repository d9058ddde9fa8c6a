"""Problems for each device, from the playbook's workload section."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from agents.workloads.arithmetic import Problem, heldout_problems, prompt, train_problems
from agents.workloads.arrival import poisson_offsets
from agents.workloads.gsm8k import default_path, format_prompt, load_gsm8k, train_path
from testbed.config.playbook import WorkloadSection


def problems_for(
    workload: WorkloadSection, devices: list[str], tokenizer: str | None = None
) -> dict[str, list[Problem]]:
    """Distinct problems per device: device i gets the i-th slice of the problem list.

    With `workload.max_prompt_tokens`, GSM8K problems whose formatted prompt is longer (in
    tokens of `tokenizer`, a tokenizer.json or a folder holding one) are passed over, in file
    order, so a small-context model gets the first problems that fit it (no tokenizer, as in
    a dry run: no filtering)."""
    n = workload.problems_per_device
    total = n * len(devices)
    if workload.kind == "arithmetic":
        pool = formatted(heldout_problems(total, seed=workload.seed), workload)
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
    return {dev: pool[i * n : (i + 1) * n] for i, dev in enumerate(devices)}


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


def write_problem_file(
    problems: list[Problem], path: Path, arrivals: list[float] | None = None
) -> None:
    """The device agent's input: one JSON line per problem (id, prompt, reference, and its
    arrival offset `arrive_s` for an open-loop workload)."""
    lines = []
    for i, p in enumerate(problems):
        item: dict[str, object] = {"id": p.id, "prompt": prompt(p), "reference": p.result}
        if arrivals is not None:
            item["arrive_s"] = arrivals[i]
        lines.append(json.dumps(item))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
