"""The packet holder process (holder.c) on one machine, driven only through a SystemRunner.

Every file (config, ack, pid, log, profile changes) lives in one folder on that machine and every
step is a shell command through the runner, so the same code runs the holder of a bridge
namespace here, of a middlebox over SSH, and of each host of a lab impaired on its hosts:
- `load(config)`: a running holder re-reads the config on SIGHUP and acknowledges it in
  `holder.conf.ack` (held packets keep their release time); otherwise a new holder starts,
  detached (`setsid`), and is ready once it prints `ready`;
- `pid()`: the running holder, checked by its `--tag` (not only by a pid that may be reused);
- `stop()`: SIGTERM (it releases what it holds), then SIGKILL if it lingers;
- `release_counts()`: per queue and config generation, what the holder released and how late its
  own timers let it release (its log: each reload writes the counts of the generation it
  replaces, the stop those of the last), for the holder last started;
- `held_up()`: per generation, the spells in which neither of its releasers ran (the same log);
- `clocks()`: per link and direction, when (CLOCK_MONOTONIC ns on its machine) the phases of
  its profile began to count, as the holder wrote them after its last load.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from testbed.core.errors import BadInputError, ImpairmentError
from testbed.labs.system import SystemRunner
from testbed.links.holder_build import find_holder

CONFIG_FILE, CHANGES_FILE = "holder.conf", "link-changes.jsonl"
READY_TIMEOUT_S = 10.0
RT_PRIO = 20  # SCHED_FIFO: releases on time even when agents load every CPU
POLL_LOCAL_S, POLL_REMOTE_S = 0.005, 0.05  # how often a reply is looked for
START_MARK = "tb-holder start"  # written to the log before each start
FLAGS_ENV = "TESTBED_HOLDER_FLAGS"  # extra flags for every holder this process starts
# one releaser alone, measured against the default: the main thread, or the backup thread
KNOWN_FLAGS = ("--no-backup", "--backup-only")
COUNTS = re.compile(
    r"^queue=(?P<queue>\d+) link=(?P<link>\S+)/(?P<direction>\S+) gen=(?P<gen>\d+) in=\d+ "
    r"out=(?P<out>\d+) "
    r"lost=\d+ full=\d+ late_us_mean=[\d.]+ late_us_max=(?P<max_us>[\d.]+) "
    r"late_over_500us=(?P<late>\d+) by_backup=(?P<backup>\d+) unstamped=(?P<unstamped>\d+) "
    r"read_by_backup=(?P<read_by_backup>\d+) probe_stamped=(?P<probe_stamped>\d+) "
    r"probe_unstamped=(?P<probe_unstamped>\d+)$"
)
HELD_UP = re.compile(
    r"^held_up gen=(?P<gen>\d+) both=(?P<spells>\d+) longest_us=(?P<max_us>[\d.]+) "
    r"total_us=(?P<sum_us>[\d.]+)$"
)
HELD_UP_SPELL = re.compile(
    r"^held_up_spell gen=(?P<gen>\d+) from_ns=(?P<from>\d+) to_ns=(?P<to>\d+)$"
)


@dataclass(frozen=True)
class HeldUp:
    """Under one config generation, the spells in which both of the holder's releasers were held
    up more than 0.5 ms (the p99 goal: woke that late after their timers, or took that long
    over a pass of microseconds) with delays overlapping by as much: neither ran (on a VM, the
    hypervisor held up both virtual CPUs), so every packet due then went out late."""

    generation: int
    spells: int
    longest_ms: float
    total_ms: float
    # each spell's (start, end) on CLOCK_MONOTONIC, ns (the holder lists the first 4096)
    windows: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ReleaseCounts:
    """One queue (a direction of a link) under one config generation: the packets it released,
    and how many of them its own timers released more than 0.5 ms after their due time, and
    the latest (as holder.c measures it, from the due time it armed)."""

    queue: int
    link: str
    direction: str
    generation: int
    released: int
    late_over_500us: int
    latest_ms: float
    by_backup: int = 0  # released by the backup releaser (the main thread was late)
    unstamped: int = 0  # held from when the holder read them: the kernel gave no arrival time
    read_by_backup: int = 0  # read by the backup releaser (waiting unread when it woke)
    probe_stamped: int = 0  # probe datagrams released with their release time (--stamp-probes)
    probe_unstamped: int = 0  # ... and passed without (no copy slot free)


def holder_flags() -> list[str]:
    """The extra flags `FLAGS_ENV` asks for; BadInputError naming it for any other word."""
    words = os.environ.get(FLAGS_ENV, "").split()
    unknown = [w for w in words if w not in KNOWN_FLAGS]
    if unknown:
        raise BadInputError(
            f"{FLAGS_ENV}: unknown holder flag(s) {unknown}; expected some of {list(KNOWN_FLAGS)}"
        )
    return words


@contextmanager
def flags_for_holders(flags: tuple[str, ...]) -> Iterator[None]:
    """Holders started inside the block get `flags` (`FLAGS_ENV`)."""
    was = os.environ.get(FLAGS_ENV)
    os.environ[FLAGS_ENV] = " ".join(flags)
    try:
        yield
    finally:
        if was is None:
            del os.environ[FLAGS_ENV]
        else:
            os.environ[FLAGS_ENV] = was


def _last_run(log: str) -> str:
    """The part of the holder's log written by the holder last started."""
    return log.rsplit(START_MARK, 1)[-1]


def parse_held_up(log: str) -> list[HeldUp]:
    """The held-up spells per generation the holder last started wrote to its log, each with
    the windows listed under its generation."""
    counts, windows = [], defaultdict(list)
    for line in _last_run(log).splitlines():
        if m := HELD_UP.match(line.strip()):
            counts.append(m)
        elif m := HELD_UP_SPELL.match(line.strip()):
            windows[int(m["gen"])].append((int(m["from"]), int(m["to"])))
    return [
        HeldUp(
            int(m["gen"]),
            int(m["spells"]),
            float(m["max_us"]) / 1000,
            float(m["sum_us"]) / 1000,
            tuple(windows[int(m["gen"])]),
        )
        for m in counts
    ]


def parse_release_counts(log: str) -> list[ReleaseCounts]:
    """The per-queue counts the holder last started wrote to its log (lines of other kinds,
    and of earlier holders, are skipped)."""
    out = []
    for line in _last_run(log).splitlines():
        m = COUNTS.match(line.strip())
        if m:
            out.append(
                ReleaseCounts(
                    int(m["queue"]),
                    m["link"],
                    m["direction"],
                    int(m["gen"]),
                    int(m["out"]),
                    int(m["late"]),
                    float(m["max_us"]) / 1000,
                    int(m["backup"]),
                    int(m["unstamped"]),
                    int(m["read_by_backup"]),
                    int(m["probe_stamped"]),
                    int(m["probe_unstamped"]),
                )  # fmt: skip
            )
    return out


def parse_clocks(text: str) -> dict[str, dict[str, int]]:
    """The holder's clocks file ("QNUM LINK DIRECTION T0_NS" a line) as link -> direction ->
    ns; lines of another shape are skipped."""
    out: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 4 and words[3].isdigit():
            out.setdefault(words[1], {})[words[2]] = int(words[3])
    return out


class HolderProcess:
    """One holder: its binary (None: this machine's build), `--tag`, folder and namespace on
    the runner's machine, and its own `flags` (e.g. `--stamp-probes`)."""

    def __init__(
        self,
        runner: SystemRunner,
        binary: str | None,
        tag: str,
        folder: str,
        netns: str | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        self.runner, self.given_binary, self.tag, self.netns = runner, binary, tag, netns
        self.flags = flags
        self.dir = PurePosixPath(folder)
        self.config, self.pid_file = self.dir / CONFIG_FILE, self.dir / "holder.pid"
        self.ack, self.out = self.dir / f"{CONFIG_FILE}.ack", self.dir / "holder.out"
        self.clock_file = self.dir / f"{CONFIG_FILE}.clocks"
        self.log, self.changes = self.dir / "holder.log", self.dir / CHANGES_FILE
        self.poll_s = POLL_REMOTE_S if runner.remote else POLL_LOCAL_S

    def _sh(self, script: str, *, query: bool = False, input: str | None = None) -> str:
        res = self.runner.run(["sh", "-c", script], netns=self.netns, query=query, input=input,
                              check=not query, error=ImpairmentError)  # fmt: skip
        return res.stdout if res.ok else ""

    def _q(self, path: PurePosixPath) -> str:
        return shlex.quote(str(path))

    def _read(self, path: PurePosixPath) -> str:
        if self.runner.dry_run:  # nothing was written, and the machine may not exist yet
            return ""
        return self._sh(f"cat {self._q(path)} 2>/dev/null || true", query=True)

    def pid(self) -> int | None:
        """The running holder's pid, or None."""
        if self.runner.dry_run:
            return None
        tag = shlex.quote(f"--tag {self.tag} ")
        text = self._sh(
            f"p=$(cat {self._q(self.pid_file)} 2>/dev/null) && tr '\\0' ' ' "
            f"< /proc/$p/cmdline 2>/dev/null | grep -qF -- {tag} && echo $p || true",
            query=True,
        ).strip()
        return int(text) if text.isdigit() else None

    def generation(self) -> int:
        """The generation of the config last written (0 for none)."""
        words = self._read(self.config).split()
        return int(words[1]) if len(words) > 1 and words[1].isdigit() else 0

    def load(self, config: str) -> int | None:
        """Run the holder on `config`: reload the running one, else start one; its pid (None in
        a dry run). ImpairmentError with the holder's log when it does not answer."""
        path = self._q(self.config)
        self._sh(f"mkdir -p {self._q(self.dir)} && rm -f {self._q(self.ack)} && cat > {path}.tmp "
                 f"&& mv {path}.tmp {path}", input=config)  # fmt: skip
        pid = self.pid()
        if pid is not None:
            self.runner.run(["kill", "-HUP", str(pid)], error=ImpairmentError)
            want = config.split()[1]
            if not self._wait(lambda: self._read(self.ack).split()[:1] == [want]):
                raise ImpairmentError(self._failure("reload (no answer)"))
            if self._read(self.ack).split()[1:] != ["ok"]:
                raise ImpairmentError(self._failure("reload"))
            return pid
        argv = [self.binary(), "--tag", self.tag, "--rt-prio", str(RT_PRIO), "--log",
                str(self.changes), *self.flags, *holder_flags(), str(self.config)]  # fmt: skip
        out, pid_file = self._q(self.out), self._q(self.pid_file)
        log = self._q(self.log)
        started = self._sh(
            f"rm -f {out}; echo {shlex.quote(START_MARK)} >> {log}; "
            f"setsid {shlex.join(argv)} > {out} 2>> {log} < /dev/null & "
            f"echo $! > {pid_file}; cat {pid_file}"
        ).strip()
        if self.runner.dry_run:
            return None
        if not self._wait(lambda: self._read(self.out).strip() == "ready"):
            self.stop()
            raise ImpairmentError(self._failure("start"))
        return int(started)

    def binary(self) -> str:
        """The holder's path on its machine (built here on first use when none was given)."""
        if self.given_binary:
            return self.given_binary
        return "tb-holder" if self.runner.dry_run else find_holder().argv[0]

    def _wait(self, ready: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready():
                return True
            time.sleep(self.poll_s)
        return False

    def _failure(self, what: str) -> str:
        where = f" in {self.netns}" if self.netns else ""
        tail = self._read(self.log)[-500:].strip()
        return f"packet holder {what} failed ({self.tag}{where}, {self.binary()}): {tail}"

    def stop(self) -> None:
        """Stop the holder (it releases what it holds) and wait until it is gone."""
        pid = self.pid()
        if pid is None:
            return
        self.runner.run(["kill", "-TERM", str(pid)], check=False, error=ImpairmentError)
        if not self.runner.dry_run and not self._wait(lambda: self.pid() is None):
            self.runner.run(["kill", "-KILL", str(pid)], check=False, error=ImpairmentError)
        self._sh(f"rm -f {self._q(self.pid_file)}")

    def release_counts(self) -> list[ReleaseCounts]:
        """Per queue and generation, what the holder last started released and how late
        (written at each reload for the generation it replaces, and when it stopped); the
        running generation's counts are not there yet."""
        return parse_release_counts(self._read(self.log))

    def held_up(self) -> list[HeldUp]:
        """Per generation, the spells in which neither releaser of the holder last started
        ran (written with the release counts)."""
        return parse_held_up(self._read(self.log))

    def clocks(self) -> dict[str, dict[str, int]]:
        """Link label -> direction -> the CLOCK_MONOTONIC ns (on the holder's machine) its
        phases count from, as the holder last loaded them; empty from a holder that does not
        write them."""
        return parse_clocks(self._read(self.clock_file))

    def link_changes(self) -> list[dict[str, Any]]:
        """Every profile change the holder applied (one dict per link direction and phase,
        `at` in Unix seconds), oldest first; empty when none was logged."""
        out = []
        for line in self._read(self.changes).splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ImpairmentError(
                        f"{self.tag}: {self.changes}: expected one JSON object a line, got "
                        f"{line[:80]!r}: {exc}"
                    ) from exc
        return out
