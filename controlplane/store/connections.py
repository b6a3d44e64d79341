"""redis-py clients for a store address: one server, a Sentinel-managed master, or a Redis Cluster.

`RedisConnections` holds the command client (bytes in, bytes out: decode_responses is off, so payloads
are binary-safe) and whatever else must be closed with it (the sentinels' clients). Its pools are
bounded: `max_connections` for commands (the store never runs more commands at once, see
`RedisStore`) plus `WATCH_CONNECTIONS` for pub/sub subscriptions, which hold a connection each; on a
cluster the bound applies per node.

- single: `redis.asyncio.Redis` (TCP, TLS or unix socket).
- sentinel: `redis.asyncio.sentinel.Sentinel(...).master_for(service)`: every new connection asks the
  sentinels for the current master; a connection to a demoted master is dropped on its first
  READONLY reply (and Sentinel kills the old master's clients when it reconfigures it), so commands and
  subscriptions move to the new master through the retries.
- cluster: `redis.asyncio.cluster.RedisCluster` from the startup nodes (slots discovered, MOVED/ASK
  followed, topology refreshed on errors).

Does not read the environment or any file.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff

from controlplane.store.errors import REDIS_FAILURES
from controlplane.store.urls import StoreAddress

WATCH_CONNECTIONS = 8
"""Connections kept beyond max_connections for subscriptions (one per running watch)."""


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How the store connects.

    Attributes:
        socket_timeout_s: connect and per-command timeout, seconds.
        num_retries: retries of a command after a connection error or timeout (jittered exponential
            backoff from 50 ms up to 1 s).
        health_check_interval_s: idle time after which a connection is PINGed before use, seconds; 0 off.
        max_connections: commands in flight at once (per node on a cluster).
    """

    socket_timeout_s: float = 5.0
    num_retries: int = 2
    health_check_interval_s: float = 30.0
    max_connections: int = 64

    def __post_init__(self) -> None:
        if not self.socket_timeout_s > 0.0:
            raise ValueError(f"socket_timeout_s must be positive, got {self.socket_timeout_s}")
        if self.num_retries < 0:
            raise ValueError(f"num_retries must not be negative, got {self.num_retries}")
        if self.health_check_interval_s < 0.0:
            raise ValueError(f"health_check_interval_s must not be negative, got {self.health_check_interval_s}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections}")


class RedisConnections:
    """The clients of one store address. Create inside the event loop that uses them; `aclose()` them."""

    def __init__(self, address: StoreAddress, settings: ConnectionSettings) -> None:
        self.address = address
        self.settings = settings
        self._sentinel: Sentinel | None = None
        common = _common_kwargs(address, settings)
        if address.topology == "cluster":
            self.client: Any = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in address.nodes],
                require_full_coverage=True,
                **common,
            )
        elif address.topology == "sentinel":
            sentinel_kwargs: dict[str, Any] = {
                "socket_timeout": settings.socket_timeout_s,
                "socket_connect_timeout": settings.socket_timeout_s,
                **_tls_kwargs(address),
            }
            if address.sentinel_password:
                sentinel_kwargs["password"] = address.sentinel_password
            if address.sentinel_username:
                sentinel_kwargs["username"] = address.sentinel_username
            self._sentinel = Sentinel(list(address.nodes), sentinel_kwargs=sentinel_kwargs)
            self.client = self._sentinel.master_for(address.service_name, db=address.db, **common)
        elif address.unix_socket_path:
            self.client = redis.Redis(unix_socket_path=address.unix_socket_path, db=address.db, **common)
        else:
            host, port = address.nodes[0]
            self.client = redis.Redis(host=host, port=port, db=address.db, **common)

    @property
    def is_cluster(self) -> bool:
        return self.address.topology == "cluster"

    async def ensure_initialized(self) -> None:
        """On a cluster, discover the nodes and slots before a command when the client needs it (first use,
        or after redis-py dropped its view on a topology error); a no-op otherwise, and cheap once known.

        redis-py would initialise lazily inside the first command; when many commands started at once on
        a cold client, some of their fresh connections were dropped mid-command and the cluster client's
        retry ran those commands twice (an INCR counted double). `RedisCluster.initialize()` discovers
        once under its own lock and returns at once when nothing is to be done.
        """
        if self.is_cluster:
            await self.client.initialize()

    async def pubsub(self) -> PubSub:
        """A new pub/sub object. On a cluster it subscribes through the node that owns the channel's slot
        (PUBLISH reaches every node of a cluster)."""
        await self.ensure_initialized()
        return self.client.pubsub()

    async def aclose(self) -> None:
        """Close every connection. Never raises."""
        with contextlib.suppress(*REDIS_FAILURES):
            await self.client.aclose()
        if self._sentinel is not None:
            with contextlib.suppress(*REDIS_FAILURES):
                await self._sentinel.aclose()


def _common_kwargs(address: StoreAddress, settings: ConnectionSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.socket_timeout_s,
        "retry": Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), settings.num_retries),
        "health_check_interval": settings.health_check_interval_s,
        "max_connections": settings.max_connections + WATCH_CONNECTIONS,
        "decode_responses": False,
        **_tls_kwargs(address),
    }
    if address.username:
        kwargs["username"] = address.username
    if address.password:
        kwargs["password"] = address.password
    return kwargs


def _tls_kwargs(address: StoreAddress) -> dict[str, Any]:
    if not address.tls:
        return {}
    return {"ssl": True, **dict(address.tls_options)}
