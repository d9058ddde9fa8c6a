"""One KV-cache budget shared by every session of the verification server.

The budget is in cached tokens (from `--kv-cache-tokens`, or `--kv-cache-mem`: a fraction of
the device's memory divided by the target's bytes per cached token). A request that would
take the pool over budget first expires sessions idle for longer than `idle_s`; if it still
does not fit it is refused with ERROR `kv_pool_full` (the device falls back to its own
drafts for that round and tries again later). Sessions already in the pool always fit the
tokens they hold, so one device cannot push another out.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from dataclasses import dataclass, field


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

    @property
    def used(self) -> int:
        return sum(self.tokens.values())

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
