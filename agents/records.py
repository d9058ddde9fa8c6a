"""Append-only JSON-lines record files written by agents on their hosts.

Each record is one line written with a single `write` on a file opened with O_APPEND, so a
crash can cut off at most the last line (which readers skip) and never interleaves records.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class RecordWriter:
    """Writes records to `<folder>/<table>.jsonl`, one file per table."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._fds: dict[str, int] = {}

    def write(self, table: str, record: dict[str, Any]) -> None:
        fd = self._fds.get(table)
        if fd is None:
            path = self.folder / f"{table}.jsonl"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._fds[table] = fd
        os.write(fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete records of one .jsonl file (a torn last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            out.append(json.loads(line))
    return out
