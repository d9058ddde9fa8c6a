"""Pacing: every forward of an engine takes the modelled time of the hardware it stands for.

`PacedEngine` wraps an engine. Each `score` / `score_batch` runs the real computation (so the
tokens, the acceptance and the target-equals-output guarantee stay real), then sleeps out the
rest of the modelled time (`agents.emulation.stepcost`) of that forward on the emulated
hardware, dilated by the clock's factor. A forward whose real computation took longer than
its budget is *behind*: the emulated host was slower than the machine it stands for. Behind
forwards are counted; a condition with too many is unfaithful (the controller decides).

With `pace` off (a physical lab) nothing sleeps: the model's prediction is kept beside each
measured forward instead, which is how the catalogue gets calibrated on hardware.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agents.emulation import clock
from agents.emulation.stepcost import Batch, Hardware, ModelShape, step_seconds
from agents.engines.base import Engine

PR_SET_TIMERSLACK = 29


def tighten_timer_slack() -> None:
    """Ask the kernel to wake this process's sleeps within 1 us of their time (the default
    slack is 50 us): a paced forward's error is mostly how late its sleep ends."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the default slack stays
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)


@dataclass(frozen=True)
class Forward:
    """One forward as paced: its shape, modelled time and what it really took (emulated s)."""

    sequences: int
    new_tokens: int
    modelled_s: float  # the hardware's time for it (emulated)
    computed_s: float  # the real computation, in emulated seconds
    took_s: float  # the whole call, sleep included, in emulated seconds
    behind: bool


@dataclass
class PacingStats:
    """What one paced engine did: forwards, behind forwards, and the pacing error."""

    forwards: int = 0
    behind: int = 0
    modelled_s: float = 0.0
    computed_s: float = 0.0
    errors_ms: list[float] = field(default_factory=list)  # real: call time - budget, on time
    shares: list[float] = field(default_factory=list)  # computed / modelled per forward

    def add(self, fwd: Forward, error_real_s: float, forwards: int = 1) -> None:
        """Count a paced call of `forwards` model forwards (all behind if it was)."""
        self.forwards += forwards
        self.behind += forwards if fwd.behind else 0
        self.modelled_s += fwd.modelled_s
        self.computed_s += fwd.computed_s
        if not fwd.behind:
            self.errors_ms.append(error_real_s * 1000)
        if fwd.modelled_s > 0:
            self.shares.append(fwd.computed_s / fwd.modelled_s)

    def summary(self) -> dict[str, Any]:
        """Counts, totals, and percentiles of the error (real ms) and the computed share."""
        errs = np.array(self.errors_ms) if self.errors_ms else None
        shares = np.array(self.shares) if self.shares else None
        return {
            "forwards": self.forwards,
            "behind": self.behind,
            "modelled_s": self.modelled_s,
            "computed_s": self.computed_s,
            "error_ms_p50": float(np.median(errs)) if errs is not None else None,
            "error_ms_p99": float(np.percentile(errs, 99)) if errs is not None else None,
            "computed_share_p50": float(np.median(shares)) if shares is not None else None,
            "computed_share_max": float(shares.max()) if shares is not None else None,
        }


class PacedEngine(Engine):
    """An engine whose forwards take `hardware`'s modelled time for `model` (module docstring).

    Anything else is the wrapped engine's (`__getattr__`), so callers see the same engine.
    """

    def __init__(
        self, inner: Engine, hardware: Hardware, model: ModelShape, pace: bool = True
    ) -> None:
        self.inner = inner
        self.hardware = hardware
        self.shape = model
        self.pace = pace
        self.vocab_size = inner.vocab_size
        self.bos_id = inner.bos_id
        self.eos_id = inner.eos_id
        self.stats = PacingStats()
        self.last: Forward | None = None
        if hasattr(inner, "draft_greedy"):  # the fast path callers look for, paced too
            self.draft_greedy = self._draft_greedy
        if pace:
            tighten_timer_slack()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    @property
    def tokenizer_hash(self) -> str:
        return self.inner.tokenizer_hash

    def describe(self) -> str:
        verb = "paced as" if self.pace else "predicted as"
        return f"{self.inner.describe()} {verb} {self.shape.name} on {self.hardware.name}"

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.inner.tokenize(text, add_bos)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.inner.detokenize(ids)

    def open(self) -> int:
        return self.inner.open()

    def length(self, sid: int) -> int:
        return self.inner.length(sid)

    def rollback(self, sid: int, n: int) -> None:
        self.inner.rollback(sid, n)

    def close(self, sid: int) -> None:
        self.inner.close(sid)

    def warm_up(self, max_batch: int = 2) -> None:
        """The wrapped engine's warm-up, unpaced and uncounted."""
        self.inner.warm_up(max_batch)

    def modelled_s(self, batch: Batch) -> float:
        """The emulated hardware's time for a forward of this shape (emulated seconds)."""
        return step_seconds(self.hardware, self.shape, batch)

    def score(self, sid: int, tokens: Sequence[int]) -> np.ndarray:
        shape = [(len(tokens), self.inner.length(sid))]
        return self._forward(shape, lambda: self.inner.score(sid, tokens))

    def score_batch(self, requests: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        shape = [(len(toks), self.inner.length(sid)) for sid, toks in requests.items()]
        return self._forward(shape, lambda: self.inner.score_batch(requests))

    def _draft_greedy(
        self,
        sid: int,
        tokens: Sequence[int],
        k: int,
        stop_at_eos: bool = True,
        confidences: list[float] | None = None,
        min_confidence: float = 0.0,
    ) -> list[int]:
        """The wrapped engine's greedy drafting loop, paced as the forwards it makes: one over
        `tokens`, then one per draft fed back (all but the last draft)."""
        context = self.inner.length(sid)
        drafted: list[int] = []

        def work() -> list[int]:
            drafted[:] = self.inner.draft_greedy(
                sid, tokens, k, stop_at_eos, confidences, min_confidence
            )
            return drafted

        def shapes() -> list[Batch]:
            fed = context + len(tokens)
            return [[(len(tokens), context)]] + [[(1, fed + i)] for i in range(len(drafted) - 1)]

        return self._forward(None, work, shapes)

    def _forward(self, shape: Batch | None, work: Any, shapes: Any = None) -> Any:
        """Run `work` (the real forwards), then wait out the rest of their modelled time:
        `shape`'s, or (for several forwards in one call) the sum over `shapes()`, known
        once the work is done."""
        start = time.perf_counter()
        out = work()
        computed = time.perf_counter() - start
        forwards = [shape] if shape is not None else shapes()
        modelled = sum(self.modelled_s(s) for s in forwards)
        shape = [seq for s in forwards for seq in s]
        budget = clock.to_real(modelled)
        behind = computed > budget
        if self.pace and not behind:
            left = start + budget - time.perf_counter()
            if left > 0:
                time.sleep(left)
        took = time.perf_counter() - start
        fwd = Forward(
            sequences=len(shape),
            new_tokens=sum(n for n, _ in shape),
            modelled_s=modelled,
            computed_s=clock.to_emulated(computed),
            took_s=clock.to_emulated(took),
            behind=behind,
        )
        self.last = fwd
        self.stats.add(fwd, took - budget, len(forwards))
        return out


def modelled_total_s(engine: Engine) -> float | None:
    """Modelled seconds of every forward so far, for a paced engine (None for any other): the
    difference over a span is what the emulated hardware would have taken for it."""
    return engine.stats.modelled_s if isinstance(engine, PacedEngine) else None


def pacing_rows(engines: Mapping[str, Engine]) -> list[dict[str, Any]]:
    """One `pacing` record per paced engine, by role (the agents write them when they stop)."""
    return [
        {
            "role": role,
            "hardware": e.hardware.name,
            "model": e.shape.name,
            "paced": e.pace,
            **e.stats.summary(),
        }
        for role, e in engines.items()
        if isinstance(e, PacedEngine)
    ]


def last_modelled_ms(engine: Engine) -> float | None:
    """The modelled time of a paced engine's last forward, in ms (None for any other)."""
    if isinstance(engine, PacedEngine) and engine.last is not None:
        return engine.last.modelled_s * 1000
    return None
