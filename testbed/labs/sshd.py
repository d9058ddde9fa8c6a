"""Keys and one OpenSSH server per emulated host, so Fabric and Ansible reach it as on hardware."""

from __future__ import annotations

import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.core.errors import LabError, PrivilegeError
from testbed.labs import naming
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner

PRIVSEP_DIR = Path("/run/sshd")


@dataclass(frozen=True)
class LabKeys:
    """The lab's SSH host key and the controller's client key (both generated per lab)."""

    host_key: Path
    client_key: Path

    @property
    def authorized_keys(self) -> Path:
        return self.client_key.parent / "authorized_keys"

    @classmethod
    def under(cls, state_dir: Path) -> LabKeys:
        keys = state_dir / "keys"
        return cls(host_key=keys / "host_ed25519", client_key=keys / "client_ed25519")


def sshd_binary() -> str:
    """Absolute path of sshd (it re-execs itself, so it must be started by absolute path)."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")
    if not found:
        raise PrivilegeError(
            "sshd not found: install openssh-server (apt-get install openssh-server)"
        )
    return str(Path(found).resolve())


def generate_keys(runner: SystemRunner, keys: LabKeys, comment: str) -> None:
    """Create the host and client key pairs and the authorized_keys file."""
    runner.mkdir(keys.client_key.parent)
    for key in (keys.host_key, keys.client_key):
        if not runner.dry_run and key.exists():
            key.unlink()
            key.with_suffix(".pub").unlink(missing_ok=True)
        runner.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", key])
    pub = "" if runner.dry_run else keys.client_key.with_suffix(".pub").read_text()
    runner.write_file(keys.authorized_keys, pub, mode=0o600)


def config_path(state_dir: Path, lab: str, host: LabHost) -> Path:
    """Config file of a host's sshd; its `tb-<lab>-` name lets `clean` recognise the process."""
    return state_dir / "sshd" / f"{naming.netns_prefix(lab)}{host.name}-sshd.conf"


KEY_LOGIN_ONLY = (
    "PermitRootLogin prohibit-password",
    "PubkeyAuthentication yes",
    "PasswordAuthentication no",
    "KbdInteractiveAuthentication no",
    "UsePAM no",
    "StrictModes no",
    "UseDNS no",
    "PrintMotd no",
    "X11Forwarding no",
    "Subsystem sftp internal-sftp",
    "MaxStartups 200",
    "MaxSessions 200",
    "LogLevel ERROR",
)
"""The sshd settings every emulated host shares: key login only, no PAM, many sessions."""


def sshd_text(*own: str) -> str:
    """An sshd_config: the host's own lines (address, pid file, keys), then KEY_LOGIN_ONLY."""
    return "\n".join([*own, *KEY_LOGIN_ONLY, ""])


def render_config(host: LabHost, port: int, keys: LabKeys, pid_file: Path) -> str:
    """sshd_config for one host: its own address, pid file and keys; key login only."""
    return sshd_text(
        f"ListenAddress {host.ip}:{port}",
        f"PidFile {pid_file}",
        f"HostKey {keys.host_key}",
        f"AuthorizedKeysFile {keys.authorized_keys}",
    )


def start_sshd(
    runner: SystemRunner, state_dir: Path, lab: str, host: LabHost, port: int, keys: LabKeys
) -> Path:
    """Write the host's sshd config and start sshd in its namespace; returns the pid file."""
    conf = config_path(state_dir, lab, host)
    pid_file = conf.with_suffix(".pid")
    runner.write_file(conf, render_config(host, port, keys, pid_file))
    runner.run(
        [sshd_binary(), "-f", conf, "-E", conf.with_suffix(".log")],
        netns=host.netns,
        error=LabError,
    )
    return pid_file


def wait_listening(addrs: list[tuple[str, int]], timeout: float = 20.0) -> None:
    """Wait until a TCP connect succeeds on every (ip, port); LabError naming those that don't."""
    pending = list(addrs)
    deadline = time.monotonic() + timeout
    while pending:
        still = []
        for ip, port in pending:
            try:
                with socket.create_connection((ip, port), timeout=0.5):
                    pass
            except OSError:
                still.append((ip, port))
        pending = still
        if pending and time.monotonic() > deadline:
            where = ", ".join(f"{ip}:{port}" for ip, port in pending)
            raise LabError(f"sshd did not start listening within {timeout:.0f} s on {where}")
        if pending:
            time.sleep(0.05)
