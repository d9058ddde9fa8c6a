"""The offline folder a controller serves to a lab with no route outside: wheels and Debian
packages, so the site playbook installs nothing from PyPI or a Debian mirror on the internet.

    FOLDER/wheels/   the harness as a wheel (with `deps`: every dependency's wheel too), and
                     this environment's pip, setuptools and wheel
    FOLDER/debs/     the Debian packages the roles install (testbed_packages of the roles'
                     defaults) that this machine lacks, with their dependencies, and a
                     `Packages` index: a flat apt repository

Served over HTTP from the controller (`python3 -m http.server --directory FOLDER 8000`),
the inventory points the hosts at it: `testbed_pip_find_links: http://CTL:8000/wheels/` and
`lab_apt_mirror: http://CTL:8000/debs`. The wheels are for this machine's Python and the
packages for its architecture and release, and missing from it: right for hosts like it (the
rehearsal lab's); for a lab of other hosts (arm64 Pis) fill the folders on one of them.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.core import paths
from testbed.core.errors import LabError

ROLE_PACKAGE_LISTS = {
    "common": "common_packages",
    "netem": "netem_holder_packages",
}
"""Role -> the variable in its defaults naming the Debian packages it installs."""
EXTRAS = "device,server,controller"
TOOLS = ("pip", "setuptools", "wheel")


class MirrorError(LabError):
    """The offline folder could not be made (the step, and what it said)."""


@dataclass(frozen=True)
class Mirror:
    folder: Path
    wheels: list[str]
    debs: list[str]


def role_packages() -> list[str]:
    """Every Debian package the site playbook's roles install, from their defaults."""
    found: list[str] = []
    for role, var in ROLE_PACKAGE_LISTS.items():
        defaults = paths.REPO_ROOT / "ansible" / "roles" / role / "defaults" / "main.yml"
        for name in yaml.safe_load(defaults.read_text()).get(var, []):
            if name not in found:
                found.append(name)
    return found


def build_mirror(folder: Path, debs: bool = True, deps: bool = False) -> Mirror:
    """Fill `folder` (see the module docstring); MirrorError naming the failed step."""
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("edge_spec_testbed-*.whl"):
        old.unlink()  # the harness as it is now, not an older build of the same version
    target = f"{paths.REPO_ROOT}[{EXTRAS}]" if deps else str(paths.REPO_ROOT)
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "-w",
            str(wheels), target, *(() if deps else ("--no-deps",))]  # fmt: skip
    _run("building the harness wheel", argv)
    _tool_wheels(wheels)
    packages = _debian_packages(folder / "debs") if debs else []
    return Mirror(folder, sorted(p.name for p in wheels.glob("*.whl")), packages)


def _tool_wheels(folder: Path) -> None:
    """Wheels of this environment's packaging tools (pip, setuptools, wheel), once per machine
    (kept in the cache): a venv starts with the tools its Python bundles, older than what some
    packages ask for (PyTorch: setuptools >= 77), and upgrades them from the folder."""
    cache = paths.cache_dir() / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    for name in TOOLS:
        version = importlib.metadata.version(name)
        stem = f"{name}-{version}-"
        if not list(cache.glob(stem + "*.whl")):
            argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary", ":all:", "-d", str(cache), f"{name}=={version}"]  # fmt: skip
            _run(f"downloading {name} {version}", argv)
        for wheel in cache.glob(stem + "*.whl"):
            shutil.copy2(wheel, folder / wheel.name)


def _debian_packages(folder: Path) -> list[str]:
    """The roles' packages this machine lacks, and their dependencies, downloaded (once per
    machine: kept in the cache) into a flat repository."""
    sim = _run("apt-get install -s", ["apt-get", "install", "-s", "-q", *role_packages()])
    names = [line.split()[1] for line in sim.splitlines() if line.startswith("Inst ")]
    cache = paths.cache_dir() / "debs"
    cache.mkdir(parents=True, exist_ok=True)
    wanted = [n for n in names if not list(cache.glob(f"{n}_*.deb"))]
    if wanted:
        _run("apt-get download", ["apt-get", "download", "-q", *wanted], cwd=cache)
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        for deb in cache.glob(f"{name}_*.deb"):
            shutil.copy2(deb, folder / deb.name)
    index = _run("dpkg-scanpackages", ["dpkg-scanpackages", "-m", "."], cwd=folder)
    (folder / "Packages").write_text(index)
    return names


def _run(step: str, argv: list[str], cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=1800)
    except FileNotFoundError as exc:
        raise MirrorError(f"{step}: {argv[0]} is not installed") from exc
    if proc.returncode != 0:
        raise MirrorError(f"{step} failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    return proc.stdout
