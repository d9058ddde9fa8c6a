"""A rehearsal host's own root filesystem: an overlay over this machine's, private to the host.

Each host of a rehearsal lab (testbed.labs.rehearsal) runs in its network namespace and in a
mount and UTS namespace of its own, chrooted into an overlay whose lower layer is this
machine's `/` and whose upper layer lies in the lab's state folder. What the site playbook
does to a host (packages, users, /etc/chrony, /etc/sudoers.d, systemd units, local facts,
the agents' venv) lands in that host's upper layer only: the rehearsal provisions five
"machines" without touching this one. When the host's last process ends (its sshd, killed
by `lab down`), its namespaces and mounts go with it; the upper layer goes with the state
folder.

The image every host boots: this machine's files, a login user with passwordless sudo and
the lab's key, a hostname, `policy-rc.d` (packages install without starting services, as in
container images), `/root` traversable (the controller's Python lives there on some
machines), and a `.pth` in the image Python's site-packages that adds the controller's
packages but the harness, ahead of that Python's own (`image_site_packages`,
`image_pth_line`): the heavy wheels (PyTorch, llama-cpp-python) a real host gets from
PyTorch's index or a llama.cpp build come from the image, as a Jetson's torch comes from
JetPack, and the harness itself installs from the lab's wheel folder.
"""

from __future__ import annotations

import functools
import importlib.metadata
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from testbed.labs.sshd import sshd_text

PROJECT = "edge-spec-testbed"
SSHD_DIR = "/etc/ssh/edge-lab"
SSHD_PID = f"{SSHD_DIR}/sshd.pid"
IMAGE_PTH = "edge-lab-image.pth"


@dataclass(frozen=True)
class HostRoot:
    """Where a host's root filesystem lives on this machine."""

    base: Path

    @property
    def upper(self) -> Path:
        return self.base / "upper"

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def merged(self) -> Path:
        return self.base / "root"

    def on_machine(self, path: str) -> Path:
        """Where a file the host wrote at `path` is on this machine (its upper layer)."""
        return self.upper / path.lstrip("/")


@dataclass(frozen=True)
class Boot:
    """What a host's boot script does: its name, login user and key, sshd, extra services."""

    name: str
    user: str
    authorized_key: str
    sshd_config: str  # file name under SSHD_DIR; starts with the lab's prefix (clean finds it)
    sshd_text: str
    host_key: Path
    image_pth: str  # the folder the image's Python adds (image_site_packages)
    binds: dict[str, Path] = field(default_factory=dict)  # path in the host -> folder here
    services: list[list[str]] = field(default_factory=list)  # argv, started after sshd


def image_python() -> str:
    """The image's Python: the one the controller's venv was made from (same build, so the
    controller's packages load in it)."""
    return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())


@functools.cache
def image_purelib() -> Path:
    """A site-packages folder of the image's Python (it reads `.pth` files there)."""
    out = subprocess.run(
        [image_python(), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return Path(out.stdout.strip())


def image_site_packages(folder: Path) -> Path:
    """A folder of links to every package of this Python's environment but the harness's own,
    so a host's pip sees PyTorch and friends installed and the harness not; returns it."""
    site = Path(sysconfig.get_path("purelib"))
    harness = {PROJECT.replace("-", "_")}
    try:
        files = importlib.metadata.distribution(PROJECT).files or []
        harness |= {Path(str(f)).parts[0] for f in files}
    except importlib.metadata.PackageNotFoundError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    for entry in sorted(site.iterdir()):
        own = entry.name.split("-")[0] in harness or entry.name.startswith("__editable__")
        if own or entry.name in harness or entry.suffix == ".pth":
            continue
        link = folder / entry.name
        if not link.is_symlink():
            link.symlink_to(entry)
    return folder


def image_pth_line(folder: str) -> str:
    """The `.pth` line that puts `folder` on sys.path just before the image Python's own
    site-packages: the controller's packages shadow that Python's older ones (its click, say),
    as they do in the controller's venv, and a venv's own packages still come first."""
    base = str(image_purelib())
    return (
        f"import sys; sys.path.insert(sys.path.index({base!r}) if {base!r} in sys.path "
        f"else len(sys.path), {folder!r})"
    )


def boot_script(root: HostRoot, boot: Boot) -> str:
    """The shell script that boots a host: run as root in the host's network namespace, in
    fresh mount and UTS namespaces (`unshare --mount --uts --propagation private`)."""
    m, q = str(root.merged), shlex.quote
    user_home = "/root" if boot.user == "root" else f"/home/{boot.user}"
    lines = [
        "set -e",
        f"mkdir -p {q(str(root.upper))} {q(str(root.work))} {q(m)}",
        f"mount -t overlay overlay -o lowerdir=/,upperdir={root.upper},workdir={root.work} {q(m)}",
        f"mount -t proc proc {q(m + '/proc')}",
        f"mount -t sysfs sysfs {q(m + '/sys')}",
        f"mount --rbind /dev {q(m + '/dev')}",
        f"mount -t tmpfs -o mode=755 tmpfs {q(m + '/run')}",
        f"mkdir -p {q(m + '/run/sshd')}",
        f"hostname {q(boot.name)}",
        f"echo {q(boot.name)} > {q(m + '/etc/hostname')}",
        f"echo {q('127.0.1.1 ' + boot.name)} >> {q(m + '/etc/hosts')}",
        f"chmod 711 {q(m + '/root')}",
        f"printf '#!/bin/sh\\nexit 101\\n' > {q(m + '/usr/sbin/policy-rc.d')}",
        f"chmod 755 {q(m + '/usr/sbin/policy-rc.d')}",
        f"mkdir -p {q(m + str(image_purelib()))}",
        f"echo {q(image_pth_line(boot.image_pth))} > {q(m + str(image_purelib() / IMAGE_PTH))}",
    ]
    if boot.user != "root":
        lines += [
            f"chroot {q(m)} useradd -m -s /bin/bash -p '*' {q(boot.user)}",
            f"echo {q(boot.user + ' ALL=(ALL) NOPASSWD:ALL')} > {q(m + '/etc/sudoers.d/edge-lab')}",
            f"chmod 440 {q(m + '/etc/sudoers.d/edge-lab')}",
        ]
    ssh = f"{m}{user_home}/.ssh"
    lines += [
        f"mkdir -p {q(ssh)}",
        f"echo {q(boot.authorized_key)} > {q(ssh + '/authorized_keys')}",
        f"chmod 700 {q(ssh)} && chmod 600 {q(ssh + '/authorized_keys')}",
        f"chroot {q(m)} chown -R {q(boot.user)}: {q(user_home + '/.ssh')}",
        f"mkdir -p {q(m + SSHD_DIR)}",
        f"cp {q(str(boot.host_key))} {q(m + SSHD_DIR + '/host_ed25519')}",
        f"chmod 600 {q(m + SSHD_DIR + '/host_ed25519')}",
        f"cat > {q(m + SSHD_DIR + '/' + boot.sshd_config)} <<'EOF'\n{boot.sshd_text}EOF",
    ]
    for inside, here in boot.binds.items():
        lines += [f"mkdir -p {q(m + inside)}", f"mount --bind {q(str(here))} {q(m + inside)}"]
    lines.append(f"chroot {q(m)} /usr/sbin/sshd -f {q(SSHD_DIR + '/' + boot.sshd_config)}")
    for argv in boot.services:
        lines.append(f"setsid chroot {q(m)} {shlex.join(argv)} </dev/null >/dev/null 2>&1 &")
    return "\n".join(lines) + "\n"


def sshd_config(address: str, port: int) -> str:
    """The host's sshd: its management address, the key in the login user's home, key login
    only; its pid file where the machine can read it (the upper layer)."""
    return sshd_text(
        f"ListenAddress {address}:{port}",
        f"PidFile {SSHD_PID}",
        f"HostKey {SSHD_DIR}/host_ed25519",
    )
