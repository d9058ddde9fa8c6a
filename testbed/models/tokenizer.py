"""Byte-level BPE tokenizer for the tiny models, saved as an HF tokenizer folder.

GPT-2 style (byte-level pre-tokenizer with the GPT-2 regex), so llama.cpp reads it as a
`gpt2` vocabulary with the `gpt-2` pre-tokenizer. Merges whose result contains a digit are
dropped, so every digit stays a single token (tiny models learn arithmetic far better that
way). Special tokens `<s>`, `</s>`, `<pad>` get ids 0, 1, 2.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIALS = ("<s>", "</s>", "<pad>")
BOS, EOS, PAD = SPECIALS
# Seen once in the corpus so punctuation and whitespace outside the templates get merges too.
EXTRA_TEXT = (
    "Hello, world! 123 + 456 = 579.\n\tTabs, (brackets) [x] {y} "
    "'quotes' \"dq\" ?!;:-_/\\@#$%^&*~`|<>"
)


@dataclass(frozen=True)
class TokenizerSpec:
    """What the tokenizer is trained on and how big it may grow."""

    vocab_size: int = 512  # before dropping digit merges; the final vocabulary is smaller
    corpus_size: int = 20000  # training problems used as the corpus
    model_max_length: int = 256


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train the byte-level BPE on texts; digits stay single tokens; specials are 0, 1, 2."""
    if vocab_size < 256 + len(SPECIALS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIALS)}, got {vocab_size}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    first = Tokenizer(models.BPE())
    first.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    first.train_from_iterator(list(texts) + [EXTRA_TEXT], trainer)
    spec = json.loads(first.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    merges = [(a, b) for a, b in merges if not any(ch.isdigit() for ch in a + b)]
    keep = set(SPECIALS) | set(alphabet) | {a + b for a, b in merges}
    ordered = sorted((i, t) for t, i in spec["vocab"].items() if t in keep)
    vocab = {t: new_id for new_id, (_, t) in enumerate(ordered)}
    if [vocab[s] for s in SPECIALS] != [0, 1, 2]:
        got = [vocab[s] for s in SPECIALS]
        raise RuntimeError(f"special tokens did not get ids 0, 1, 2: {got}")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)]
    )
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int = 256) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json to out_dir.

    `tokenizer_class` is the generic `PreTrainedTokenizerFast`, which transformers 4 and 5
    both load (transformers 5 would otherwise write its own `TokenizersBackend`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIALS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
