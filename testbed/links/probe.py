"""Measure a device <-> server link: RTT and loss per direction, against the requested profile.

A UDP echo responder runs on the server and a sender on the device (both `agents.link_probe`,
through each host's runner: in its namespace here, or over SSH with its agents' Python on a lab
of hardware), so the probe crosses exactly the path the agents use. Forward loss is counted
at the responder, reverse loss from the echoes that came back.
Each probe is fitted to the model of the link it crossed (`testbed.links.expect`): per packet,
the profile in force when it was sent, and the RTTs that profile gives under the holder's
ordering policy, side by side with the measured ones.
"""

from __future__ import annotations

import json
import math
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from testbed.core import stats
from testbed.core.errors import AgentEnded, ImpairmentError, shell_status
from testbed.core.fanout import fan_out, raise_failures
from testbed.labs import naming
from testbed.labs.backup import backup_site, load_plan
from testbed.labs.interface import LinkSite
from testbed.labs.setup import LabHost
from testbed.labs.system import SystemRunner
from testbed.links.expect import LinkClock, LinkFit, fit_probe, send_times
from testbed.topo.profile import LOSS_SEMANTICS, LinkProfile
from testbed.topo.topology import PathKind

PROBE_MODULE = ["-m", "agents.link_probe"]  # the sender and responder, on a lab host
BASE_PORT = 47000
UDP_IP_ETH_BYTES = 8 + 20 + 14  # headers a datagram carries on the wire past its payload
RESPONDER, SENDER = "link-probe-responder", "link-probe-sender"  # the agents, as faults name them
PROBE_RT_PRIO = 10  # below the holder's: the probe measures the link, not the CPU queue
DEFAULT_INTERVAL_MS = 10.0


class RttStats(BaseModel):
    n: int
    mean: float
    p50: float
    p99: float
    min: float
    max: float


class LossFigure(BaseModel):
    """Measured loss in one direction (or round trip) and whether it fits the requested rate."""

    requested: float | None
    lost: int
    of: int
    rate: float | None
    interval: tuple[int, int] | None = None  # 95 % binomial interval of lost packets
    within: bool | None = None


class ProbeResult(BaseModel):
    """One link's measurement; errors are |measured - requested| RTT in ms."""

    device: str
    requested: LinkProfile | None
    sent: int
    received_by_server: int
    received_back: int
    rtt_ms: RttStats | None
    rtt_error_ms: dict[str, float] | None
    loss_up: LossFigure
    loss_down: LossFigure
    loss_round_trip: LossFigure
    warmup_s: float
    loss_semantics: str = LOSS_SEMANTICS
    # packets held after the kernel stamped their arrival (`held_after_kernel_stamp`): echoes
    # whose receive time, at either end, had no release stamp from the holder and was taken in
    # user space (None: kernel stamps timed them), and the median of how much later user space
    # read a stamped echo than the holder released it, both ends together: what user-space
    # receive times would have added to its RTT (ms)
    rx_user_space: int | None = None
    rx_wake_ms_p50: float | None = None
    fit: LinkFit | None = None  # expected beside measured, packet by packet (None: no request)

    @property
    def timed_in_user_space(self) -> bool:
        """Whether most echoes were timed in user space (so the median RTT includes wake-ups)."""
        return self.rx_user_space is not None and 2 * self.rx_user_space > self.received_back

    def in_emulated_time(self, dilation: float, requested: LinkProfile | None) -> ProbeResult:
        """The same measurement in emulated time (lab.time_dilation): every time divided by
        `dilation`, against `requested`, the profile before it was dilated."""
        if dilation == 1:
            return self
        scale = 1 / dilation
        rtt = None
        if self.rtt_ms is not None:
            rtt = self.rtt_ms.model_copy(
                update={
                    k: getattr(self.rtt_ms, k) * scale for k in ("mean", "p50", "p99", "min", "max")
                }
            )
        return self.model_copy(
            update={
                "requested": requested,
                "rtt_ms": rtt,
                "rtt_error_ms": None
                if self.rtt_error_ms is None
                else {k: v * scale for k, v in self.rtt_error_ms.items()},
                "rx_wake_ms_p50": None
                if self.rx_wake_ms_p50 is None
                else self.rx_wake_ms_p50 * scale,
                "fit": None if self.fit is None else self.fit.scaled(scale),
            }
        )

    @property
    def ok(self) -> bool:
        """Loss inside the binomial interval in every direction (True when nothing requested)."""
        return all(
            f.within is not False for f in (self.loss_up, self.loss_down, self.loss_round_trip)
        )


def _loss(lost: int, of: int, requested: float | None) -> LossFigure:
    fig = LossFigure(requested=requested, lost=lost, of=of, rate=lost / of if of else None)
    if requested is not None and of:
        fig.interval = stats.binomial_interval(of, requested)
        fig.within = stats.loss_within(lost, of, requested)
    return fig


def summarize(
    device: str,
    requested: LinkProfile | None,
    sent: int,
    at_server: list[int],
    rtts: dict[int, float],
    warmup_s: float = 0.0,
    rx_user_space: int | None = None,
    rx_wake_ms: list[float] | None = None,
    sent_ns: dict[int, int] | None = None,
    echo_sent_ns: dict[int, int] | None = None,
    clock: LinkClock | None = None,
    interval_ms: float = 10.0,
) -> ProbeResult:
    """Turn raw probe output into figures (separate from running it, so it is testable), fitted
    to `requested` (`sent_ns`, `echo_sent_ns`, `clock`, `interval_ms`: see `fit_probe`); each
    RTT's error is against the RTT asked for when its packet was sent; `rx_user_space`,
    `rx_wake_ms`: see RawProbe."""
    fwd = len(set(at_server))
    back = len(rtts)
    values = list(rtts.values())
    rtt = None
    err = None
    fit = None
    if requested is not None:
        fit = fit_probe(requested, sent, at_server, rtts, sent_ns, echo_sent_ns, clock,
                        interval_ms)  # fmt: skip
    if values:
        rtt = RttStats(
            n=len(values),
            mean=sum(values) / len(values),
            p50=stats.percentile(values, 50),
            p99=stats.percentile(values, 99),
            min=min(values),
            max=max(values),
        )
        if requested is not None and fit is not None:
            asked = [fit.rtt_in_force_ms.get(seq, requested.rtt_ms) for seq in rtts]
            signed = [v - a for v, a in zip(values, asked, strict=True)]
            errors = [abs(e) for e in signed]
            err = {
                "median": stats.percentile(errors, 50),
                "p99": stats.percentile(errors, 99),
                "mean": sum(errors) / len(errors),
                "mean_signed": sum(signed) / len(signed),
            }
    up = fit.loss_up_expected if fit else None
    down = fit.loss_down_expected if fit else None
    rt = 1 - (1 - up) * (1 - down) if up is not None and down is not None else None
    return ProbeResult(
        device=device,
        requested=requested,
        sent=sent,
        received_by_server=fwd,
        received_back=back,
        rtt_ms=rtt,
        rtt_error_ms=err,
        loss_up=_loss(sent - fwd, sent, up),
        loss_down=_loss(fwd - back, fwd, down),
        loss_round_trip=_loss(sent - back, sent, rt),
        warmup_s=warmup_s,
        rx_user_space=rx_user_space,
        rx_wake_ms_p50=stats.percentile(rx_wake_ms, 50) if rx_wake_ms else None,
        fit=fit,
    )


def _requested(lab: LinkSite, device: str) -> LinkProfile:
    from testbed.links.api import current

    imp = current(lab)
    if imp is None:
        return LinkProfile()
    return imp.profiles.get(device, LinkProfile())


def link_clock(
    lab: LinkSite, device: str, raw: RawProbe, interval_ms: float, path: PathKind = "primary"
) -> LinkClock | None:
    """When `device`'s link on `path` began its phases, on the probe's clock: as the holder
    wrote it where the holder runs on this machine, else estimated from when the impairment
    was applied and the probe began by the controller's clock; None when nothing is applied."""
    from testbed.links.api import current
    from testbed.links.nfqueue import link_label

    imp = current(lab)
    if imp is None:
        return None
    own = (imp.backend_state.get("clocks") or {}).get(link_label(device, path))
    if own and "up" in own and "down" in own:
        return LinkClock(int(own["up"]), int(own["down"]))
    times = send_times(raw.sent, raw.sent_ns, interval_ms)
    if times is None or not imp.applied_at or not raw.launched_at:
        return None
    after_s = raw.launched_at + raw.warmup_s - imp.applied_at  # first packet, after apply
    t0 = int(times[0] - after_s * 1e9)
    return LinkClock(t0, t0, "estimated")


def probe_argv(lab: LinkSite, host: str) -> list[str]:
    """The link probe's command on `host`, with the Python its agents run with."""
    return [lab.agent_python(host), *PROBE_MODULE]


def ended_status(proc: subprocess.Popen, wait_s: float = 2.0) -> int | None:
    """A process's exit status as a shell gives it, once it has ended (within `wait_s`);
    None while it runs."""
    try:
        return shell_status(proc.wait(timeout=wait_s))
    except subprocess.TimeoutExpired:
        return None


def responder_ended(lab: LinkSite, code: int | None, err: str, when: str = "") -> AgentEnded:
    """The fault of a probe responder that ended by itself (`err`: its standard error)."""
    return AgentEnded(f"probe responder on {lab.server.name} exited with {code}{when}: "
                      f"{err[-500:]}", lab.server.name, RESPONDER, code, err)  # fmt: skip


def ended_output(proc: subprocess.Popen, timeout_s: float) -> tuple[bytes, bool]:
    """What a reporting process (told to end) printed: its stdout once it exits, killed if
    it has not within `timeout_s`; and whether it ended by itself (not killed here)."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return out or b"", False
    return out or b"", True


def held_after_kernel_stamp(lab: LinkSite) -> bool:
    """Whether packets are held after the kernel stamped their arrival: a lab impaired on its
    hosts by the packet holder holds them on the receiver's ingress (netem on the hosts holds
    them on the sender's egress). The probe then takes each receive time from the holder's
    release stamp, and one without (a datagram the holder could not stamp) in user space
    (agents.link_probe's docstring), where a busy or idle CPU's wake-up counts as link delay
    (0.2-0.4 ms on this project's 2-core VM with no impairment at all, against 0.02-0.04 ms
    from kernel stamps)."""
    from testbed.links.api import current

    if not lab.impaired_on_hosts:
        return False
    imp = current(lab)
    return imp is not None and imp.backend == "nfqueue"


class RawProbe(BaseModel):
    """What one probe saw, packet by packet: sequence numbers in the order they arrived."""

    device: str
    sent: int
    at_server: list[int]  # measurement packets the server received, in arrival order
    rtt_ms: dict[int, float]  # echoes back at the device, in arrival order
    warmup_s: float
    rx_span_s: float = 0.0  # first to last echo
    rx_bytes: int = 0  # UDP payload bytes echoed back
    # per echo, when each leg entered the link (kernel transmit times, CLOCK_MONOTONIC ns):
    sent_ns: dict[int, int] = {}  # the datagram, from the device
    echo_sent_ns: dict[int, int] = {}  # its echo, from the server
    # held after the kernel stamps (`held_after_kernel_stamp`; else None and []): echoes timed
    # in user space at either end (no release stamp), and per echo stamped at both ends how
    # much later user space read it than the holder released it, summed over the ends (ms)
    rx_user_space: int | None = None
    rx_wake_ms: list[float] = []
    launched_at: float = 0.0  # wall clock (s, the controller's) when the sender was started

    @property
    def echo_mbit_s(self) -> float | None:
        """Payload throughput of the echoes (both directions crossed the link)."""
        return self.rx_bytes * 8 / self.rx_span_s / 1e6 if self.rx_span_s > 0 else None


def probe_link(
    lab: LinkSite,
    device: str | LabHost,
    requested: LinkProfile | None = None,
    path: PathKind = "primary",
    state: LinkSite | None = None,
    **how: Any,
) -> ProbeResult:
    """Probe one device's link to the server on `path` (`lab` is that path's site; `state`,
    default `lab`, the lab whose impairment holds the link's clock), fitted to `requested`
    (default: what is applied now).

    `how`: the keyword arguments of `probe_packets` (count, interval_ms, size, runner, ...).
    """
    dev = device if isinstance(device, LabHost) else lab.host(device)
    requested = requested if requested is not None else _requested(lab, dev.name)
    raw = probe_packets(lab, dev, requested, **how)
    interval = float(how.get("interval_ms", DEFAULT_INTERVAL_MS))
    clock = link_clock(state or lab, dev.name, raw, interval, path)
    return summarize(dev.name, requested, raw.sent, raw.at_server, raw.rtt_ms, raw.warmup_s,
                     raw.rx_user_space, raw.rx_wake_ms, raw.sent_ns, raw.echo_sent_ns, clock,
                     interval)  # fmt: skip


def send_budget_s(
    requested: LinkProfile, count: int, interval_ms: float, size: int, linger_s: float
) -> float:
    """How long the probe sender may take: its sending time, or, where longer, what `requested`'s
    rate limit needs to pass its datagrams (a sender behind a limit on its own egress waits for
    it: a lab impaired on its hosts), then its linger, and 30 s to spare."""
    rate = requested.rate_mbit
    at_rate = count * (size + UDP_IP_ETH_BYTES) * 8 / (rate * 1e6) if rate else 0.0
    return max(count * interval_ms / 1000, at_rate) + linger_s + 30


def probe_packets(
    lab: LinkSite,
    device: str | LabHost,
    requested: LinkProfile | None = None,
    count: int = 200,
    interval_ms: float = 10.0,
    size: int = 64,
    runner: SystemRunner | None = None,
    via: str | None = None,
    after_hold: bool | None = None,
) -> RawProbe:
    """Send `count` numbered datagrams device -> server -> device; what arrived, in order.

    `via`: send over this interface of the device, from its address `dev.ip` (e.g. the backup
    interface, whatever the device's routes say); default: as the routes say. `after_hold`:
    whether packets are held after the kernel stamps them (default: as
    `held_after_kernel_stamp(lab)` says)."""
    dev = device if isinstance(device, LabHost) else lab.host(device)
    # each end on its own host (in its namespace, or over SSH with its agents' Python)
    at_server, at_device = (runner, runner) if runner else (
        lab.host_runner(lab.server.name), lab.host_runner(dev.name))  # fmt: skip
    server_ns, device_ns = (lab.server.netns, dev.netns) if runner else (None, None)
    if dev.role != "device":
        raise ImpairmentError(f"{dev.name} is not a device of lab {lab.name}")
    requested = requested if requested is not None else _requested(lab, dev.name)
    port = BASE_PORT + lab.devices.index(dev)
    tag = ["--tag", f"{naming.netns_prefix(lab.name)}probe", "--rt-prio", PROBE_RT_PRIO]
    if after_hold is None:
        after_hold = held_after_kernel_stamp(lab)
    if after_hold:
        tag.append("--rx-after-hold")
    errors = Path(tempfile.mkstemp(prefix="tb-probe-", suffix=".err")[1])  # the responder's
    echo = at_server.spawn(
        [*probe_argv(lab, lab.server.name), "echo", "--bind", lab.server.ip, "--port", port,
         "--stop-on-eof", *tag],
        netns=server_ns,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
        stderr_path=errors,
        detach=False,
    )  # fmt: skip
    linger = max(1.0, 3 * (requested.rtt_ms + 2 * requested.jitter_ms) / 1000)
    send_argv = [
        *probe_argv(lab, dev.name), "send", "--dst", lab.server.ip, "--port", port,
        "--count", count, "--interval-ms", interval_ms, "--size", size,
        "--linger-s", f"{linger:.3f}", *tag,
    ]  # fmt: skip
    if via is not None:
        send_argv += ["--via", via, "--src", dev.ip]
    if echo is None:  # dry-run
        errors.unlink(missing_ok=True)
        at_device.run(send_argv, netns=device_ns)
        return RawProbe(device=dev.name, sent=count, at_server=[], rtt_ms={}, warmup_s=0.0)
    try:
        assert echo.stdout is not None
        ready, _, _ = select.select([echo.stdout], [], [], 10)
        if not ready or echo.stdout.readline().strip() != b"ready":
            err = errors.read_text(errors="replace")[-2000:].strip()
            code = ended_status(echo)
            if code not in (None, 0):  # it ended by itself (killed, crashed) before it was ready
                raise responder_ended(lab, code, err, " before it was ready")
            raise ImpairmentError(f"probe responder did not start on {lab.server.name}: {err}")
        budget = send_budget_s(requested, count, interval_ms, size, linger)
        launched = time.time()
        res = at_device.run(send_argv, netns=device_ns, timeout=budget, check=False,
                            error=ImpairmentError)  # fmt: skip
    finally:
        assert echo.stdin is not None
        echo.stdin.close()  # the responder's end of input (over SSH too): it reports and ends
        echo.stdin = None  # closed: communicate() only reads
        out, ended_itself = ended_output(echo, 10)
        err = errors.read_text(errors="replace")[-2000:].strip()
        errors.unlink(missing_ok=True)
    if ended_itself and echo.returncode != 0:  # killed, or crashed: before it was told to end
        raise responder_ended(lab, shell_status(echo.returncode), err)
    if not res.ok:
        raise AgentEnded(
            f"probe sender on {dev.name} exited with {shell_status(res.returncode)}: "
            f"{res.stderr.strip()[-500:]}", dev.name, SENDER, shell_status(res.returncode),
            res.stderr.strip()[-2000:],
        )  # fmt: skip
    try:
        told = json.loads(out.decode().strip().splitlines()[-1])
        at_server = told["received"]
        lags = {int(k): int(v) for k, v in told["send_lag_ns"].items()}
        echo_sent = {int(k): int(v) for k, v in told.get("sent_ns", {}).items()}
        user_at_server = {int(s) for s in told.get("user_rx", [])}
        wake_at_server = {int(k): float(v) for k, v in told.get("wake_ms", {}).items()}
    except (IndexError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ImpairmentError(f"probe responder on {lab.server.name} gave no count") from exc
    try:
        sent = json.loads(res.stdout)
        # the echo's own send time is the responder's, not the link's (agents.link_probe)
        rtts = {int(k): float(v) - lags.get(int(k), 0) / 1e6 for k, v in sent["rtt_ms"].items()}
        user_back = {int(s) for s in sent.get("user_rx", [])}
        wake_back = {int(k): float(v) for k, v in sent.get("wake_ms", {}).items()}
        return RawProbe(
            device=dev.name,
            sent=int(sent["sent"]),
            at_server=at_server,
            rtt_ms=rtts,
            warmup_s=sent["warmup_s"],
            rx_span_s=sent.get("rx_span_s", 0.0),
            rx_bytes=sent.get("rx_bytes", 0),
            sent_ns={int(k): int(v) for k, v in sent.get("sent_ns", {}).items()},
            echo_sent_ns=echo_sent,
            rx_user_space=len((user_at_server | user_back) & rtts.keys()) if after_hold else None,
            rx_wake_ms=[v + wake_at_server[s] for s, v in wake_back.items() if s in wake_at_server],
            launched_at=launched,
        )
    except (ValueError, KeyError, AttributeError, TypeError) as exc:  # pydantic's is a ValueError
        raise ImpairmentError(
            f"probe sender on {dev.name}: expected a JSON object with sent, rtt_ms, sent_ns and "
            f"warmup_s; got {res.stdout[:200]!r} ({exc})"
        ) from exc


def probe_links(
    lab: LinkSite,
    devices: list[str | LabHost] | None = None,
    requested: LinkProfile | None = None,
    count: int = 200,
    interval_ms: float = 10.0,
    parallel: int = 4,
    via: str | None = None,
    after_hold: bool | None = None,
    path: PathKind = "primary",
    state: LinkSite | None = None,
) -> dict[str, ProbeResult]:
    """Probe several device links (default: all) on `path`, `parallel` at a time (`via`,
    `after_hold`: see `probe_packets`; `path`, `state`: see `probe_link`)."""
    targets = [d if isinstance(d, LabHost) else lab.host(d) for d in (devices or lab.devices)]
    if after_hold is None:  # once for all links, not once a link
        after_hold = held_after_kernel_stamp(lab)
    how = {"count": count, "interval_ms": interval_ms, "via": via, "after_hold": after_hold}
    probed = fan_out(lambda d: probe_link(lab, d, requested, path, state, **how), targets,
                     max_workers=parallel)  # fmt: skip
    return dict(raise_failures("probing the links", probed))


def format_result(r: ProbeResult) -> str:
    """One human-readable line per probe."""
    req = r.requested
    parts = [f"{r.device}:"]
    if r.rtt_ms:
        parts.append(f"rtt p50 {r.rtt_ms.p50:.2f} ms p99 {r.rtt_ms.p99:.2f} ms")
        if r.rtt_error_ms and req and req.rtt_ms:
            e = r.rtt_error_ms
            parts.append(f"(error median {e['median']:.2f} p99 {e['p99']:.2f})")
    else:
        parts.append("no echo came back")

    def pct(f: LossFigure) -> str:
        rate = "n/a" if f.rate is None or math.isnan(f.rate) else f"{100 * f.rate:.1f}%"
        mark = "" if f.within is None else (" ok" if f.within else " OUTSIDE 95% interval")
        return f"{rate} of {f.of}{mark}"

    parts.append(f"loss up {pct(r.loss_up)}, down {pct(r.loss_down)}")
    if r.rx_user_space is not None:  # held after the kernel's stamp: who timed the echoes
        stamped = r.received_back - r.rx_user_space
        parts[-1] += ";"
        parts.append(f"{stamped} of {r.received_back} timed by the holder's release stamps")
        if r.rx_wake_ms_p50 is not None:
            parts.append(f"(user-space times would add {r.rx_wake_ms_p50:.2f} ms, median)")
    return " ".join(parts)


def probe_backup(
    lab: LinkSite,
    requested: dict[str, LinkProfile],
    count: int = 200,
    interval_ms: float = 10.0,
) -> dict[str, ProbeResult]:
    """Probe each named device's backup link over its backup interface (`eth1` on a namespace
    lab), against its requested profile, while its traffic may still use the primary path."""
    plan = load_plan(lab)
    after_hold = held_after_kernel_stamp(lab)  # as impaired with the primary path
    site = backup_site(lab, plan)
    iface = {end.name: end.iface for end in plan.devices} if plan else {}
    groups: dict[tuple[str, str], list[str]] = {}
    for device, profile in requested.items():
        groups.setdefault((profile.model_dump_json(), iface[device]), []).append(device)
    results: dict[str, ProbeResult] = {}
    for (_, via), devices in groups.items():
        results.update(
            probe_links(
                site,
                list(devices),
                requested[devices[0]],
                count=count,
                interval_ms=interval_ms,
                via=via,
                after_hold=after_hold,
                path="backup",
                state=lab,
            )  # fmt: skip
        )
    return {d: results[d] for d in requested}
