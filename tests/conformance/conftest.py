"""Fixtures shared by the conformance tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvhandoff.conformance.harness_server import HarnessServer, serve


@pytest.fixture(scope="module")
def inproc_server() -> Iterator[HarnessServer]:
    """The reference harness server over the in-process backend, on a loopback port the OS
    picks, for one test module; stopped after it."""
    server = serve("127.0.0.1:0", "inproc")
    try:
        yield server
    finally:
        server.stop()
