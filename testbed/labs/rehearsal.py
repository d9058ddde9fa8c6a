"""The rehearsal lab: an emulated lab shaped like a real one, to walk `docs/lab-bringup.md` on.

    testbed lab up --kind rehearsal --name rh1 --subnet 10.96.0.0/24

It has the hosts of `ansible/inventories/lab.example.yml`, named and reached as a lab names
and reaches them, and writes that inventory for them (`STATE/inventory/lab.yml`, its vault
password beside it): the same site playbook, `testbed run --inventory` and nightly script an
engineer runs on hardware then run on it, over SSH only.

    host      group               user    LAN (ansible_host)  link (link_ip)  middlebox port
    ctl       controller          edge    .2                  -               -
    mbox      middleboxes         edge    .3                  -               (its ports)
    a100      verifiers           edge    .10                 .10             eth1
    pi5-1     drafters/pi5        pi      .21                 .21             wlan1
    pi5-2     drafters/pi5        pi      .22                 .22             wlan2
    jetson-1  drafters/jetson_... nvidia  .31                 .31             wlan3

- Each host is a network namespace with its own root filesystem (testbed.labs.rootfs: an
  overlay, so packages, users, /etc and the agents' venvs are the host's own), a login user
  with passwordless sudo (root for nothing: every system step goes through become/sudo), and
  an sshd on its LAN address.
- The LAN (the given subnet) joins every host and this machine (at .254, where `testbed` and
  `ansible-playbook` run) through a switch namespace. The link segment (the next subnet of the
  same size) joins the server and the devices only through the middlebox: each host's
  `link_iface` is cabled to its own middlebox port, and nothing bridges those ports until the
  site playbook's `middlebox` role makes the bridge the impairment rules need.
- No host has a route outside the lab: no default route, no address beyond the two subnets.
  The controller serves what the hosts install (the offline folder of testbed.hosts.mirror:
  the harness's wheel and the Debian packages the roles need, at http://CTL:8000/) and the
  time (the site playbook's chrony `allow` and `local stratum`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from testbed.core.errors import LabError
from testbed.hosts.mirror import build_mirror
from testbed.labs import naming, sshd
from testbed.labs.emulated import EmulatedLab
from testbed.labs.rootfs import (
    SSHD_PID,
    Boot,
    HostRoot,
    boot_script,
    image_python,
    image_site_packages,
)
from testbed.labs.rootfs import sshd_config as rootfs_sshd_config
from testbed.labs.setup import LabHost, LabSetup
from testbed.labs.system import SystemRunner, require_root
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import Topology

OFFLINE_PORT = 8000
OFFLINE_DIR = "/srv/edge-lab/offline"
INVENTORY = "inventory/lab.yml"
VAULT_PASSWORD = "inventory/vault-pass"
ROOT_WORKDIR = "/srv/edge-testbed"


@dataclass(frozen=True)
class Machine:
    """One host of the rehearsal: its inventory group, login user and addresses' last byte;
    a server or device also its class, its interface on the link and its middlebox port."""

    name: str
    group: str
    user: str
    octet: int
    host_class: str | None = None
    link_iface: str | None = None
    port: str | None = None

    @property
    def workdir(self) -> str:
        return f"/home/{self.user}/edge-testbed" if self.user != "edge" else ROOT_WORKDIR


MACHINES = (
    Machine("ctl", "controller", "edge", 2),
    Machine("mbox", "middleboxes", "edge", 3),
    Machine("a100", "verifiers", "edge", 10, "a100", "enp65s0", "eth1"),
    Machine("pi5-1", "pi5", "pi", 21, "pi5", "wlan0", "wlan1"),
    Machine("pi5-2", "pi5", "pi", 22, "pi5", "wlan0", "wlan2"),
    Machine("jetson-1", "jetson_orin_nano", "nvidia", 31, "jetson-orin-nano", "wlan0", "wlan3"),
)
DEFAULT_SUBNET = "10.96.0.0/24"


def rehearsal_topology() -> Topology:
    """The server and devices of the rehearsal, each device on an 85 ms link."""
    topo = Topology(name="rehearsal", description="shaped like lab.example.yml")
    for m in MACHINES:
        if m.host_class:
            topo.add_host(m.name, "server" if m.group == "verifiers" else "device", m.host_class)
    for m in MACHINES:
        if m.host_class and m.group != "verifiers":
            topo.add_link(m.name, "a100", "wifi", LinkProfile(rtt_ms=85))
    return topo


def link_subnet(lan: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The link segment: the subnet of the LAN's size right after it."""
    return ipaddress.IPv4Network(f"{lan.broadcast_address + 1}/{lan.prefixlen}")


class RehearsalLab(EmulatedLab):
    """The rehearsal lab (see the module docstring); `lab down` / `lab clean` remove it as they
    remove any namespace lab (every process in its namespaces, then the namespaces)."""

    kind: ClassVar[str] = "rehearsal"
    # its hosts are run as hardware: lab kind inventory, nothing paced
    emulated: ClassVar[bool] = False

    @classmethod
    def up(
        cls,
        setup: LabSetup,
        runner: SystemRunner | None = None,
        progress: Callable[[str], None] | None = None,
        persistent: bool = False,
    ) -> RehearsalLab:
        """Bring the rehearsal up (see the module docstring); on a failure remove what was made."""
        runner = runner or SystemRunner()
        say = progress or (lambda _msg: None)
        if runner.dry_run:
            raise LabError("lab kind rehearsal has no dry run: it boots hosts to rehearse on")
        require_root()
        setup = setup.model_copy(update={"topology": rehearsal_topology()})
        lan = setup.subnet
        hosts = [_lab_host(setup.name, m, lan) for m in MACHINES]
        lab, keys = cls._begin(
            setup, runner,
            [h for h in hosts if h.role in ("server", "device")],
            [h for h in hosts if h.role not in ("server", "device")],
            INVENTORY, persistent,
        )  # fmt: skip
        state, state_dir = lab.state, lab.state.state_dir
        t0 = time.monotonic()
        try:
            runner.remove_tree(lab.runtime_dir)
            runner.mkdir(lab.runtime_dir)
            state.save()
            from testbed.models.tiny import ensure_tiny_pair

            say("models: the tiny pair stands for the lab's model files")
            models = ensure_tiny_pair(progress=say)
            say("offline folder: the harness's wheel, the roles' Debian packages")
            mirror = build_mirror(state_dir / "offline")
            image = image_site_packages(state_dir / "image" / "site-packages")
            sshd.generate_keys(runner, keys, comment=f"{naming.PREFIX}{setup.name}")
            say(f"LAN {lan}, link segment {link_subnet(lan)}")
            lab._make_bridge()
            for h in hosts:
                lab._lan_host(h)
            lab._cable_links(hosts)
            lab._attach_controller()
            say(f"{len(hosts)} hosts boot: {', '.join(h.name for h in hosts)}")
            for m, h in zip(MACHINES, hosts):
                lab._boot(m, h, keys, image, state_dir / "offline")
            sshd.wait_listening([(h.ip, setup.ssh_port) for h in hosts])
            lab._write_inventory(models, mirror.folder)
        except BaseException:
            state.status = "failed"
            state.save()
            lab._remove(keep_files=True)
            raise
        state.status = "up"
        state.up_seconds = time.monotonic() - t0
        state.save()
        return lab

    # --- what it is ------------------------------------------------------------------------

    @property
    def vault_password_file(self) -> Path:
        return self.state_dir / VAULT_PASSWORD

    def machine(self, name: str) -> LabHost:
        """Any host of the rehearsal, the controller and the middlebox included."""
        for h in [*self.state.hosts, *self.state.support_hosts]:
            if h.name == name:
                return h
        raise LabError(f"lab {self.name} has no host {name!r}")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "kind": self.kind, "inventory": str(self.inventory_path)}

    def unplug(self, name: str) -> None:
        """Take host `name` down as a pulled plug would: its processes end (sshd, agents),
        its cables go down; its namespace stays, so `lab down` removes it as usual."""
        host = self.machine(name)
        pids = self.runner.run(["ip", "netns", "pids", host.netns], query=True).stdout.split()
        for pid in pids:
            self.runner.kill(int(pid), 9)
        links = self.runner.run(["ip", "-n", host.netns, "-o", "link", "show"], query=True)
        for line in links.stdout.splitlines():
            iface = line.split(":")[1].strip().split("@")[0]
            if iface != "lo":
                self.runner.run(["ip", "-n", host.netns, "link", "set", iface, "down"])

    # --- building blocks -------------------------------------------------------------------

    def _lan_host(self, host: LabHost) -> None:
        """The host's namespace and its `eth0` on the LAN switch."""
        r, sw = self.runner, self.bridge_netns
        self._ns_setup(host.netns)
        port = f"l-{host.name}"[:15]
        r.run(["ip", "link", "add", "eth0", "netns", host.netns, "type", "veth",
               "peer", "name", port, "netns", sw])  # fmt: skip
        r.run(["ip", "-n", sw, "link", "set", port, "master", naming.BRIDGE, "up"])
        r.run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/{self.setup.prefix_len}",
               "dev", "eth0"])  # fmt: skip
        r.run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        self.state.save()

    def _cable_links(self, hosts: list[LabHost]) -> None:
        """Each server's and device's `link_iface` cabled to its own middlebox port (no bridge:
        the site playbook's middlebox role makes it), with its link address."""
        r = self.runner
        mbox = next(h for h in hosts if h.role == "middlebox")
        segment = link_subnet(self.setup.subnet)
        for m, h in zip(MACHINES, hosts):
            if not m.port or not m.link_iface:
                continue
            r.run(["ip", "link", "add", m.link_iface, "netns", h.netns, "type", "veth",
                   "peer", "name", m.port, "netns", mbox.netns])  # fmt: skip
            address = f"{segment.network_address + m.octet}/{segment.prefixlen}"
            r.run(["ip", "-n", h.netns, "addr", "add", address, "dev", m.link_iface])
            r.run(["ip", "-n", h.netns, "link", "set", m.link_iface, "up"])
            r.run(["ip", "-n", mbox.netns, "link", "set", m.port, "up"])

    def _boot(
        self, m: Machine, host: LabHost, keys: sshd.LabKeys, image: Path, offline: Path
    ) -> None:
        """Boot the host in its own root filesystem, its sshd (and on the controller the
        offline folder's web server) running; records sshd's pid file."""
        root = HostRoot(self.state_dir / "roots" / m.name)
        conf = f"{naming.netns_prefix(self.name)}{m.name}-sshd.conf"
        boot = Boot(
            name=m.name,
            user=m.user,
            authorized_key=keys.client_key.with_suffix(".pub").read_text().strip(),
            sshd_config=conf,
            sshd_text=rootfs_sshd_config(host.ip, self.setup.ssh_port),
            host_key=keys.host_key,
            image_pth=str(image),
        )
        if m.group == "controller":
            serve = ["python3", "-m", "http.server", "--bind", host.ip, str(OFFLINE_PORT),
                     "--directory", OFFLINE_DIR]  # fmt: skip
            boot = dataclasses.replace(boot, binds={OFFLINE_DIR: offline}, services=[serve])
        script = boot_script(root, boot)
        self.runner.run(["unshare", "--mount", "--uts", "--propagation", "private",
                         "sh", "-c", script], netns=host.netns, error=LabError)  # fmt: skip
        self.state.sshd_pid_files[m.name] = root.on_machine(SSHD_PID)
        self.state.save()

    def _write_inventory(self, models: Any, offline: Path) -> None:
        """The lab's inventory, shaped like ansible/inventories/lab.example.yml, with a vaulted
        protocol key and its vault password beside it."""
        path = self.inventory_path
        path.parent.mkdir(parents=True, exist_ok=True)
        password = self.vault_password_file
        password.write_text(secrets.token_hex(16) + "\n")
        os.chmod(password, 0o600)
        # this password alone: one the environment names too would be a second vault id
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-vault"), "encrypt_string",
             "--vault-password-file", str(password), "--name", "lab_protocol_key",
             secrets.token_hex(24)],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        if proc.returncode != 0:
            raise LabError(f"{path}: lab_protocol_key: ansible-vault encrypt_string failed "
                           f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}")  # fmt: skip
        vaulted = proc.stdout
        doc = inventory_document(self, models)
        text = yaml.safe_dump(doc, sort_keys=False)
        key = "\n".join("    " + line for line in vaulted.strip().splitlines())
        path.write_text(
            "# The rehearsal lab's inventory (testbed lab up --kind rehearsal), shaped like\n"
            "# ansible/inventories/lab.example.yml; vault password: vault-pass beside it.\n"
            + text.replace("    lab_protocol_key: VAULTED\n", key + "\n", 1)
        )


def _lab_host(lab: str, m: Machine, lan: ipaddress.IPv4Network) -> LabHost:
    role = {"controller": "controller", "middleboxes": "middlebox", "verifiers": "server"}
    return LabHost(
        name=m.name,
        role=role.get(m.group, "device"),  # type: ignore[arg-type]
        host_class=m.host_class or m.group,
        ip=str(lan.network_address + m.octet),
        netns=naming.host_netns(lab, m.name),
        workdir=Path(m.workdir),
        port=m.port or "-",
    )


def inventory_document(lab: RehearsalLab, models: Any) -> dict[str, Any]:
    """The rehearsal's inventory as data (see `RehearsalLab._write_inventory`)."""

    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    lan = lab.setup.subnet
    segment = link_subnet(lan)
    ctl = lab.machine("ctl").ip
    offline = f"http://{ctl}:{OFFLINE_PORT}"
    target = models.target_hf
    by_name = {m.name: m for m in MACHINES}

    def host(name: str, **extra: object) -> dict[str, object]:
        m = by_name[name]
        out: dict[str, object] = {"ansible_host": lab.machine(name).ip}
        if m.port:
            out |= {"link_ip": str(segment.network_address + m.octet), "middlebox_port": m.port}
        return out | extra

    draft = {"file": models.draft_gguf.name, "sha256": sha(models.draft_gguf)}
    return {
        "all": {
            "vars": {
                "lab_kind": "physical",
                "ansible_ssh_private_key_file": str(lab.client_key),
                "ansible_python_interpreter": image_python(),
                "testbed_src": "edge-spec-testbed",
                "testbed_pip_find_links": f"{offline}/wheels/",
                "lab_apt_mirror": f"{offline}/debs",
                "testbed_agent_venv_site_packages": True,
                "testbed_model_source_dir": str(models.root),
                "lab_ntp_servers": [ctl],
                "lab_time_clients": [str(lan)],
                "testbed_verifier_port": 7000,
                "lab_protocol_key": "VAULTED",
            },
            "children": {
                "controller": {
                    "hosts": {"ctl": host("ctl", ansible_user="edge", workdir=ROOT_WORKDIR)}
                },
                "verifiers": {
                    "vars": {
                        "host_class": "a100",
                        "ansible_user": "edge",
                        "workdir": ROOT_WORKDIR,
                        "link_iface": "enp65s0",
                        "target_checkpoint": {
                            "name": target.name,
                            "files": {f.name: sha(f) for f in sorted(target.iterdir())},
                        },
                        "verifier_max_batch": 16,
                        "verifier_window_ms": 5,
                    },
                    "hosts": {"a100": host("a100")},
                },
                "drafters": {
                    "vars": {
                        "workdir": "/home/{{ ansible_user }}/edge-testbed",
                        "link_iface": "wlan0",
                        "draft_models": {"llama-3.2-1b-q4": draft, "llama-3.2-3b-q8": draft},
                    },
                    "children": {
                        "pi5": {
                            "vars": {"host_class": "pi5", "ansible_user": "pi"},
                            "hosts": {"pi5-1": host("pi5-1"), "pi5-2": host("pi5-2")},
                        },
                        "jetson_orin_nano": {
                            "vars": {
                                "host_class": "jetson-orin-nano",
                                "ansible_user": "nvidia",
                                "draft_model_name": "llama-3.2-3b-q8",
                            },
                            "hosts": {"jetson-1": host("jetson-1")},
                        },
                    },
                },
                "middleboxes": {
                    "hosts": {
                        "mbox": host(
                            "mbox",
                            ansible_user="edge",
                            workdir=ROOT_WORKDIR,
                            middlebox_bridge="br0",
                        )  # fmt: skip
                    }
                },
            },
        }
    }
