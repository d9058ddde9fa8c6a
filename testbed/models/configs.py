"""Shapes of the tiny draft and target models and their LlamaForCausalLM configs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.models.train import TrainSpec

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
    max_positions: int = 2048
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


DRAFT = ModelSpec(layers=2, hidden=96, ffn=288, heads=2, kv_heads=2)  # ~0.3M parameters
# GQA (4 query heads over 2 KV heads) also exercises the K permutation of the GGUF export.
TARGET = ModelSpec(layers=6, hidden=128, ffn=384, heads=4, kv_heads=2)  # ~1.3M parameters


@dataclass(frozen=True)
class DraftGrade:
    """One draft of the graded family: its name (also its folder), shape and training."""

    name: str
    spec: ModelSpec
    train: TrainSpec


# Drafts of graded quality besides DRAFT: weaker (smaller, shorter-trained) and stronger
# (deeper) ones, so that a run can match the acceptance of the pair it stands for.
DRAFT_GRADES = (
    DraftGrade("draft-xs", ModelSpec(1, 32, 96, 2, 2), TrainSpec(200, lr=5e-3, batch_size=8)),
    DraftGrade("draft-s", ModelSpec(1, 64, 192, 2, 2), TrainSpec(400, lr=5e-3, batch_size=8)),
    DraftGrade("draft-l", ModelSpec(3, 128, 384, 4, 2), TrainSpec(500, lr=4e-3, batch_size=8)),
)


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
