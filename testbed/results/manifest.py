"""What a run's manifest records about where and how it ran."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from testbed.core.files import file_sha256
from testbed.core.paths import REPO_ROOT

PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "llama_cpp_python",
    "gguf",
    "numpy",
    "fabric",
    "paramiko",
    "ansible-core",
    "pandas",
    "pyarrow",
    "pydantic",
    "duckdb",
)


def git_commit() -> dict[str, Any]:
    """HEAD commit of the checkout and whether the tree had uncommitted changes."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() if out.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain"))}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host_facts() -> dict[str, Any]:
    """The controller machine: kernel, CPU count, memory, Python."""
    mem = None
    try:
        with open("/proc/meminfo") as fh:
            mem = int(fh.readline().split()[1]) * 1024
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
    }


def build_manifest(run_id: str, playbook: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The manifest written before anything runs; `extra` adds run-specific fields."""
    return {
        "run_id": run_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "playbook": playbook,
        "git": git_commit(),
        "packages": package_versions(),
        "host": host_facts(),
        **extra,
    }


def model_digests(*models: str) -> dict[str, dict[str, str]]:
    """For each model path (a file, or a folder such as an HF checkpoint): relative file name
    -> sha256, so a run says exactly which weights it used. Paths not on this machine (placed
    on lab hosts by Ansible) map to {}."""
    out: dict[str, dict[str, str]] = {}
    for model in models:
        root = Path(model)
        if root.is_file():
            out[model] = {root.name: file_sha256(root)}
        elif root.is_dir():
            files = sorted(p for p in root.rglob("*") if p.is_file())
            out[model] = {str(p.relative_to(root)): file_sha256(p) for p in files}
        else:
            out[model] = {}
    return out
