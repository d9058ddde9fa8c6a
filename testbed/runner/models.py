"""Resolve a playbook's `models` section to model paths on the controller."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.config.playbook import ModelsSection
from testbed.core.errors import BadInputError


@dataclass
class ResolvedModels:
    draft: str  # GGUF the devices draft with
    target: str  # HF folder (or GGUF) the server verifies with
    tokenizer_hash: str | None


def resolve_models(section: ModelsSection, say: Callable[[str], None] = print) -> ResolvedModels:
    """'tiny' builds (or finds cached) the built-in pair; anything else must exist on disk."""
    draft, target, tok = section.draft, section.target, None
    if "tiny" in (draft, target):
        from testbed.models.tiny import ensure_tiny_pair

        say("tiny model pair (built once, about 4 min on 2 cores, then cached)")
        pair = ensure_tiny_pair(progress=say)
        tok = pair.tokenizer_hash
        draft = str(pair.draft_gguf) if draft == "tiny" else draft
        target = str(pair.target_hf) if target == "tiny" else target
    for key, path in (("models.draft", draft), ("models.target", target)):
        if not Path(path).exists():
            raise BadInputError(f"playbook: {key}: {path} does not exist")
    return ResolvedModels(draft, target, tok)
