"""The target model's own greedy answers, computed on the host that runs it: what every output
of a run is compared with (`=target`, `outputs_equal_target`).

    python -m agents.reference --model TARGET --problems problems.json --max-new 64 \\
        --out answers.json [--engine auto] [--device cpu] [--threads 1]

The runner starts it on the server host, with the model file and the engine the server loads
there (on a lab of real hardware, the file the site playbook placed), so the reference is the
model the hosts run and not the controller's.

`--problems` is a JSON list of objects, each with `id` (a non-empty string, unique) and
`prompt` (the prompt text every model sees), and optionally the request fields of
`agents.workloads.request` (`prompt_ids`, `max_new`, `hold`). Each prompt is tokenized by the
model's own tokenizer (or taken as its `prompt_ids`) and decoded greedily (autoregressive, one
token per forward: `agents.spec.decoding.generate_ad`) up to its `max_new` (default
`--max-new`) new tokens or EOS (exactly that many, past EOS, when held). `--out` gets one JSON
object: where and with what the answers were computed (`host`, `model`, `engine`, `device`,
`threads`, `tokenizer_hash`, `max_new`, `seconds`) and `answers`, one per problem in input
order: `id`, `text` (the answer up to its first EOS, detokenized), `tokens` (its ids) and
`prompt_tokens` (the prompt's ids, BOS first). A malformed problems file stops the agent
(exit 2) with the file and the field at fault, before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any

from agents.engines.factory import load_engine
from agents.spec.decoding import generate_ad
from agents.workloads.request import (
    answer_limit,
    answer_text,
    check_item,
    prompt_ids,
    stop_token,
)


class ProblemsError(ValueError):
    """A problems file the agent cannot read: its message names the file and the field."""


def load_problems(path: Path) -> list[dict[str, Any]]:
    """The problems of a `--problems` file, as `{"id", "prompt"}` and the optional request
    fields; ProblemsError naming the file and the field (`problems[3].prompt`) where the file
    is not what the agent reads."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemsError(f"{path}: cannot read the problems file ({exc})") from exc
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise ProblemsError(f"{path}: not JSON ({exc})") from exc
    if not isinstance(items, list):
        raise ProblemsError(f"{path}: expected a JSON list of problems, got {type(items).__name__}")
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{path}: problems[{i}]"
        if not isinstance(item, dict):
            raise ProblemsError(f"{where}: expected an object, got {type(item).__name__}")
        for key in ("id", "prompt"):
            if key not in item:
                raise ProblemsError(f"{where}: lacks the field {key!r}")
            if not isinstance(item[key], str):
                raise ProblemsError(
                    f"{where}.{key}: expected a string, got {type(item[key]).__name__} "
                    f"{item[key]!r}"
                )
        if not item["id"]:
            raise ProblemsError(f"{where}.id: empty")
        if item["id"] in seen:
            raise ProblemsError(f"{where}.id: {item['id']!r} appears twice")
        seen.add(item["id"])
        try:
            check_item(item, where)
        except ValueError as exc:
            raise ProblemsError(str(exc)) from None
        fields = ("id", "prompt", "prompt_ids", "max_new", "hold")
        problems.append({k: item[k] for k in fields if k in item})
    return problems


def answer_all(engine: Any, problems: list[dict[str, Any]], max_new: int) -> list[dict[str, Any]]:
    """Each problem's greedy answer by `engine`: id, text, tokens, prompt_tokens."""
    out = []
    for p in problems:
        ids = prompt_ids(engine, p)
        gen = generate_ad(engine, ids, answer_limit(p, max_new), stop_id=stop_token(engine, p))
        tokens = [int(t) for t in gen.tokens]
        out.append({"id": p["id"], "text": answer_text(engine, tokens), "tokens": tokens,
                    "prompt_tokens": [int(t) for t in ids]})  # fmt: skip
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="The target model's own greedy answers to a list of prompts."
    )
    ap.add_argument("--model", required=True, help="target model: HF folder or .gguf")
    ap.add_argument("--engine", default="auto", choices=["auto", "torch", "llama"])
    ap.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--problems", type=Path, required=True,
                    help="JSON list of {id, prompt}")  # fmt: skip
    ap.add_argument("--max-new", type=int, required=True, help="most new tokens per answer")
    ap.add_argument("--out", type=Path, required=True, help="the answers (JSON), written here")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.max_new < 1:
        ap.error(f"--max-new: expected at least 1, got {args.max_new}")
    if args.threads < 1:
        ap.error(f"--threads: expected at least 1, got {args.threads}")
    try:
        problems = load_problems(args.problems)
    except ProblemsError as exc:
        ap.error(str(exc))
    t0 = time.monotonic()
    engine = load_engine(args.model, kind=args.engine, device=args.device, threads=args.threads)
    answers = answer_all(engine, problems, args.max_new)
    doc = {
        "host": socket.gethostname(), "model": str(args.model), "engine": engine.describe(),
        "device": args.device, "threads": args.threads,
        "tokenizer_hash": engine.tokenizer_hash, "max_new": args.max_new,
        "seconds": round(time.monotonic() - t0, 3), "answers": answers,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial")
    partial.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    partial.replace(args.out)
    print(f"reference: {len(answers)} answers by {engine.describe()} on {doc['host']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
