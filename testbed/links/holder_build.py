"""Find the packet holder: holder.c, compiled on first use into the cache.

Only the C holder is kept: it does Gilbert-Elliott loss, jitter distributions and schedules, and
held 85 ms to about half the error of the former Python (NetfilterQueue) holder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.core import paths
from testbed.core.errors import PrivilegeError

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "holder.c"
HolderKind = Literal["c"]


@dataclass(frozen=True)
class Holder:
    """How to start the holder: `argv` prefix and which implementation it is."""

    kind: HolderKind
    argv: tuple[str, ...]


def _compile_c() -> tuple[Path | None, str]:
    """Compile holder.c into `<cache>/bin/tb-holder-<hash>`; (path or None, why not)."""
    src = C_SOURCE.read_bytes()
    digest = hashlib.sha256(src).hexdigest()[:12]
    out = paths.cache_dir() / "bin" / f"tb-holder-{digest}"
    if out.exists():
        return out, ""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return None, "no C compiler (gcc)"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    proc = subprocess.run(
        [cc, "-O2", "-Wall", "-pthread", "-o", str(tmp), str(C_SOURCE)]
        + ["-lnetfilter_queue", "-lnfnetlink", "-lm"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = (proc.stderr.strip().splitlines() or ["?"])[0]
        return None, f"compiling holder.c failed (libnetfilter-queue-dev missing?): {first}"
    tmp.replace(out)
    for stale in out.parent.glob("tb-holder-*"):  # builds of older sources
        if stale != out and not stale.name.endswith(".tmp"):
            stale.unlink(missing_ok=True)
    return out, ""


def find_holder() -> Holder:
    """The compiled C holder; PrivilegeError if it cannot be built here."""
    binary, why_not = _compile_c()
    if binary is None:
        raise PrivilegeError(f"no NFQUEUE packet holder: {why_not}")
    return Holder("c", (str(binary),))
