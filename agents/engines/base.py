"""The small engine interface every agent uses.

A session is a token sequence whose keys/values sit in the engine's cache. `score` appends
tokens to a session and returns, for each appended token, the logits of the *next* token;
`rollback` truncates the session (and its cache) to a length. Speculative decoding keeps the
invariant that the cache holds all committed tokens but the last, so every round feeds
`[last_committed] + drafts` and rolls back what was rejected.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

import numpy as np


class TokenizerMismatchError(RuntimeError):
    """Draft and target (or device and server) use different tokenizers."""


def tokenizer_fingerprint(pieces: Sequence[bytes], bos_id: int, eos_id: int) -> str:
    """sha256 over every token id's byte string and the BOS/EOS ids.

    Both engines compute it from their own view of the vocabulary, so one tokenizer saved as
    an HF folder and as GGUF gets one fingerprint, and any difference in the vocabulary
    changes it.
    """
    h = hashlib.sha256()
    h.update(f"bos={bos_id};eos={eos_id};n={len(pieces)};".encode())
    for piece in pieces:
        h.update(len(piece).to_bytes(4, "little"))
        h.update(piece)
    return h.hexdigest()


def check_same_tokenizer(a: Engine, b: Engine) -> None:
    """Raise TokenizerMismatchError naming both fingerprints if a and b differ."""
    ha, hb = a.tokenizer_hash, b.tokenizer_hash
    if ha != hb:
        raise TokenizerMismatchError(
            f"tokenizer mismatch: {a.describe()} has tokenizer {ha[:16]}, "
            f"{b.describe()} has {hb[:16]}; draft and target must share one tokenizer"
        )


class Engine(ABC):
    """A causal language model with per-session KV caches."""

    vocab_size: int
    bos_id: int
    eos_id: int

    @property
    @abstractmethod
    def tokenizer_hash(self) -> str:
        """`tokenizer_fingerprint` of this engine's vocabulary."""

    @abstractmethod
    def describe(self) -> str:
        """Short human-readable name: engine kind and model path."""

    @abstractmethod
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of text (special-token text is not parsed as special)."""

    @abstractmethod
    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens left out."""

    @abstractmethod
    def open(self) -> int:
        """Start an empty session and return its id."""

    @abstractmethod
    def score(self, sid: int, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens to session sid; return float32 logits of shape (len(tokens), vocab).

        Row i holds the next-token logits after the session's tokens up to tokens[i].
        """

    def score_batch(self, requests: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """`score` for several sessions; engines that can batch override this."""
        return {sid: self.score(sid, toks) for sid, toks in requests.items()}

    @abstractmethod
    def length(self, sid: int) -> int:
        """Number of tokens in session sid."""

    @abstractmethod
    def rollback(self, sid: int, n: int) -> None:
        """Keep the first n tokens of session sid (0 <= n <= length)."""

    @abstractmethod
    def close(self, sid: int) -> None:
        """Free session sid and its cache."""

    def warm_up(self, max_batch: int = 2) -> None:
        """Take once the paths first requests take (prefills, then batched steps) for batches
        of 1, 2, 4, ... up to `max_batch` sessions, so lazy initialisation (a first forward of
        a new shape is several times slower in PyTorch) does not land on a verification: a
        device learns its first timeout from a HELLO, which does no compute, and an emulated
        host's forward must not overrun the hardware it stands for on a first."""
        ids = (self.tokenize("warm up the engine for the batches it will run") * 4)[:32] or [0]
        batch = 1
        while True:
            sids = [self.open() for _ in range(min(batch, max_batch))]
            try:
                self.score_batch({sid: ids for sid in sids})
                self.score_batch({sid: ids[:1] for sid in sids})
                self.score_batch({sid: ids[:5] for sid in sids})
            finally:
                for sid in sids:
                    self.close(sid)
            if batch >= max_batch:
                return
            batch *= 2
