"""Find the packet holder to run: the C one (compiled on first use into the cache) or Python's."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed import paths
from testbed.errors import PrivilegeError

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "holder.c"
PY_SOURCE = HERE / "holder_py.py"
HolderKind = Literal["c", "python"]


@dataclass(frozen=True)
class Holder:
    """How to start the holder: `argv` prefix and which implementation it is."""

    kind: HolderKind
    argv: tuple[str, ...]
    note: str = ""


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
        [cc, "-O2", "-Wall", "-o", str(tmp), str(C_SOURCE), "-lnetfilter_queue", "-lnfnetlink"],
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


def python_holder_available(python: str = sys.executable) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("netfilterqueue") is not None
    proc = subprocess.run([python, "-c", "import netfilterqueue"], capture_output=True, check=False)
    return proc.returncode == 0


def find_holder(prefer: Literal["auto", "c", "python"] = "auto") -> Holder:
    """The C holder when it builds, else the Python NetfilterQueue one; PrivilegeError if none."""
    why_not_c = "Python holder requested"
    if prefer in ("auto", "c"):
        binary, why_not_c = _compile_c()
        if binary is not None:
            return Holder("c", (str(binary),))
        if prefer == "c":
            raise PrivilegeError(f"C packet holder unavailable: {why_not_c}")
    if python_holder_available():
        return Holder("python", (sys.executable, str(PY_SOURCE)), note=f"C holder: {why_not_c}")
    raise PrivilegeError(
        f"no NFQUEUE packet holder: {why_not_c}, and the Python fallback needs the "
        "`netfilterqueue` package (pip install netfilterqueue)"
    )
