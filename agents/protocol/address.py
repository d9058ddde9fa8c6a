"""`HOST:PORT` command-line arguments of the agents."""

from __future__ import annotations

import argparse


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port), with an argparse error naming what was expected."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)
