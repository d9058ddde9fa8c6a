"""Shapes of the tiny draft and target models and their LlamaForCausalLM configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaConfig


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-architecture shape (the vocabulary comes from the tokenizer)."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    max_positions: int = 256
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"ModelSpec: hidden ({self.hidden}) must divide by heads ({self.heads}) and "
                f"heads by kv_heads ({self.kv_heads})"
            )
        if (self.hidden // self.heads) % 2:
            head = self.hidden // self.heads
            raise ValueError(f"ModelSpec: head size {head} must be even (RoPE)")


DRAFT = ModelSpec(layers=1, hidden=64, ffn=192, heads=2, kv_heads=2)  # ~0.1M parameters
# GQA (4 query heads over 2 KV heads) also exercises the K permutation of the GGUF export.
TARGET = ModelSpec(layers=6, hidden=128, ffn=384, heads=4, kv_heads=2)  # ~1.3M parameters


def llama_config(
    spec: ModelSpec, vocab_size: int, bos_id: int = 0, eos_id: int = 1, pad_id: int = 2
) -> LlamaConfig:
    """The LlamaConfig of spec over a vocabulary of vocab_size tokens (untied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=spec.rms_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
