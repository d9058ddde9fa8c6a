"""Well-known locations: the repository root, the per-user cache, the results folder."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Per-user cache (tiny models, compiled helpers); `TESTBED_CACHE` overrides it."""
    env = os.environ.get("TESTBED_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = base if env else base / "edge-testbed"
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir() -> Path:
    """Where runs are written; `TESTBED_RESULTS` overrides `results/` in the repository."""
    env = os.environ.get("TESTBED_RESULTS")
    return Path(env) if env else REPO_ROOT / "results"
