"""Crash-safe file writes, the one helper every replaced file goes through, and file digests.

`atomic_replace(path)` yields a temporary name beside `path`; whatever is written there (by
any writer: pyarrow, a compiler, a model exporter) replaces `path` in one rename when the block
ends without error, so readers see the old or the new file, never a mix, and a crash leaves at
most a hidden temporary. `append_json_line` appends one line with a single O_APPEND write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_replace(path: Path) -> Iterator[Path]:
    """Yield a temporary path; on success fsync it and rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if tmp.is_file():
            with tmp.open("rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    """Replace path with data so that readers see the old or the new file, never a mix."""
    with atomic_replace(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def append_json_line(path: Path, obj: Any) -> None:
    """Append one JSON line with a single O_APPEND write, then fsync."""
    line = (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    """sha256 of one file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
