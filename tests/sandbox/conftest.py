"""Fixtures for the sandbox tests: a loopback server and a host secret."""

from __future__ import annotations

import socket

import pytest
from sandbox_helpers import HOST_SECRET


@pytest.fixture(autouse=True)
def host_secret(monkeypatch):
    """A secret in the host environment that must never reach the sandbox."""
    monkeypatch.setenv("VT_TEST_SECRET", HOST_SECRET)
    return HOST_SECRET


@pytest.fixture
def loopback_server():
    """A TCP server on 127.0.0.1 in the test process; yields (port, socket)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.setblocking(False)
    yield server.getsockname()[1], server
    server.close()
