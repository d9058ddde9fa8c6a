"""The real executor of the hybrid loop: PyTorch (or any `Engine`) target and draft, greedy.

Every user's committed tokens (prompt and output so far) are the one truth; each model's cache
is synced to them with `TrackedSession.prepare`, so moving a user between AD and SD at a step
boundary loses nothing: the draft cache is built when a user enters SD and freed when it
leaves. AD steps feed every user's last token in one batched target forward; an SD round drafts
g tokens for all its users in g batched draft forwards, then verifies all of them in one
batched target forward with the acceptance rule of `agents.spec.acceptance`. Greedy output
equals the target's own greedy decoding in both modes (tests/test_balance_engine.py). A user
asks for a number of tokens (the length of the target's own answer, or a length its workload
stands for) and gets exactly that many: EOS does not end an answer early
(`agents.workloads.request.NO_STOP`), as serving benchmarks hold output lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.balance.modes import AD, SD
from agents.emulation import clock
from agents.engines.base import Engine
from agents.spec.acceptance import verify
from agents.spec.decoding import finish
from agents.spec.session import TrackedSession
from agents.workloads.request import NO_STOP


@dataclass
class _User:
    committed: list[int]
    prompt_len: int
    max_new: int
    target: TrackedSession
    draft: TrackedSession | None = None
    output: list[int] = field(default_factory=list)


class EngineExecutor:
    """Runs the loop's steps on a target and a draft engine, on the wall clock."""

    def __init__(self, target: Engine, draft: Engine, draft_len: int) -> None:
        self.target = target
        self.draft = draft
        self.draft_len = draft_len
        self.users: dict[int, _User] = {}
        self.outputs: dict[int, list[int]] = {}
        self._t0 = clock.monotonic()
        self.accepted = 0  # drafts the target accepted over every SD round
        self.rejections = 0  # SD rounds (per user) that rejected a draft

    def clock(self) -> float:
        return clock.monotonic() - self._t0

    def wait_until(self, t: float) -> None:
        left = t - self.clock()
        if left > 0:
            clock.sleep(left)

    def submit(self, uid: int, prompt: Sequence[int], max_new: int) -> None:
        """Register a user's prompt; its caches are built when the loop starts it."""
        self.users[uid] = _User(list(prompt), len(prompt), max_new, TrackedSession(self.target))

    def start(self, uid: int, mode: int) -> None:
        """Bring the caches of uid's mode up to its committed tokens (all but the last)."""
        user = self.users[uid]
        _prefill(user.target, user.committed)
        if mode == SD:
            if user.draft is None:
                user.draft = TrackedSession(self.draft)
            _prefill(user.draft, user.committed)
        elif user.draft is not None:  # left SD: free the draft cache
            user.draft.close()
            user.draft = None

    def step(self, mode: int, uids: list[int]) -> tuple[dict[int, int], set[int]]:
        new = self._ad_step(uids) if mode == AD else self._sd_round(uids)
        got, done = {}, set()
        for uid, tokens in new.items():
            user = self.users[uid]
            before = len(user.output)
            user.output, over = finish(user.output + tokens, NO_STOP, user.max_new)
            user.committed = user.committed[: user.prompt_len] + user.output
            got[uid] = len(user.output) - before
            if over:
                done.add(uid)
        return got, done

    def _ad_step(self, uids: list[int]) -> dict[int, list[int]]:
        feeds = {uid: self.users[uid].target.prepare(self.users[uid].committed) for uid in uids}
        logits = _score(self.target, {self.users[u].target: f for u, f in feeds.items()})
        return {uid: [int(np.argmax(logits[self.users[uid].target][-1]))] for uid in uids}

    def _sd_round(self, uids: list[int]) -> dict[int, list[int]]:
        users = [self.users[u] for u in uids]
        feeds = {u.draft: u.draft.prepare(u.committed) for u in users}
        drafts: dict[int, list[int]] = {id(u): [] for u in users}
        for _ in range(self.draft_len):
            logits = _score(self.draft, feeds)
            feeds = {}
            for u in users:
                token = int(np.argmax(logits[u.draft][-1]))
                drafts[id(u)].append(token)
                feeds[u.draft] = [token]
        verify_feeds, offsets = {}, {}
        for u in users:
            feed = u.target.prepare(u.committed)
            offsets[id(u)] = len(feed) - 1
            verify_feeds[u.target] = feed + drafts[id(u)]
        logits = _score(self.target, verify_feeds)
        out = {}
        for uid, u in zip(uids, users):
            rows = logits[u.target][offsets[id(u)] :]
            verdict = verify(rows, drafts[id(u)])
            self.accepted += verdict.accepted
            self.rejections += verdict.accepted < len(drafts[id(u)])
            u.target.truncate(len(u.committed) + verdict.accepted)
            out[uid] = verdict.emitted(drafts[id(u)])
        return out

    def rewind(self, uid: int, output_len: int) -> None:
        """Forget uid's output past its first output_len tokens; its caches follow on the
        next step (`TrackedSession.prepare` rolls them back)."""
        user = self.users[uid]
        del user.output[output_len:]
        user.committed = user.committed[: user.prompt_len] + user.output

    def stop(self, uid: int) -> None:
        user = self.users.pop(uid)
        self.outputs[uid] = user.output
        user.target.close()
        if user.draft is not None:
            user.draft.close()

    def kv_tokens(self) -> tuple[int, int]:
        """Tokens held in the (target, draft) caches of all users now."""
        t = sum(len(u.target.tokens) for u in self.users.values())
        d = sum(len(u.draft.tokens) for u in self.users.values() if u.draft is not None)
        return t, d


def _prefill(session: TrackedSession, committed: list[int]) -> None:
    feed = session.prepare(committed)[:-1]
    if feed:
        session.score(feed)


def _score(
    engine: Engine, feeds: dict[TrackedSession, list[int]]
) -> dict[TrackedSession, np.ndarray]:
    """One batched forward over several tracked sessions."""
    by_sid = engine.score_batch({s.sid: f for s, f in feeds.items()})
    for s, f in feeds.items():
        s.record_scored(f)
    return {s: by_sid[s.sid] for s in feeds}
