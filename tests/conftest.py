"""Shared fixtures: the cached tiny model pair and guards for root-only tests."""

from __future__ import annotations

import os
import shutil

import pytest


def require_root_netns() -> None:
    """Skip (saying why) unless we are root and can create network namespaces.

    CI runs as root, where these tests must run: set TESTBED_REQUIRE_ROOT_TESTS=1 there to turn
    the skip into a failure.
    """
    reason = None
    if os.geteuid() != 0:
        reason = "needs root to create network namespaces, veths and netfilter rules"
    elif shutil.which("ip") is None:
        reason = "needs iproute2 (`ip`) to create network namespaces"
    if reason:
        if os.environ.get("TESTBED_REQUIRE_ROOT_TESTS") == "1":
            pytest.fail(f"TESTBED_REQUIRE_ROOT_TESTS=1 but this test cannot run: {reason}")
        pytest.skip(reason)


@pytest.fixture
def root_netns() -> None:
    """Use in tests that need root and network namespaces."""
    require_root_netns()


@pytest.fixture(scope="session")
def tiny_pair():
    """The tiny draft/target pair, built once and cached (see `testbed models build-tiny`)."""
    from testbed.models.tiny import ensure_tiny_pair

    return ensure_tiny_pair()
