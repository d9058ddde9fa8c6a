"""Host-class compute and the backup path, measured on the emulated lab (root).

    testbed bench lab-paths [--draft-as MODEL@FORMAT] [--tokens 64] [--cuts 5]     (as root)

1. Drafting rate per host class: a lab with one Pi 5 and one Jetson Orin Nano, each pacing
   the tiny draft model's forwards to the modelled time of `--draft-as` on its class's
   hardware (`agents.emulation`); both draft greedily with llama.cpp over SSH at the same
   time. Prints each class's tokens/s beside the catalogue's decode rate, the forwards behind
   their modelled time, and the Jetson / Pi 5 ratio against the catalogue's.
2. Switch-over time of the backup path: a lab with one device, its primary link cut `--cuts`
   times (a bridge-side nftables drop) while a 200 Hz UDP flow runs; prints the time from the
   cut to the first datagram over the backup path, and from the heal to the first over the
   primary again.

Environment: TESTBED_BENCH_SUBNET (default 10.85.20.0/24; the backup path uses the next /24).
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from agents.failover import socket_in
from testbed.hosts.control import HostControl
from testbed.labs.backup import build_backup, read_failovers, start_monitor
from testbed.labs.drafting_rate import measure_drafting_rate
from testbed.labs.emulated import EmulatedLab
from testbed.labs.setup import LabSetup
from testbed.models.tiny import ensure_tiny_pair
from testbed.topo.profile import LinkProfile
from testbed.topo.topology import TopoHost, TopoLink, Topology

SUBNET = os.environ.get("TESTBED_BENCH_SUBNET", "10.85.20.0/24")


def mixed(classes: list[str]) -> Topology:
    hosts = [TopoHost(name="server", role="server", host_class="a100")]
    hosts += [
        TopoHost(name=f"dev{i}", role="device", host_class=c) for i, c in enumerate(classes, 1)
    ]
    wifi = LinkProfile(rtt_ms=85)
    links = [
        TopoLink(a=h.name, b="server", profile_name="wifi", profile=wifi)
        for h in hosts
        if h.role == "device"
    ]
    return Topology(name="bench", hosts=hosts, links=links)


def drafting(draft_as: str, tokens: int) -> None:
    """Paced drafting rate of a Pi 5 and a Jetson Orin Nano, side by side (module docstring)."""
    import json
    import tempfile
    from pathlib import Path

    from agents.emulation.stepcost import decode_seconds
    from testbed.config.playbook import Playbook
    from testbed.runner.emulation import ConditionTime, hardware_of, host_emulation
    from testbed.topo.catalogue import load_catalogue

    model = ensure_tiny_pair().draft_gguf
    setup = LabSetup.build(
        name="hbench", topology=mixed(["pi5", "jetson-orin-nano"]), subnet=SUBNET
    )
    pb = Playbook(name="bench", mode="device-only", models={"draft_as": draft_as})
    cat = load_catalogue()
    shape = cat.model(draft_as, "--draft-as")
    with EmulatedLab.running(setup) as lab, HostControl(lab.inventory()) as hc:
        when = ConditionTime.starting_now(1.0)
        devices = lab.inventory().devices
        with tempfile.TemporaryDirectory() as tmp:
            for h in devices:
                local = Path(tmp) / f"{h.name}.json"
                local.write_text(json.dumps(host_emulation(h, pb, True, when)))
                hc.run(h, f"mkdir -p {h.workdir}")
                hc.put(h, local, f"{h.workdir}/emulation.json")
        rates = hc.parallel(
            lambda h: measure_drafting_rate(
                hc, h.name, model, f"{h.workdir}/emulation.json", tokens=tokens, seconds=3.0
            ),
            devices,
            what="drafting-rate probe",
        )
        classes = {h.name: h.host_class for h in devices}
    print(
        f"drafting rate, tiny draft paced as {draft_as}, llama.cpp 1 thread, rounds of "
        f"{tokens} tokens, 3 s, both classes at once"
    )
    print(f"{'class':<18}{'hardware':<20}{'tok/s':>9}{'model tok/s':>13}{'behind':>9}")
    measured: dict[str, float] = {}
    modelled: dict[str, float] = {}
    for host, r in rates.items():
        assert r is not None
        cls = str(classes[host])
        hw = cat.hardware(str(hardware_of(cls, host)), host)
        modelled[cls] = 1 / decode_seconds(hw, shape, 1, tokens // 2)
        measured[cls] = r.tokens_per_s
        behind = f"{r.pacing['behind']}/{r.pacing['forwards']}" if r.pacing else "-"
        print(f"{cls:<18}{hw.name:<20}{r.tokens_per_s:>9.1f}{modelled[cls]:>13.1f}{behind:>9}")
    pi, jet = "pi5", "jetson-orin-nano"
    print(
        f"jetson / pi5 drafting rate: {measured[jet] / measured[pi]:.2f} "
        f"(catalogue: {modelled[jet] / modelled[pi]:.2f})"
    )


def switchover(cuts: int) -> None:
    setup = LabSetup.build(name="hbench", devices=1, subnet=SUBNET)
    to_backup, to_primary = [], []
    with EmulatedLab.running(setup) as lab:
        plan = build_backup(lab)
        log = start_monitor(lab, plan)
        dev, server = plan.devices[0], plan.server
        rx = socket_in(server.netns)
        rx.bind((server.primary_ip, 9900))
        rx.settimeout(0.1)
        tx = socket_in(dev.netns)
        seen: list[tuple[float, str]] = []
        stop = threading.Event()

        def receive() -> None:
            while not stop.is_set():
                try:
                    _d, (src, _p) = rx.recvfrom(64)
                except TimeoutError:
                    continue
                seen.append((time.time(), src))

        def send() -> None:
            while not stop.is_set():
                tx.sendto(b"x", (server.primary_ip, 9900))
                time.sleep(0.005)

        threads = [threading.Thread(target=f, daemon=True) for f in (receive, send)]
        for t in threads:
            t.start()
        port = lab.host(dev.name).port

        def first(src: str, after: float) -> float:
            deadline = time.time() + 10
            while time.time() < deadline:
                hit = next((t for t, s in seen if s == src and t > after), None)
                if hit is not None:
                    return hit
                time.sleep(0.005)
            raise RuntimeError(f"no datagram from {src} within 10 s")

        time.sleep(0.5)
        for _ in range(cuts):
            t_cut = time.time()
            rules = (
                "add table bridge hcut\n"
                "add chain bridge hcut c { type filter hook forward priority 0; }\n"
                f'add rule bridge hcut c iifname "{port}" drop\n'
                f'add rule bridge hcut c oifname "{port}" drop\n'
            )
            lab.runner.run(["nft", "-f", "-"], netns=lab.bridge_netns, input=rules)
            to_backup.append(first(dev.backup_ip, t_cut) - t_cut)
            time.sleep(0.5)
            t_heal = time.time()
            lab.runner.run(["nft", "delete", "table", "bridge", "hcut"], netns=lab.bridge_netns)
            to_primary.append(first(dev.primary_ip, t_heal) - t_heal)
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join()
        events = read_failovers(log)
    ms = [1000 * x for x in to_backup]
    back = [1000 * x for x in to_primary]
    print(
        f"backup path: {cuts} cuts, probes every {plan.interval_ms:.0f} ms, "
        f"down after {plan.down_after} lost, up after {plan.up_after} answered"
    )
    print(
        f"  cut -> traffic on backup: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms"
    )
    print(
        f"  heal -> traffic on primary: median {statistics.median(back):.0f} ms, "
        f"max {max(back):.0f} ms"
    )
    print(
        f"  failovers logged: {len(events)} (route change median "
        f"{statistics.median(e.route_ms for e in events):.1f} ms)"
    )
