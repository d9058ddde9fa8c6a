"""Measure a host's drafting rate: greedy llama.cpp drafting of a GGUF model, run on the host
and paced to the hardware it stands for.

The probe runs over SSH like an agent and uses the device agent's own engine and pacing
(`agents.engines.llama_cpp`, `agents.emulation`), nothing from `testbed/`: with the host's
emulation file it drafts as the agent would, each forward taking the modelled time of the
draft model on the host's hardware. Each round opens a session, prefills a short prompt and
drafts `tokens` tokens greedily; rounds repeat for `seconds` of emulated time, and the rate
is drafted tokens over that time. It also reports the forwards behind their modelled time.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from testbed.core.errors import AgentError
from testbed.hosts.control import HostControl

PROBE = """
import json, sys
from agents.emulation import clock
from agents.emulation.pacing import pacing_rows
from agents.emulation.settings import load_emulation
from agents.engines.llama_cpp import LlamaCppEngine
model, emulation = sys.argv[1], sys.argv[2]
tokens, seconds, threads = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
emu = load_emulation(emulation)
emu.start()
eng = emu.engine(LlamaCppEngine(model, n_ctx=tokens + 64, n_threads=threads), "draft")
prompt = eng.tokenize("Q: 17 + 25 = ?")
drafted = 0
w0 = clock.monotonic()
while clock.monotonic() - w0 < seconds:
    sid = eng.open()
    first = eng.draft_greedy(sid, prompt, 1)
    drafted += len(eng.draft_greedy(sid, first, tokens, stop_at_eos=False))
    eng.close(sid)
rows = pacing_rows({"draft": eng})
print(json.dumps({"tokens": drafted, "seconds": clock.monotonic() - w0,
                  "pacing": rows[0] if rows else None}))
"""


class DraftingRate(BaseModel):
    """Drafted tokens per second on one host (emulated time), and how its pacing went."""

    host: str
    model: str
    threads: int
    tokens: int
    seconds: float
    pacing: dict[str, Any] | None = None  # agents.emulation.pacing_rows, if paced

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def record(self) -> dict[str, object]:
        """A flat row for the run's records."""
        return self.model_dump() | {"tokens_per_s": self.tokens_per_s}


def measure_drafting_rate(
    control: HostControl,
    host: str,
    model: Path,
    emulation: str,
    *,
    tokens: int = 64,
    seconds: float = 2.0,
    threads: int = 1,
    timeout: float = 300.0,
) -> DraftingRate | None:
    """Draft rounds of `tokens` tokens on `host` for `seconds`, paced by the host's emulation
    file `emulation` (a path on the host); None in a dry run (the command is printed)."""
    h = control.host(host)
    argv = [h.python, "-c", PROBE, str(model), emulation, str(tokens), str(seconds), str(threads)]
    res = control.run(host, shlex.join(argv), timeout=timeout)
    if control.dry_run:
        return None
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
        return DraftingRate(host=host, model=str(model), threads=threads, **out)
    except (IndexError, ValueError, ValidationError) as exc:
        raise AgentError(f"{host}: drafting-rate probe gave no result: {res.stdout!r}") from exc
