"""The tiny draft/target pair: built once from a recipe, cached, described by a manifest.

`ensure_tiny_pair()` returns the pair for the current recipe from
`cache_dir()/tiny/<recipe-hash>/`, building it first if needed: tokenizer, draft and target
trained on CPU, both saved as HF folders and GGUF files, evaluated, hashed. The recipe hash
covers every setting of `TinyRecipe` (data seeds and sizes, tokenizer, shapes, steps, learning
rates, threads, `RECIPE_VERSION` for code changes) and the versions of the libraries that
produce the files. A build happens in a temporary folder that is renamed into place when
complete, under a file lock, so a crashed build leaves no half cache and two processes never
build the same pair at once.

Reproducibility, plainly: a build is deterministic on one machine and software stack (fixed
seeds, fixed thread counts), but NOT bit-reproducible across machines: PyTorch's CPU kernels
pick different vector code paths (AVX2, AVX-512, NEON) whose float sums round differently, and
over hundreds of training steps that yields different weights, so the same recipe hash can
give differently accurate pairs on two machines. The manifest records the build machine's CPU
capability and the sha256 of every file, and every run's manifest records the sha256 of the
model files it used: results name their weights, not just their recipe.

Layout of a pair folder: `manifest.json`, and for the target and every draft of the graded
family an HF folder and a GGUF file: `target/` (config.json, model.safetensors, tokenizer
files), `target.gguf`, `draft/`, `draft.gguf` (the default draft), `draft-xs/`, ... .

The drafts are graded: besides the default draft the recipe trains smaller and larger ones
(`TinyRecipe.draft_grades`), all on the same tokenizer and data, so that a run can pick the
draft whose measured acceptance on its workload is nearest the acceptance of the pair it stands
for (`testbed.models.grades`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agents.workloads.arithmetic import full_text, heldout_problems, prompt, train_problems
from testbed.core.files import atomic_replace, file_sha256
from testbed.core.paths import cache_dir
from testbed.models.configs import DRAFT, DRAFT_GRADES, TARGET, DraftGrade, ModelSpec
from testbed.models.tokenizer import TokenizerSpec
from testbed.models.train import TrainSpec

RECIPE_VERSION = 2  # bump when code changes what a build produces
MANIFEST = "manifest.json"
REPRODUCIBILITY = (
    "deterministic on one machine and software stack; CPU kernels differ between vector ISAs "
    "(AVX2/AVX-512/NEON), so other machines build different weights from the same recipe"
)
DEFAULT_DRAFT = "draft"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TinyRecipe:
    """Everything that determines the tiny pair."""

    version: int = RECIPE_VERSION
    train_seed: int = 1
    n_train: int = 60000
    heldout_seed: int = 2
    n_heldout: int = 200
    tokenizer: TokenizerSpec = TokenizerSpec()
    row_len: int = 512  # training rows: problems packed end to end (testbed.models.train)
    draft: ModelSpec = DRAFT
    target: ModelSpec = TARGET
    draft_train: TrainSpec = TrainSpec(steps=400, lr=5e-3, batch_size=8)
    target_train: TrainSpec = TrainSpec(steps=600, lr=4e-3, batch_size=8)
    draft_grades: tuple[DraftGrade, ...] = DRAFT_GRADES
    eval_max_new: int = 40
    gguf_ftype: str = "f32"

    def models(self) -> list[tuple[str, ModelSpec, TrainSpec]]:
        """(name, shape, training) of every model the pair holds: target first, then the
        default draft, then the other grades."""
        return [
            ("target", self.target, self.target_train),
            (DEFAULT_DRAFT, self.draft, self.draft_train),
            *((g.name, g.spec, g.train) for g in self.draft_grades),
        ]


def library_versions() -> dict[str, str]:
    """Versions of the libraries whose output ends up in the pair's files."""
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "tokenizers", "gguf")}


def recipe_hash(recipe: TinyRecipe) -> str:
    """16 hex digits of sha256 over the recipe and the library versions."""
    blob = json.dumps(
        {"recipe": dataclasses.asdict(recipe), "libraries": library_versions()}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TinyPair:
    """Where a built pair lies, and its parsed manifest."""

    root: Path
    draft_hf: Path
    target_hf: Path
    draft_gguf: Path
    target_gguf: Path
    manifest: dict[str, Any] = field(repr=False)

    @property
    def tokenizer_hash(self) -> str:
        return self.manifest["tokenizer"]["hash"]

    @property
    def draft_names(self) -> list[str]:
        """The drafts of the graded family this pair holds, the default first."""
        return [n for n in self.manifest["models"] if n != "target"]

    def draft_files(self, name: str = DEFAULT_DRAFT) -> tuple[Path, Path]:
        """(HF folder, GGUF file) of the draft called name."""
        if name not in self.draft_names:
            raise PairError(
                f"{self.root}: no draft {name!r} (expected one of {', '.join(self.draft_names)})"
            )
        return self.root / name, self.root / f"{name}.gguf"


class PairError(ValueError):
    """A folder is not a complete tiny pair; the message names the folder and what is missing."""


def load_pair(root: Path) -> TinyPair:
    """The pair in root (a folder with manifest.json, draft/, target/ and two GGUF files)."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise PairError(f"{root}: not a tiny pair folder (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PairError(f"{path}: not valid JSON ({e.msg})") from None
    for rel in manifest.get("files", {}):
        if not (root / rel).is_file():
            raise PairError(f"{root}: file {rel} listed in {MANIFEST} is missing")
    return TinyPair(
        root,
        root / "draft",
        root / "target",
        root / "draft.gguf",
        root / "target.gguf",
        manifest,
    )


def verify_pair(pair: TinyPair) -> list[str]:
    """Files whose sha256 differs from the manifest's (empty when the pair is intact)."""
    return [
        rel
        for rel, digest in pair.manifest["files"].items()
        if file_sha256(pair.root / rel) != digest
    ]


def ensure_tiny_pair(
    out: Path | None = None,
    recipe: TinyRecipe | None = None,
    progress: Progress | None = None,
) -> TinyPair:
    """The tiny pair of recipe (default: `TinyRecipe()`), built and cached if needed.

    With out, the pair is also copied into out and the copy is returned.
    """
    recipe = recipe or TinyRecipe()
    say = progress or (lambda _msg: None)
    digest = recipe_hash(recipe)
    base = cache_dir() / "tiny"
    base.mkdir(parents=True, exist_ok=True)
    final = base / digest
    if not (final / MANIFEST).is_file():
        with _locked(base / f"{digest}.lock"):
            if not (final / MANIFEST).is_file():  # another process may have built it meanwhile
                for stale in base.glob(f".build-{digest}-*"):
                    shutil.rmtree(stale, ignore_errors=True)
                tmp = base / f".build-{digest}-{os.getpid()}"
                try:
                    build_pair(tmp, recipe, digest, say)
                    os.rename(tmp, final)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    pair = load_pair(final)
    return copy_pair(pair, Path(out)) if out is not None else pair


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def copy_pair(pair: TinyPair, out: Path) -> TinyPair:
    """Copy a pair into out (files are replaced; other files in out are left alone)."""
    if out.resolve() == pair.root.resolve():
        return pair
    existing = out / MANIFEST
    if existing.is_file():
        with contextlib.suppress(PairError, KeyError, json.JSONDecodeError):
            old = load_pair(out)
            if old.manifest.get("files") == pair.manifest["files"] and not verify_pair(old):
                return old
    out.mkdir(parents=True, exist_ok=True)
    for rel in [*pair.manifest["files"], MANIFEST]:
        dest = out / rel
        with atomic_replace(dest) as tmp:
            shutil.copy2(pair.root / rel, tmp)
    return load_pair(out)


def build_pair(root: Path, recipe: TinyRecipe, digest: str, say: Progress) -> None:
    """Build the pair of recipe into the (new) folder root and write its manifest last."""
    import tokenizers
    import torch
    from transformers.utils import logging as hf_logging

    from agents.engines.torch_hf import TorchEngine
    from testbed.models.configs import llama_config
    from testbed.models.evaluate import heldout_accuracy, token_agreement
    from testbed.models.gguf_export import export_gguf
    from testbed.models.tokenizer import save_tokenizer, train_tokenizer
    from testbed.models.train import TrainProgress, encode_packed, train_model

    hf_logging.disable_progress_bar()
    t0 = time.perf_counter()
    root.mkdir(parents=True)
    say("generating problems and training the tokenizer")
    train = train_problems(recipe.n_train, recipe.train_seed)
    heldout = heldout_problems(recipe.n_heldout, recipe.heldout_seed)
    tspec = recipe.tokenizer
    corpus = [full_text(p) for p in train[: tspec.corpus_size]]
    tok: tokenizers.Tokenizer = train_tokenizer(corpus, tspec.vocab_size)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    data = encode_packed(tok, train, recipe.row_len, bos_id=0, eos_id=1)

    models: dict[str, dict[str, Any]] = {}
    for name, spec, tr in recipe.models():
        config = llama_config(spec, vocab_size)

        def report(p: TrainProgress, name: str = name) -> None:
            say(p.line(f"training {name}"))

        model, result = train_model(config, data, tr, progress=report)
        model.save_pretrained(root / name)
        save_tokenizer(tok, root / name, tspec.model_max_length)
        say(f"exporting {name} to GGUF")
        export_gguf(root / name, root / f"{name}.gguf", recipe.gguf_ftype)
        models[name] = {
            "params": result.params,
            "shape": {**dataclasses.asdict(spec), "vocab_size": vocab_size},
            "train": {
                **dataclasses.asdict(tr),
                "final_loss": result.final_loss,
                "wall_s": result.wall_s,
                "loss_curve": result.loss_curve,
            },
        }
        del model

    say("evaluating on held-out problems")
    threads = recipe.target_train.threads
    old_threads = torch.get_num_threads()
    agreement: dict[str, dict[str, Any]] = {}
    try:
        engines = {name: TorchEngine(root / name, threads=threads) for name in models}
        hashes = {name: engine.tokenizer_hash for name, engine in engines.items()}
        if len(set(hashes.values())) != 1:
            raise RuntimeError(f"the models' tokenizers differ: {hashes}")
        answers: list[list[int]] = []
        for name, engine in engines.items():  # the target first: its answers are the truth
            acc = heldout_accuracy(engine, heldout, recipe.eval_max_new)
            answers = answers or acc.answers
            models[name]["heldout"] = {
                "n": acc.n,
                "exact_match": acc.exact_match,
                "flexible": acc.flexible,
                "by_kind": acc.by_kind,
            }
            say(f"{name}: held-out exact match {acc.exact_match:.1%}")
        prompts = [engines["target"].tokenize(prompt(p)) for p in heldout]
        for name in models:
            if name == "target":
                continue
            agree, total = token_agreement(engines[name], prompts, answers)
            agreement[name] = {"draft_vs_target_greedy": round(agree / max(1, total), 4),
                               "tokens": total}  # fmt: skip
            models[name]["agreement"] = agreement[name]
    finally:
        torch.set_num_threads(old_threads)

    files = {
        str(p.relative_to(root)): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()
    }
    manifest = {
        "format": 1,
        "recipe_hash": digest,
        "recipe": dataclasses.asdict(recipe),
        "libraries": library_versions(),
        "python": platform.python_version(),
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build_wall_s": round(time.perf_counter() - t0, 1),
        "tokenizer": {"hash": hashes["target"], "vocab_size": vocab_size},
        "models": models,
        "agreement": {
            **agreement[DEFAULT_DRAFT],
            "what": "draft argmax == target greedy token, teacher-forced on target answers",
        },
        "files": files,
        "reproducibility": {
            "bit_reproducible_across_machines": False,
            "why": REPRODUCIBILITY,
            "build_machine": {
                "machine": platform.machine(),
                "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                "threads": threads,
            },
        },
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
