"""llama.cpp engine (llama-cpp-python over a GGUF file): what edge devices run.

Design:
- `llama_cpp.Llama` loads the model, owns the context and tokenizes; decoding goes through the
  low-level API (`llama_decode` on a batch this engine owns) so that a scored batch returns the
  logits of every position without `logits_all=True`, whose `n_ctx x n_vocab` score buffer would
  not fit a real vocabulary on a Raspberry Pi.
- The context holds one KV sequence. Each session keeps its token list; the *active* session's
  tokens are exactly what the KV cache holds. Scoring another session re-activates it: the KV
  cache is truncated to the longest common prefix with that session and the rest is decoded
  again, so any number of sessions stay correct and one active conversation pays nothing.
- `rollback` truncates the token list and, for the active session, removes the KV entries past
  the new length (`llama_memory_seq_rm`), which is what `Llama.eval` does before decoding.
- The KV cache is f32 by default (`type_k = type_v = 0`): with the default f16 cache logits
  differ from the PyTorch engine by ~1e-2 instead of ~1e-5.
- `draft_greedy` is the device's hot loop: one-token decodes on a batch whose fixed fields are
  set once, and an argmax over a view of llama.cpp's logits buffer (no copy per token).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from agents.engines.base import Engine, tokenizer_fingerprint

GGML_TYPE_F32 = 0
DEFAULT_MAX_CTX = 4096  # n_ctx=None: the model's training context, capped here

# llama-cpp-python routes llama.cpp's log through this logger; keep loading chatter quiet
_LOG = logging.getLogger("llama-cpp-python")
if _LOG.level == logging.NOTSET:
    _LOG.setLevel(logging.ERROR)


def _token_bytes(vocab: llama_cpp.llama_vocab_p, token: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, -n, 0, special)
    return buf.raw[:n]


def _meta(model: llama_cpp.llama_model_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, 256)
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None


@contextlib.contextmanager
def _vocab_only_model(path: Path) -> Iterator[llama_cpp.llama_model_p]:
    """The model's metadata and vocabulary alone (no weights, no context)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GGUF model file not found")
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ValueError(f"{path}: llama.cpp could not read this file as GGUF")
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


@dataclass(frozen=True)
class GgufVocab:
    """A GGUF model's vocabulary as llama.cpp reads it."""

    pieces: list[bytes]
    bos_id: int
    eos_id: int
    context_length: int  # 0 when the file does not say

    @property
    def tokenizer_hash(self) -> str:
        return tokenizer_fingerprint(self.pieces, self.bos_id, self.eos_id)


def read_gguf_vocab(path: str | Path, pieces: bool = True) -> GgufVocab:
    """Read a GGUF file's vocabulary (every token's bytes if pieces) without its weights."""
    with _vocab_only_model(Path(path)) as model:
        vocab = llama_cpp.llama_model_get_vocab(model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        arch = _meta(model, "general.architecture") or ""
        ctx = _meta(model, f"{arch}.context_length") or "0"
        return GgufVocab(
            [_token_bytes(vocab, i, True) for i in range(n)] if pieces else [],
            llama_cpp.llama_vocab_bos(vocab),
            llama_cpp.llama_vocab_eos(vocab),
            int(ctx) if ctx.isdigit() else 0,
        )


class LlamaCppEngine(Engine):
    """An `Engine` over a GGUF model, CPU-only by default."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int | None = None,
        n_batch: int = 512,
        n_threads: int | None = None,
        kv_f32: bool = True,
        n_gpu_layers: int = 0,
        verbose: bool = False,
    ) -> None:
        """Load model_path.

        n_ctx=None uses the model's training context (at most DEFAULT_MAX_CTX tokens);
        n_threads=None uses every core (`os.cpu_count()`).
        """
        self.path = Path(model_path)
        if n_ctx is None:
            trained = read_gguf_vocab(self.path, pieces=False).context_length
            n_ctx = min(trained, DEFAULT_MAX_CTX) if trained > 0 else DEFAULT_MAX_CTX
        if n_ctx < 1 or n_batch < 1:
            raise ValueError(f"n_ctx and n_batch must be >= 1, got {n_ctx} and {n_batch}")
        n_batch = min(n_batch, n_ctx)
        threads = n_threads if n_threads is not None else (os.cpu_count() or 1)
        kv = {"type_k": GGML_TYPE_F32, "type_v": GGML_TYPE_F32} if kv_f32 else {}
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(self.path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_ubatch=n_batch,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=n_gpu_layers,
                logits_all=False,
                verbose=verbose,
                **kv,
            )
        except ValueError as e:
            raise ValueError(f"{self.path}: llama.cpp could not load this GGUF file ({e})") from e
        self.n_ctx = self._llm.n_ctx()
        self.n_batch = n_batch
        self.n_threads = threads
        self.vocab_size = self._llm.n_vocab()
        self.bos_id = self._llm.token_bos()
        self.eos_id = self._llm.token_eos()
        self._ctx = self._llm.ctx
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        for i in range(n_batch):  # every token of every batch belongs to sequence 0
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._sessions: dict[int, list[int]] = {}
        self._next_sid = 0
        self._active: int | None = None
        self._kv_tokens: list[int] = []  # the tokens whose keys/values the context holds
        self._hash: str | None = None

    # --- tokenizer -------------------------------------------------------------------------

    @property
    def tokenizer_hash(self) -> str:
        if self._hash is None:
            pieces = [self.token_bytes(i, special=True) for i in range(self.vocab_size)]
            self._hash = tokenizer_fingerprint(pieces, self.bos_id, self.eos_id)
        return self._hash

    def describe(self) -> str:
        return f"llama.cpp:{self.path}"

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes of one token (special tokens render as text only if special)."""
        return _token_bytes(self._vocab, token, special)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) if text else []
        return [self.bos_id, *ids] if add_bos else list(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        data = b"".join(self.token_bytes(int(t), special=False) for t in ids)
        return data.decode("utf-8", errors="replace")

    # --- sessions --------------------------------------------------------------------------

    def open(self) -> int:
        sid = self._next_sid
        self._next_sid += 1
        self._sessions[sid] = []
        return sid

    def _tokens(self, sid: int) -> list[int]:
        try:
            return self._sessions[sid]
        except KeyError:
            raise KeyError(f"{self.describe()}: unknown session {sid}") from None

    def length(self, sid: int) -> int:
        return len(self._tokens(sid))

    def rollback(self, sid: int, n: int) -> None:
        toks = self._tokens(sid)
        if not 0 <= n <= len(toks):
            raise ValueError(f"rollback: n must be in [0, {len(toks)}] for session {sid}, got {n}")
        del toks[n:]
        if self._active == sid:
            self._truncate_kv(n)

    def close(self, sid: int) -> None:
        self._tokens(sid)
        del self._sessions[sid]
        if self._active == sid:
            self._active = None  # the KV cache keeps its tokens: a later prefix can reuse them

    def unload(self) -> None:
        """Free the batch and the model; the engine cannot be used afterwards."""
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_llm", None) is not None:
            self._llm.close()
            self._llm = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown may have torn modules down
            self.unload()

    def __enter__(self) -> LlamaCppEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    # --- scoring ---------------------------------------------------------------------------

    def score(self, sid: int, tokens: Sequence[int]) -> np.ndarray:
        toks = self._prepare(sid, tokens)
        out = np.empty((len(tokens), self.vocab_size), dtype=np.float32)
        pos = len(toks)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            self._decode(chunk, pos + start, all_logits=True)
            ptr = llama_cpp.llama_get_logits(self._ctx)
            out[start : start + len(chunk)] = np.ctypeslib.as_array(
                ptr, shape=(len(chunk), self.vocab_size)
            )
        self._commit(toks, tokens)
        return out

    def draft_greedy(
        self,
        sid: int,
        tokens: Sequence[int],
        k: int,
        stop_at_eos: bool = True,
        confidences: list[float] | None = None,
        min_confidence: float = 0.0,
    ) -> list[int]:
        """Append tokens, then draft up to k greedy tokens (stopping after EOS if stop_at_eos).

        Every draft but the last is fed back, so afterwards the session holds tokens plus
        drafts[:-1]: the last draft, like the last committed token, is not yet in the cache.
        Given a `confidences` list, each draft's probability under the draft model is
        appended to it, and drafting stops after a draft whose probability is below
        min_confidence.
        """
        if k < 1:
            raise ValueError(f"draft_greedy: k must be >= 1, got {k}")
        if not tokens:
            raise ValueError("draft_greedy: give at least one token to feed (the last committed)")
        toks = self._prepare(sid, tokens)
        if len(toks) + len(tokens) + k - 1 > self.n_ctx:
            raise ValueError(
                f"{self.describe()}: session {sid} would exceed n_ctx={self.n_ctx} "
                f"({len(toks)} + {len(tokens)} tokens + {k - 1} drafts)"
            )
        pos = len(toks)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            self._decode(chunk, pos + start, all_logits=False)
        self._commit(toks, tokens)
        pos += len(tokens)
        ctx, vocab_size, batch = self._ctx, self.vocab_size, self._batch
        eos = self.eos_id if stop_at_eos else -1
        get_logits, as_array, decode = (
            llama_cpp.llama_get_logits_ith,
            np.ctypeslib.as_array,
            llama_cpp.llama_decode,
        )
        drafts: list[int] = []
        while True:
            row = as_array(get_logits(ctx, -1), shape=(vocab_size,))
            t = int(row.argmax())
            drafts.append(t)
            if confidences is not None:
                confidences.append(float(1.0 / np.exp(row - row[t]).sum()))
                if confidences[-1] < min_confidence:
                    return drafts
            if len(drafts) == k or t == eos:
                return drafts
            batch.n_tokens = 1
            batch.token[0] = t
            batch.pos[0] = pos
            batch.logits[0] = 1
            rc = decode(ctx, batch)
            if rc != 0:
                self._decode_failed(rc)
            toks.append(t)
            self._kv_tokens.append(t)
            pos += 1

    # --- internals -------------------------------------------------------------------------

    def _prepare(self, sid: int, tokens: Sequence[int]) -> list[int]:
        """Make sid the active session (KV cache == its tokens) and check the new tokens."""
        toks = self._tokens(sid)
        if len(toks) + len(tokens) > self.n_ctx:
            raise ValueError(
                f"{self.describe()}: session {sid} would exceed n_ctx={self.n_ctx} "
                f"({len(toks)} tokens + {len(tokens)} new)"
            )
        bad = [t for t in tokens if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        if self._active != sid:
            self._activate(sid, toks)
        return toks

    def _activate(self, sid: int, toks: list[int]) -> None:
        kv = self._kv_tokens
        common = 0
        for a, b in zip(kv, toks):
            if a != b:
                break
            common += 1
        self._truncate_kv(common)
        self._active = None
        rest = toks[common:]
        for start in range(0, len(rest), self.n_batch):
            chunk = rest[start : start + self.n_batch]
            self._decode(chunk, common + start, all_logits=False)
            self._kv_tokens.extend(chunk)
        self._active = sid

    def _truncate_kv(self, n: int) -> None:
        if n < len(self._kv_tokens):
            llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1)
            del self._kv_tokens[n:]

    def _decode(self, tokens: Sequence[int], pos: int, all_logits: bool) -> None:
        batch = self._batch
        n = len(tokens)
        batch.n_tokens = n
        for i, t in enumerate(tokens):
            batch.token[i] = int(t)
            batch.pos[i] = pos + i
            batch.logits[i] = all_logits
        batch.logits[n - 1] = 1
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            self._decode_failed(rc)

    def _decode_failed(self, rc: int) -> None:
        # a failed decode may leave part of its batch in the cache: keep only known tokens
        llama_cpp.llama_memory_seq_rm(self._memory, 0, len(self._kv_tokens), -1)
        raise RuntimeError(f"{self.describe()}: llama_decode failed with code {rc}")

    def _commit(self, toks: list[int], tokens: Sequence[int]) -> None:
        new = [int(t) for t in tokens]
        toks.extend(new)
        self._kv_tokens.extend(new)
