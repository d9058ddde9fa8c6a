"""PyTorch engine (transformers, an HF model folder): what the edge server runs.

Design:
- Each session owns a `DynamicCache` holding exactly its tokens' keys and values (batch size
  1, no padding), plus its token list. `rollback` crops the cache.
- `score` on one session feeds the new tokens straight into that session's cache: no mask,
  positions `L .. L+k-1`.
- `score_batch` runs ONE forward for sessions of different lengths L_i and different numbers
  of new tokens k_i. Past keys/values are left-padded to Lmax (zeros) and the new tokens are
  right-padded to Kmax, so in the batched cache every row's real entries form one contiguous
  block `[Lmax - L_i, Lmax + k_i)`. A 2-D attention mask marks the real entries, position ids
  are explicit (`L_i + j`), and causality follows cache indices, which keeps real tokens
  attending to exactly their own past. Padding query rows (j >= k_i) still see their session's
  real tokens, so no softmax row is fully masked and no NaN appears. After the forward each
  session's cache is replaced by its contiguous real block (copied), so pad garbage never
  persists, and only the real rows of the logits are returned.
- `prefill_chunk` (None: off): a session's new tokens longer than it are fed in chunks of
  that many tokens, one forward per chunk (sessions of a batch advance together, each chunk
  step batching whoever still has tokens), which bounds the activations a long context
  needs; the logits are the unchunked ones up to floating-point rounding.
- Only full-attention caches are supported (Llama-style models); sliding-window layers are
  refused.
- Tokenization uses the folder's `tokenizer.json` (the `tokenizers` library) with special-token
  text left unparsed, BOS added by the engine, so ids match llama.cpp's `special=False`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from agents.engines.base import Engine, tokenizer_fingerprint

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


def token_pieces(tokenizer: Tokenizer) -> list[bytes]:
    """The byte string of every token id of an HF `tokenizers.Tokenizer`.

    Byte-level BPE tokens are mapped back through GPT-2's byte alphabet; SentencePiece-style
    tokens turn `▁` into a space and `<0xNN>` into a byte; added tokens are their text.
    """
    spec = json.loads(tokenizer.to_str())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder")) or "ByteLevel" in json.dumps(
        spec.get("pre_tokenizer")
    )
    added = {int(i): t.content for i, t in tokenizer.get_added_tokens_decoder().items()}
    pieces: list[bytes] = []
    for i in range(tokenizer.get_vocab_size(with_added_tokens=True)):
        if i in added:
            pieces.append(added[i].encode())
            continue
        text = tokenizer.id_to_token(i)
        if text is None:
            pieces.append(b"")
        elif byte_level and all(c in _BYTE_DECODER for c in text):
            pieces.append(bytes(_BYTE_DECODER[c] for c in text))
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            pieces.append(bytes([int(text[3:5], 16)]))
        else:
            pieces.append(text.replace("\u2581", " ").encode())
    return pieces


def hf_tokenizer_hash(model_dir: str | Path) -> str:
    """`tokenizer_fingerprint` of an HF folder's tokenizer, without loading the model."""
    path = Path(model_dir)
    cfg_path, tok_path = path / "config.json", path / "tokenizer.json"
    for p in (cfg_path, tok_path):
        if not p.is_file():
            raise FileNotFoundError(f"{path}: not an HF model folder (no {p.name})")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e.msg})") from None
    bos = _first_id(cfg.get("bos_token_id"), "bos_token_id", path)
    eos = _first_id(cfg.get("eos_token_id"), "eos_token_id", path)
    return tokenizer_fingerprint(token_pieces(Tokenizer.from_file(str(tok_path))), bos, eos)


@dataclass
class _Session:
    cache: DynamicCache
    tokens: list[int] = field(default_factory=list)


class TorchEngine(Engine):
    """An `Engine` over an HF causal LM folder, on CPU or CUDA, with batched scoring."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str | torch.dtype = "float32",
        threads: int | None = None,
        attn_implementation: str = "sdpa",
        prefill_chunk: int | None = None,
    ) -> None:
        """Load model_dir; threads sets torch's (process-wide) CPU thread count if given;
        prefill_chunk: the most new tokens of one session per forward (None: no limit)."""
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self.path = Path(model_dir)
        for name in ("config.json", "tokenizer.json"):
            if not (self.path / name).is_file():
                raise FileNotFoundError(f"{self.path}: not an HF model folder (no {name})")
        if isinstance(dtype, str):
            if dtype not in DTYPES:
                raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
            dtype = DTYPES[dtype]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} asked for but CUDA is not available")
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.dtype = dtype
        hf_logging.disable_progress_bar()  # a "Loading weights" bar would cut into logs
        self.model = AutoModelForCausalLM.from_pretrained(
            self.path, dtype=dtype, attn_implementation=attn_implementation
        ).to(self.device)
        self.model.eval()
        cfg = self.model.config
        layer_types = getattr(cfg, "layer_types", None) or []
        if getattr(cfg, "sliding_window", None) or any(t != "full_attention" for t in layer_types):
            raise ValueError(f"{self.path}: sliding-window attention is not supported")
        self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.tokenizer.encode_special_tokens = True  # "<s>" in text is text, as in llama.cpp
        self.vocab_size = int(cfg.vocab_size)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        self.bos_id = _first_id(cfg.bos_token_id, "bos_token_id", self.path)
        self.eos_id = _first_id(cfg.eos_token_id, "eos_token_id", self.path)
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else self.eos_id
        self._special = {int(i) for i in self.tokenizer.get_added_tokens_decoder()}
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._sessions: dict[int, _Session] = {}
        self._next_sid = 0
        self._hash: str | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of keys and values one cached token takes (all layers)."""
        cfg = self.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * cfg.num_hidden_layers * heads * head_dim * element

    # --- tokenizer -------------------------------------------------------------------------

    @property
    def tokenizer_hash(self) -> str:
        if self._hash is None:
            pieces = token_pieces(self.tokenizer)
            self._hash = tokenizer_fingerprint(pieces, self.bos_id, self.eos_id)
        return self._hash

    def describe(self) -> str:
        return f"torch:{self.path}"

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids if text else []
        return [self.bos_id, *ids] if add_bos else list(ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=True)

    # --- sessions --------------------------------------------------------------------------

    def open(self) -> int:
        sid = self._next_sid
        self._next_sid += 1
        self._sessions[sid] = _Session(self._empty_cache())
        return sid

    def _session(self, sid: int) -> _Session:
        try:
            return self._sessions[sid]
        except KeyError:
            raise KeyError(f"{self.describe()}: unknown session {sid}") from None

    def length(self, sid: int) -> int:
        return len(self._session(sid).tokens)

    def rollback(self, sid: int, n: int) -> None:
        s = self._session(sid)
        drop = len(s.tokens) - n
        if not 0 <= n <= len(s.tokens):
            raise ValueError(f"rollback: n must be in [0, {len(s.tokens)}] for session {sid}")
        if drop == 0:
            return
        if n == 0:
            s.cache = self._empty_cache()
        else:
            s.cache.crop(-drop)
        del s.tokens[n:]

    def close(self, sid: int) -> None:
        self._session(sid)
        del self._sessions[sid]

    def _empty_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    # --- scoring ---------------------------------------------------------------------------

    def score(self, sid: int, tokens: Sequence[int]) -> np.ndarray:
        return self.score_batch({sid: tokens})[sid]

    def score_batch(self, requests: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """Score several sessions in one forward (see the module docstring)."""
        out: dict[int, np.ndarray] = {}
        work: list[tuple[int, _Session, list[int]]] = []
        for sid, toks in requests.items():
            s = self._session(sid)
            new = [int(t) for t in toks]
            bad = [t for t in new if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
            if new:
                work.append((sid, s, new))
            else:
                out[sid] = np.empty((0, self.vocab_size), dtype=np.float32)
        chunk = self.prefill_chunk
        if not chunk or all(len(new) <= chunk for _, _, new in work):
            out.update(self._forward(work))
            return out
        parts: dict[int, list[np.ndarray]] = {sid: [] for sid, _, _ in work}
        for start in range(0, max(len(new) for _, _, new in work), chunk):
            step = [(sid, s, new[start : start + chunk]) for sid, s, new in work if new[start:]]
            for sid, rows in self._forward(step).items():
                parts[sid].append(rows)
        out.update({sid: np.concatenate(rows) for sid, rows in parts.items()})
        return out

    def _forward(self, work: list[tuple[int, _Session, list[int]]]) -> dict[int, np.ndarray]:
        """One forward for every session of work (none may be empty)."""
        if len(work) == 1:
            sid, s, new = work[0]
            return {sid: self._forward_one(s, new)}
        return self._forward_many(work) if work else {}

    @torch.inference_mode()
    def _forward_one(self, s: _Session, new: list[int]) -> np.ndarray:
        past = len(s.tokens)
        ids = torch.tensor([new], dtype=torch.long, device=self.device)
        pos = torch.arange(past, past + len(new), device=self.device).unsqueeze(0)
        kw = {self._cache_kw: s.cache}
        res = self.model(input_ids=ids, position_ids=pos, use_cache=True, **kw)
        s.tokens.extend(new)
        return res.logits[0].float().cpu().numpy()

    @torch.inference_mode()
    def _forward_many(self, work: list[tuple[int, _Session, list[int]]]) -> dict[int, np.ndarray]:
        dev = self.device
        b = len(work)
        lens = [len(s.tokens) for _, s, _ in work]
        ks = [len(new) for _, _, new in work]
        lmax, kmax = max(lens), max(ks)
        ids = torch.full((b, kmax), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, lmax + kmax), dtype=torch.long)
        pos = torch.zeros((b, kmax), dtype=torch.long)
        for i, (_, _, new) in enumerate(work):
            ids[i, : ks[i]] = torch.tensor(new)
            mask[i, lmax - lens[i] : lmax + ks[i]] = 1
            pos[i] = lens[i] + torch.arange(kmax)
        cache = self._padded_cache([s for _, s, _ in work], lens, lmax)
        res = self.model(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            position_ids=pos.to(dev),
            use_cache=True,
            **{self._cache_kw: cache},
        )
        logits = res.logits.float().cpu()
        out: dict[int, np.ndarray] = {}
        for i, (sid, s, new) in enumerate(work):
            lo, hi = lmax - lens[i], lmax + ks[i]
            s.cache = DynamicCache(
                ddp_cache_data=[
                    (layer.keys[i : i + 1, :, lo:hi], layer.values[i : i + 1, :, lo:hi])
                    for layer in cache.layers
                ]
            )
            s.tokens.extend(new)
            out[sid] = logits[i, : ks[i]].numpy()
        return out

    def _padded_cache(self, sessions: list[_Session], lens: list[int], lmax: int) -> DynamicCache:
        """One cache for the batch: each session's keys/values right-aligned at lmax."""
        if lmax == 0:
            return self._empty_cache()
        ref = next(s for s, n in zip(sessions, lens) if n > 0).cache.layers
        data = []
        for li, layer in enumerate(ref):
            _, heads, _, dim = layer.keys.shape
            shape = (len(sessions), heads, lmax, dim)
            k = torch.zeros(shape, dtype=layer.keys.dtype, device=self.device)
            v = torch.zeros(shape, dtype=layer.values.dtype, device=self.device)
            for i, (s, n) in enumerate(zip(sessions, lens)):
                if n:
                    k[i, :, lmax - n :] = s.cache.layers[li].keys[0]
                    v[i, :, lmax - n :] = s.cache.layers[li].values[0]
            data.append((k, v))
        return DynamicCache(ddp_cache_data=data)


def _first_id(value: int | list[int] | None, name: str, path: Path) -> int:
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        raise ValueError(f"{path / 'config.json'}: field {name!r} is missing (expected a token id)")
    return int(value)
