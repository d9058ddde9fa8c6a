"""Measure a host's drafting rate: greedy llama.cpp drafting of a GGUF model, run on the host.

The probe runs over SSH like an agent (so it runs under the host's class limits) and uses the
device agent's own engine (`agents.engines.llama_cpp`), nothing from `testbed/`: each round
opens a session, prefills a short prompt and drafts `tokens` tokens greedily; rounds repeat
for `seconds` (many CPU-quota periods), and the rate is drafted tokens over that whole time,
so time the quota holds the process back counts wherever it falls.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from testbed.errors import AgentError
from testbed.hosts.control import HostControl

PROBE = """
import json, sys, time
from agents.engines.llama_cpp import LlamaCppEngine
model = sys.argv[1]
tokens, seconds, threads = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
eng = LlamaCppEngine(model, n_ctx=tokens + 64, n_threads=threads)
prompt = eng.tokenize("Q: 17 + 25 = ?")
drafted = 0
w0, c0 = time.perf_counter(), time.process_time()
while time.perf_counter() - w0 < seconds:
    sid = eng.open()
    first = eng.draft_greedy(sid, prompt, 1)
    drafted += len(eng.draft_greedy(sid, first, tokens, stop_at_eos=False))
    eng.close(sid)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
print(json.dumps({"tokens": drafted, "seconds": wall, "cpu_seconds": cpu}))
"""


class DraftingRate(BaseModel):
    """Drafted tokens per second on one host (wall clock), and the CPU time it took."""

    host: str
    model: str
    threads: int
    tokens: int
    seconds: float
    cpu_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_share(self) -> float:
        """CPU seconds per wall second while drafting (about the quota when it binds)."""
        return self.cpu_seconds / self.seconds

    def record(self) -> dict[str, object]:
        """A flat row for the run's records."""
        return self.model_dump() | {"tokens_per_s": self.tokens_per_s, "cpu_share": self.cpu_share}


def measure_drafting_rate(
    control: HostControl,
    host: str,
    model: Path,
    *,
    tokens: int = 64,
    seconds: float = 2.0,
    threads: int = 1,
    timeout: float = 300.0,
) -> DraftingRate | None:
    """Draft rounds of `tokens` tokens on `host` for `seconds`; None in a dry run (the command
    is printed)."""
    h = control.host(host)
    argv = [h.python, "-c", PROBE, str(model), str(tokens), str(seconds), str(threads)]
    res = control.run(host, shlex.join(argv), timeout=timeout)
    if control.dry_run:
        return None
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
        return DraftingRate(host=host, model=str(model), threads=threads, **out)
    except (IndexError, ValueError, ValidationError) as exc:
        raise AgentError(f"{host}: drafting-rate probe gave no result: {res.stdout!r}") from exc


def measure_class_rates(
    control: HostControl, hosts: list[tuple[str, str]], model: Path, **probe: Any
) -> dict[str, DraftingRate | None]:
    """Drafting rate of one host per class (`hosts` is (host, class) pairs; the first host of
    a class is measured), all classes at the same time: load from elsewhere on the machine then
    slows every class alike, and the CPU weights (proportional to the quotas) keep their ratio."""
    first: dict[str, str] = {}
    for host, cls in hosts:
        first.setdefault(cls, host)
    rates = control.parallel(
        lambda h: measure_drafting_rate(control, h.name, model, **probe),
        list(first.values()),
        what="drafting-rate probe",
    )
    return {cls: rates[host] for cls, host in first.items()}
