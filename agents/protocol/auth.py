"""The lab secret that authenticates every SLED datagram (HMAC-SHA256, truncated tag).

The lab generates one secret per lab and places it on every host as a key file (one line of
at least 32 characters; `new_key_text` makes 64 hex digits). Server and devices read it with
`LabKey.from_file`; a datagram whose tag does not match is dropped before its body is parsed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

TAG_BYTES = 16
MIN_KEY_CHARS = 32


class KeyFileError(ValueError):
    """A key file that is missing, unreadable or too short."""


def new_key_text() -> str:
    """A fresh lab secret as it is written to a key file (64 hex digits and a newline)."""
    return secrets.token_hex(32) + "\n"


class LabKey:
    """The shared secret; signs and checks datagram tags."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_KEY_CHARS:
            raise KeyFileError(f"a lab key needs at least {MIN_KEY_CHARS} bytes, got {len(secret)}")
        self._secret = secret

    @classmethod
    def from_file(cls, path: str | Path) -> LabKey:
        """Read a key file; errors name the file and what was expected."""
        try:
            text = Path(path).read_bytes().strip()
        except OSError as exc:
            raise KeyFileError(f"{path}: cannot read the lab key file ({exc.strerror})") from None
        if len(text) < MIN_KEY_CHARS:
            raise KeyFileError(
                f"{path}: the lab key must be one line of at least {MIN_KEY_CHARS} characters "
                f"(found {len(text)})"
            )
        return cls(text)

    def tag(self, data: bytes) -> bytes:
        """The TAG_BYTES-long tag of data."""
        return hmac.new(self._secret, data, hashlib.sha256).digest()[:TAG_BYTES]

    def check(self, data: bytes, tag: bytes) -> bool:
        """True if tag is data's tag (constant-time comparison)."""
        return hmac.compare_digest(self.tag(data), tag)


def key_for_agent(path: str | Path, agent: str) -> LabKey:
    """An agent's key at start-up: a bad key file ends the agent (exit code 2) naming it."""
    try:
        return LabKey.from_file(path)
    except KeyFileError as exc:
        raise SystemExit(f"{agent}: {exc}") from None
