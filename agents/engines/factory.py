"""Open the right engine for a model path: GGUF -> llama.cpp, HF folder -> PyTorch."""

from __future__ import annotations

from pathlib import Path

from agents.engines.base import Engine


def engine_kind(path: str | Path) -> str:
    """'llama' for a .gguf file, 'torch' for an HF folder; a clear error otherwise."""
    p = Path(path)
    if p.is_file() and p.suffix == ".gguf":
        return "llama"
    if p.is_dir() and (p / "config.json").exists():
        return "torch"
    raise FileNotFoundError(
        f"model {p}: expected a .gguf file or an HF folder with config.json, found neither"
    )


def load_engine(
    path: str | Path,
    kind: str = "auto",
    device: str = "cpu",
    threads: int = 1,
    prefill_chunk: int | None = None,
) -> Engine:
    """Load `path` with the engine `kind` ('auto', 'llama' or 'torch'); prefill_chunk: the
    most new tokens of a session per forward (llama.cpp's n_batch; None: the default)."""
    if kind == "auto":
        kind = engine_kind(path)
    if kind == "llama":
        from agents.engines.llama_cpp import LlamaCppEngine

        if prefill_chunk:
            return LlamaCppEngine(str(path), n_threads=threads, n_batch=prefill_chunk)
        return LlamaCppEngine(str(path), n_threads=threads)
    if kind == "torch":
        from agents.engines.torch_hf import TorchEngine

        return TorchEngine(str(path), device=device, threads=threads, prefill_chunk=prefill_chunk)
    raise ValueError(f"engine kind must be auto, llama or torch, got {kind!r}")
