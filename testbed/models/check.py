"""Cross-engine checks of a draft/target pair: one model, two engines, same answers?

For each model given as an HF folder and/or a GGUF file, `check_pair` loads it in the PyTorch
and llama.cpp engines and measures: tokenizer agreement (ids with and without BOS, and the
text round trip) on a fixed set of strings with edge cases, the largest logit difference
between the engines over whole problems, and how many greedy answers are identical. Draft and
target must share a tokenizer: a mismatch is refused before any weights are loaded.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agents.engines.base import Engine, TokenizerMismatchError
from agents.workloads.arithmetic import full_text, heldout_problems, make_problems, prompt
from testbed.core.errors import BadInputError

if TYPE_CHECKING:
    from rich.table import Table

EDGE_STRINGS = (
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    " \n ",
    "0",
    "123",
    "12 + 7 = 19",
    "#### 42",
    "####42",
    "Q: Tom has 5 apples.\nA: ",
    "a  b   c",
    "trailing space ",
    " leading space",
    "tab\there",
    "x=3.14159; y=-2,000!",
    "(1+2)*3/4 - 5% @ $6 & #7",
    "it's don't we're I'll",
    "???!!!...",
    "\r\n windows",
    "caf\u00e9 na\u00efve",
    "\u65e5\u672c\u8a9e",
    "emoji \U0001f600!",
    "MiXeD CaSe WoRdS",
    "<s> not special </s> <pad>",
    "A: 63 + 17 = 80\n#### 80",
)


def sample_strings(n: int = 60, seed: int = 7) -> list[str]:
    """EDGE_STRINGS, then slices of problem texts and random character runs, n in all."""
    rng = random.Random(seed)
    texts = [full_text(p) for p in make_problems(100, seed=99)]
    chars = "abcdefgh XYZ0123456789 .,;:!?-+*/=#()'\"\n\t"
    out = list(EDGE_STRINGS)
    while len(out) < n:
        if rng.random() < 0.5:
            s = rng.choice(texts)
            i = rng.randrange(len(s))
            out.append(s[i : rng.randrange(i, len(s) + 1)])
        else:
            out.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 40))))
    return out[:n]


@dataclass(frozen=True)
class ModelSource:
    """One model as given on the command line: its HF folder and/or GGUF file."""

    given: Path
    hf_dir: Path | None
    gguf: Path | None

    @property
    def name(self) -> str:
        return str(self.given)


def _is_hf(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


def resolve_model(path: Path) -> ModelSource:
    """An HF folder, a .gguf file, or a folder with both; siblings complete the other format.

    `X.gguf` finds an HF folder `X/` beside it, an HF folder `X/` finds `X.gguf` beside it or
    a single .gguf inside it (the tiny pair's layout).
    """
    path = Path(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise BadInputError(f"{path}: expected a .gguf file or a model folder")
        sibling = path.with_suffix("")
        return ModelSource(path, sibling if _is_hf(sibling) else None, path)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        inner = ggufs[0] if len(ggufs) == 1 else None
        beside = path.with_name(path.name + ".gguf")
        gguf = inner or (beside if beside.is_file() else None)
        hf = path if _is_hf(path) else None
        if hf is None and gguf is None:
            raise BadInputError(
                f"{path}: expected an HF model folder (config.json, tokenizer.json), "
                f"a .gguf file, or a folder holding one .gguf"
            )
        return ModelSource(path, hf, gguf)
    raise BadInputError(f"{path}: no such file or folder (expected a model folder or .gguf)")


def resolve_pair(draft: Path, target: Path | None) -> tuple[ModelSource, ModelSource]:
    """The two models; with no target, draft must be a tiny-pair folder holding both."""
    if target is None:
        draft = Path(draft)
        if not ((draft / "draft").is_dir() and (draft / "target").is_dir()):
            raise BadInputError(
                f"{draft}: with one argument, expected a tiny-pair folder holding draft/ and "
                f"target/ (as written by `testbed models build-tiny --out`)"
            )
        return resolve_model(draft / "draft"), resolve_model(draft / "target")
    return resolve_model(draft), resolve_model(target)


def tokenizer_hashes(src: ModelSource) -> dict[str, str]:
    """The tokenizer fingerprint of each format of src ("torch", "llama.cpp")."""
    out: dict[str, str] = {}
    if src.hf_dir is not None:
        from agents.engines.torch_hf import hf_tokenizer_hash

        out["torch"] = hf_tokenizer_hash(src.hf_dir)
    if src.gguf is not None:
        from agents.engines.llama_cpp import read_gguf_vocab

        out["llama.cpp"] = read_gguf_vocab(src.gguf).tokenizer_hash
    return out


@dataclass
class ModelCheck:
    """Cross-engine figures of one model; None where a format is missing."""

    source: ModelSource
    hashes: dict[str, str]
    strings: int = 0
    ids_identical: int | None = None
    round_trip_ok: int | None = None
    max_logit_diff: float | None = None
    prompts: int = 0
    greedy_identical: int | None = None
    mismatches: list[str] = field(default_factory=list)

    @property
    def tokenizer_agreement(self) -> float | None:
        return None if self.ids_identical is None else self.ids_identical / self.strings

    @property
    def greedy_agreement(self) -> float | None:
        return None if self.greedy_identical is None else self.greedy_identical / self.prompts


@dataclass
class PairCheck:
    """Both models' checks and the tokenizer they share."""

    draft: ModelCheck
    target: ModelCheck
    tokenizer_hash: str

    @property
    def all_identical(self) -> bool:
        """Tokenizers and greedy answers agree fully across engines for both models."""
        return all(
            m.tokenizer_agreement == 1.0 and m.greedy_agreement == 1.0
            for m in (self.draft, self.target)
        )


def _greedy(engine: Engine, ids: Sequence[int], max_new: int) -> list[int]:
    sid = engine.open()
    try:
        out: list[int] = []
        logits = engine.score(sid, ids)
        while len(out) < max_new:
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if t == engine.eos_id:
                break
            logits = engine.score(sid, [t])
        return out
    finally:
        engine.close(sid)


def _greedy_llama(engine: Engine, ids: Sequence[int], max_new: int) -> list[int]:
    """Greedy decoding through the llama.cpp engine's drafting fast path."""
    sid = engine.open()
    try:
        return engine.draft_greedy(sid, ids, max_new)  # type: ignore[attr-defined]
    finally:
        engine.close(sid)


def check_model(
    src: ModelSource,
    strings: Sequence[str],
    n_prompts: int = 20,
    max_new: int = 48,
    threads: int = 2,
    say: Callable[[str], None] = lambda _m: None,
) -> ModelCheck:
    """Load src in both engines (where both formats exist) and compare them."""
    result = ModelCheck(src, tokenizer_hashes(src), strings=len(strings), prompts=n_prompts)
    if src.hf_dir is None or src.gguf is None:
        return result
    from agents.engines.llama_cpp import LlamaCppEngine
    from agents.engines.torch_hf import TorchEngine

    say(f"loading {src.name} in both engines")
    torch_engine = TorchEngine(src.hf_dir, threads=threads)
    llama_engine = LlamaCppEngine(src.gguf, n_threads=threads)
    try:
        say(f"{src.name}: tokenizer")
        same = trips = 0
        for s in strings:
            a = (torch_engine.tokenize(s), torch_engine.tokenize(s, add_bos=False))
            b = (llama_engine.tokenize(s), llama_engine.tokenize(s, add_bos=False))
            same += a == b
            trips += torch_engine.detokenize(a[1]) == s and llama_engine.detokenize(b[1]) == s
            if a != b:
                result.mismatches.append(f"tokenize {s!r}: torch {a[1]} vs llama.cpp {b[1]}")
        result.ids_identical, result.round_trip_ok = same, trips

        say(f"{src.name}: logits and greedy answers")
        problems = heldout_problems(n_prompts)
        diff = 0.0
        identical = 0
        for p in problems:
            ids = torch_engine.tokenize(full_text(p))
            ts, ls = torch_engine.open(), llama_engine.open()
            try:
                a, b = torch_engine.score(ts, ids), llama_engine.score(ls, ids)
            finally:
                torch_engine.close(ts)
                llama_engine.close(ls)
            diff = max(diff, float(np.abs(a - b).max()))
            q = torch_engine.tokenize(prompt(p))
            ga, gb = _greedy(torch_engine, q, max_new), _greedy_llama(llama_engine, q, max_new)
            identical += ga == gb
            if ga != gb:
                result.mismatches.append(
                    f"greedy {p.id}: torch {torch_engine.detokenize(ga)!r} "
                    f"vs llama.cpp {llama_engine.detokenize(gb)!r}"
                )
        result.max_logit_diff, result.greedy_identical = diff, identical
    finally:
        llama_engine.unload()
    return result


def check_pair(
    draft: Path,
    target: Path | None = None,
    n_prompts: int = 20,
    max_new: int = 48,
    threads: int = 2,
    n_strings: int = 60,
    say: Callable[[str], None] = lambda _m: None,
) -> PairCheck:
    """Check draft and target; raise TokenizerMismatchError if their tokenizers differ."""
    d_src, t_src = resolve_pair(draft, target)
    d_hashes, t_hashes = tokenizer_hashes(d_src), tokenizer_hashes(t_src)
    common = [k for k in d_hashes if k in t_hashes] or [None]
    for kind in common:
        d_hash = d_hashes[kind] if kind else next(iter(d_hashes.values()))
        t_hash = t_hashes[kind] if kind else next(iter(t_hashes.values()))
        if d_hash != t_hash:
            break
    if d_hash != t_hash:
        raise TokenizerMismatchError(
            f"tokenizer mismatch: draft {d_src.name} has tokenizer {d_hash}, target "
            f"{t_src.name} has {t_hash}; draft and target must share one tokenizer"
        )
    strings = sample_strings(n_strings)
    checks = [check_model(s, strings, n_prompts, max_new, threads, say) for s in (d_src, t_src)]
    return PairCheck(checks[0], checks[1], d_hash)


def _has(src: ModelSource, kind: str) -> bool:
    return (src.hf_dir if kind == "HF" else src.gguf) is not None


def sources(report: PairCheck) -> list[str]:
    """One line per model and format: where each checked file lies."""
    lines = []
    for role, m in (("draft", report.draft), ("target", report.target)):
        lines.append(f"{role}: HF {m.source.hf_dir or '-'}, GGUF {m.source.gguf or '-'}")
    return lines


def _pct(n: int | None, of: int) -> str:
    return "n/a" if n is None else f"{100 * n / max(1, of):.1f}% ({n}/{of})"


def render(report: PairCheck) -> Table:
    """A rich Table of the report."""
    from rich.table import Table

    table = Table(title="Cross-engine check (PyTorch vs llama.cpp)")
    table.add_column("")
    table.add_column("draft")
    table.add_column("target")
    d, t = report.draft, report.target

    def row(label: str, f: Callable[[ModelCheck], str]) -> None:
        table.add_row(label, f(d), f(t))

    row("formats", lambda m: " + ".join(k for k in ("HF", "GGUF") if _has(m.source, k)))
    row("tokenizer hash", lambda m: " / ".join(dict.fromkeys(v[:12] for v in m.hashes.values())))
    row("tokenizer ids agree", lambda m: _pct(m.ids_identical, m.strings))
    row("text round trip", lambda m: _pct(m.round_trip_ok, m.strings))
    row(
        "max |logit diff|",
        lambda m: "n/a" if m.max_logit_diff is None else f"{m.max_logit_diff:.2e}",
    )
    row("greedy agreement", lambda m: _pct(m.greedy_identical, m.prompts))
    return table
