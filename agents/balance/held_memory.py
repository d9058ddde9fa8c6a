"""The engine executor that notes the most memory its caches and models held at once: the
BALANCE server's measure of peak memory against its budget (in the bytes of the models it
stands for: the cost model's weights, KV bytes per token and logits rows)."""

from __future__ import annotations

from agents.balance.costmodel import CostModel
from agents.balance.engine import EngineExecutor
from agents.engines.base import Engine


class MeasuredExecutor(EngineExecutor):
    """The engine executor, noting the most memory its caches and models held at once."""

    def __init__(self, target: Engine, draft: Engine, cost: CostModel) -> None:
        super().__init__(target, draft, cost.draft_len)
        self.cost = cost
        self.peak_held_bytes = float(cost.target.weights_bytes)
        self.serving: dict[int, int] = {}  # uid: mode, of the users started and not stopped

    def held_bytes(self) -> float:
        """Weights resident now (the draft's while any user drafts), the KV bytes of the
        tokens each model's caches hold now, and each user's rows of its mode's step logits."""
        t_tokens, d_tokens = self.kv_tokens()
        c = self.cost
        held = c.target.weights_bytes + t_tokens * c.target.kv_bytes_per_token
        if any(u.draft is not None for u in self.users.values()):
            held += c.draft.weights_bytes
        held += sum(c.workspace_bytes(mode) for mode in self.serving.values())
        return held + d_tokens * c.draft.kv_bytes_per_token

    def start(self, uid: int, mode: int) -> None:
        super().start(uid, mode)
        self.serving[uid] = mode
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes())

    def step(self, mode: int, uids: list[int]) -> tuple[dict[int, int], set[int]]:
        out = super().step(mode, uids)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes())
        return out

    def stop(self, uid: int) -> None:
        super().stop(uid)
        self.serving.pop(uid, None)
