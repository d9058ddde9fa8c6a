"""One KV-cache budget shared by every session of the verification server.

The budget is in cached tokens (from `--kv-cache-tokens`, or `--kv-cache-mem`: a fraction of
the device's memory divided by the target's bytes per cached token). A request that would
take the pool over budget first expires sessions idle for longer than `idle_s`; if it still
does not fit, the policy decides (`--kv-policy`):
- `refuse`: ERROR `kv_pool_full` at once (the device falls back to its own drafts for that
  round and tries again later);
- `queue`: the request waits in a bounded FIFO (`KvQueue`) and is served, in order, as
  sessions end or expire; a full queue answers `kv_pool_full`, a wait past the queue's
  timeout `kv_queue_timeout`.
Sessions already in the pool always fit the tokens they hold, so one device cannot push
another out. A fault can fill the pool (`fill`, the server's SIGUSR1): ballast as large as the
budget, held by no session and never expired, so no session may open or grow until `drain`
(SIGUSR2) takes it out.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

Policy = Literal["refuse", "queue"]
Item = TypeVar("Item")


def memory_bytes(device: str) -> int:
    """Total memory of the torch device the target runs on (CUDA) or of the host (CPU)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def budget_tokens(fraction: float, device: str, bytes_per_token: int) -> int:
    """Tokens that fit in `fraction` of the device's memory."""
    if not 0 < fraction <= 1:
        raise ValueError(f"kv_cache_mem must be a fraction in (0, 1], got {fraction}")
    return int(fraction * memory_bytes(device)) // max(1, bytes_per_token)


@dataclass
class KvPool:
    """Cached-token accounting per session key, with idle expiry."""

    budget: int
    idle_s: float = 120.0
    tokens: dict[Hashable, int] = field(default_factory=dict)
    last_used: dict[Hashable, float] = field(default_factory=dict)
    ballast: int = 0  # tokens held by no session (a fault filling the pool)

    @property
    def used(self) -> int:
        return sum(self.tokens.values()) + self.ballast

    def fill(self) -> None:
        """Take the whole budget as ballast: nothing opens or grows until `drain`."""
        self.ballast = self.budget

    def drain(self) -> None:
        """Take the ballast out again."""
        self.ballast = 0

    def fits(self, key: Hashable, tokens: int) -> bool:
        """Would key holding `tokens` cached tokens stay within the budget?"""
        return self.used - self.tokens.get(key, 0) + tokens <= self.budget

    def hold(self, key: Hashable, tokens: int, now: float) -> None:
        """Record that key now holds `tokens` cached tokens."""
        self.tokens[key] = tokens
        self.last_used[key] = now

    def release(self, key: Hashable) -> None:
        self.tokens.pop(key, None)
        self.last_used.pop(key, None)

    def idle(self, now: float) -> list[Hashable]:
        """Keys unused for longer than idle_s, oldest first."""
        old = [k for k, t in self.last_used.items() if now - t > self.idle_s]
        return sorted(old, key=self.last_used.__getitem__)


@dataclass
class KvQueue(Generic[Item]):
    """Requests waiting for room in the pool: FIFO, at most `max_len`, each for `timeout_s`.

    One entry per key (the server keys by device): a newer request of the same key takes the
    place (and the position) of the one it supersedes, with a fresh wait clock, so a device
    that retries while it waits never falls back to the end of the line. Items taken by
    `take_all` and offered again keep their order and their clock.
    """

    max_len: int = 64
    timeout_s: float = 10.0
    entries: OrderedDict[Hashable, tuple[Item, float]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.max_len < 1 or self.timeout_s <= 0:
            raise ValueError(
                f"kv queue needs max_len >= 1 and timeout_s > 0, got {self.max_len}, "
                f"{self.timeout_s}"
            )

    def __len__(self) -> int:
        return len(self.entries)

    def offer(self, key: Hashable, item: Item, now: float) -> bool:
        """Queue item under key (replacing key's earlier item in place); False when full."""
        if key in self.entries:
            self.entries[key] = (item, now)
            return True
        if len(self.entries) >= self.max_len:
            return False
        self.entries[key] = (item, now)
        return True

    def take_all(self) -> list[tuple[Hashable, Item, float]]:
        """Every waiting (key, item, queued since), oldest first; the queue is left empty."""
        taken = [(k, item, t) for k, (item, t) in self.entries.items()]
        self.entries.clear()
        return taken

    def discard(self, key: Hashable) -> None:
        self.entries.pop(key, None)

    def timed_out(self, now: float) -> list[Item]:
        """Remove and return the items that waited longer than timeout_s."""
        old = [k for k, (_, t) in self.entries.items() if now - t > self.timeout_s]
        return [self.entries.pop(k)[0] for k in old]
