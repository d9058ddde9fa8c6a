"""Export an HF Llama folder (safetensors, config.json, byte-level BPE tokenizer.json) to GGUF.

Tensor names follow llama.cpp's `llama` architecture. Q and K weights are permuted from HF's
rotate-half RoPE layout to llama.cpp's interleaved one (without it logits differ by ~24 and no
greedy output matches). The tokenizer is stored as `tokenizer.ggml.model = "gpt2"` with the
`gpt-2` pre-tokenizer (llama.cpp's name, not "gpt2"); special tokens are typed CONTROL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

REQUIRED_CONFIG = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "vocab_size",
    "bos_token_id",
    "eos_token_id",
)


class ExportError(ValueError):
    """The HF folder cannot be exported; the message names the file and field."""


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder a Q or K projection's rows from rotate-half to interleaved RoPE pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _load_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(f"{path}: file not found")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: not valid JSON ({e.msg})") from None


def read_config(hf_dir: Path) -> dict[str, Any]:
    """config.json of a llama folder, checked for what the export needs."""
    path = hf_dir / "config.json"
    cfg = _load_json(path)
    if cfg.get("model_type") != "llama":
        got = cfg.get("model_type")
        raise ExportError(f"{path}: field 'model_type' must be 'llama', got {got!r}")
    for key in REQUIRED_CONFIG:
        if key not in cfg:
            raise ExportError(f"{path}: field {key!r} is missing")
    return cfg


def _rope_theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(cfg.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _add_tokenizer(writer: Any, hf_dir: Path, cfg: dict[str, Any]) -> None:
    import gguf

    path = hf_dir / "tokenizer.json"
    spec = _load_json(path)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in json.dumps(spec.get("pre_tokenizer")):
        raise ExportError(f"{path}: only byte-level BPE tokenizers can be exported")
    vocab = dict(model["vocab"])
    added = spec.get("added_tokens", [])
    for tok in added:
        vocab[tok["content"]] = tok["id"]
    n = max(vocab.values()) + 1
    if n != cfg["vocab_size"] or len(vocab) != n:
        raise ExportError(
            f"{path}: {len(vocab)} tokens with ids up to {n - 1}, but config.json has "
            f"vocab_size {cfg['vocab_size']} (expected contiguous ids 0..vocab_size-1)"
        )
    tokens = [""] * n
    for text, i in vocab.items():
        tokens[i] = text
    special = {tok["id"] for tok in added if tok.get("special")}
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(n)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(int(cfg["bos_token_id"]))
    writer.add_eos_token_id(int(cfg["eos_token_id"]))
    if cfg.get("pad_token_id") is not None:
        writer.add_pad_token_id(int(cfg["pad_token_id"]))
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def export_gguf(hf_dir: Path, out: Path, ftype: str = "f32") -> Path:
    """Write hf_dir's model as GGUF to out (atomically) and return out; ftype f32 or f16."""
    import gguf
    from safetensors.numpy import load_file

    if ftype not in ("f32", "f16"):
        raise ExportError(f"ftype must be 'f32' or 'f16', got {ftype!r}")
    hf_dir, out = Path(hf_dir), Path(out)
    cfg = read_config(hf_dir)
    weights = hf_dir / "model.safetensors"
    if not weights.is_file():
        raise ExportError(f"{weights}: file not found (expected one safetensors file)")
    sd = load_file(str(weights))
    n_head = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    n_layer = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // n_head)

    def tensor(name: str) -> np.ndarray:
        if name not in sd:
            raise ExportError(f"{weights}: tensor {name!r} is missing")
        return sd[name]

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    try:  # noqa: SIM105 - the writer must be closed and the partial file removed on any error
        writer.add_name(hf_dir.name)
        writer.add_context_length(int(cfg["max_position_embeddings"]))
        writer.add_embedding_length(int(cfg["hidden_size"]))
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(int(cfg["intermediate_size"]))
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_kv)
        writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
        writer.add_rope_freq_base(_rope_theta(cfg))
        writer.add_rope_dimension_count(head_dim)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_vocab_size(int(cfg["vocab_size"]))
        file_type = gguf.LlamaFileType.ALL_F32 if ftype == "f32" else gguf.LlamaFileType.MOSTLY_F16
        writer.add_file_type(file_type)
        _add_tokenizer(writer, hf_dir, cfg)

        def put(name: str, arr: np.ndarray) -> None:
            arr = arr.astype(np.float32)
            if ftype == "f16" and arr.ndim == 2:
                arr = arr.astype(np.float16)  # norms stay f32, as llama.cpp expects
            writer.add_tensor(name, np.ascontiguousarray(arr))

        put("token_embd.weight", tensor("model.embed_tokens.weight"))
        for i in range(n_layer):
            p = f"model.layers.{i}."
            put(f"blk.{i}.attn_norm.weight", tensor(p + "input_layernorm.weight"))
            q, k = tensor(p + "self_attn.q_proj.weight"), tensor(p + "self_attn.k_proj.weight")
            put(f"blk.{i}.attn_q.weight", permute_rope(q, n_head))
            put(f"blk.{i}.attn_k.weight", permute_rope(k, n_kv))
            put(f"blk.{i}.attn_v.weight", tensor(p + "self_attn.v_proj.weight"))
            put(f"blk.{i}.attn_output.weight", tensor(p + "self_attn.o_proj.weight"))
            put(f"blk.{i}.ffn_norm.weight", tensor(p + "post_attention_layernorm.weight"))
            put(f"blk.{i}.ffn_gate.weight", tensor(p + "mlp.gate_proj.weight"))
            put(f"blk.{i}.ffn_up.weight", tensor(p + "mlp.up_proj.weight"))
            put(f"blk.{i}.ffn_down.weight", tensor(p + "mlp.down_proj.weight"))
        put("output_norm.weight", tensor("model.norm.weight"))
        if not cfg.get("tie_word_embeddings", False):
            put("output.weight", tensor("lm_head.weight"))
        # tied embeddings: llama.cpp falls back to token_embd.weight without output.weight
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)
    return out


QUANTIZATIONS = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def quantize_gguf(src: Path, out: Path, kind: str) -> Path:
    """Write src (an f32/f16 GGUF) quantized to kind (q8_0 or q4_0) to out, with llama.cpp's
    own quantizer; returns out. Block quantizations need rows that are multiples of 32."""
    import ctypes

    import llama_cpp

    if kind not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {sorted(QUANTIZATIONS)}, got {kind!r}")
    src, out = Path(src), Path(out)
    if not src.is_file():
        raise ExportError(f"{src}: file not found (expected an f32 or f16 GGUF)")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANTIZATIONS[kind])
    params.nthread = 1
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ExportError(f"{src}: llama.cpp could not quantize to {kind} (code {rc})")
    tmp.replace(out)
    return out
