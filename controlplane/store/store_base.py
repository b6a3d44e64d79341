"""`StoreBase`: what every part of `RedisStore` stands on — the connections to one Redis deployment, the key
space, the bound on operations in flight, the SCAN / pipelined-batch / paged-stream helpers, and the argument
checks the parts share (`check_pool_key`, `check_payload`).

Contracts:
- At most `max_connections` operations run at once (more wait up to `pool_timeout_s`, then fail with
  StoreUnavailable), so the connection pool never overflows however many engines a replica serves.
- Inside `_operation(name)` every Redis failure becomes `StoreUnavailable(name)`.
- `_scan` walks every primary of a cluster; `_batched` pipelines in batches (one round trip per server
  and batch); `_newest_entries` reads a stream newest first in pages of STREAM_PAGE.

No clock reads, no state besides the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Self

from controlplane.store.connections import ConnectionSettings, RedisConnections
from controlplane.store.errors import StoreUnavailable, unavailable_on_error
from controlplane.store.keys import KeySpace
from controlplane.store.records import text
from controlplane.store.urls import parse_store_url

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "cp"
DEFAULT_HISTORY_MAXLEN = 10_000
DEFAULT_AUDIT_MAXLEN = 100_000
DEFAULT_MAX_CONNECTIONS = 64
_SCAN_BATCH = 500
# Entries per XREVRANGE reply (`_newest_entries`): a reply is parsed in one piece, a page in a few milliseconds.
STREAM_PAGE = 500
_HISTORY_RENEWAL_MAX_S = 3600.0


class StoreBase:
    """Connections, key space and operation helpers of the store (see `RedisStore` for the operations)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        history_maxlen: int = DEFAULT_HISTORY_MAXLEN,
        audit_maxlen: int = DEFAULT_AUDIT_MAXLEN,
        socket_timeout_s: float = 5.0,
        num_retries: int = 2,
        health_check_interval_s: float = 30.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        pool_timeout_s: float = 10.0,
        engine_retention_s: float = 0.0,
    ) -> None:
        """
        Args:
            url: where Redis is: redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// (the
                forms and their options: `controlplane.store.urls`).
            prefix: namespace of every key and of the channel (see `keys.KeySpace`); no braces.
            history_maxlen: approximate cap of each pool's decision history stream, entries (XADD
                MAXLEN ~, so a stream may hold up to one macro node, ~100 entries, more).
            audit_maxlen: approximate cap of the audit stream, entries.
            socket_timeout_s: connect and per-command timeout, seconds.
            num_retries: retries of a command after a connection error or timeout, with jittered
                exponential backoff (50 ms up to 1 s); they reconnect pooled connections that went
                stale (e.g. after a Redis restart or a failover) instead of failing the first command.
            health_check_interval_s: idle time after which a connection is PINGed before use (also
                detects a dead pub/sub connection), seconds; 0 disables.
            max_connections: operations in flight at once (each holds at most one connection per
                server); subscriptions hold a connection each on top.
            pool_timeout_s: how long an operation waits for a free connection before it fails with
                StoreUnavailable, seconds.
            engine_retention_s: how long an engine's decision and epoch keys outlive its last decision
                write or epoch reservation, and a pool's history stream its latest entry, seconds; 0 keeps
                them forever. With a retention, epochs are
                also floored at the Redis server's Unix time (see `scripts.RESERVE_EPOCH`), which keeps
                versions increasing across an expiry.

        Raises:
            ValueError: for a malformed URL (naming what is wrong), an empty prefix or one with braces, a
                cap below 1, negative retries, max_connections below 1, or a negative or non-finite
                engine_retention_s.
        """
        if history_maxlen < 1 or audit_maxlen < 1:
            raise ValueError(f"stream caps must be at least 1, got {history_maxlen=} {audit_maxlen=}")
        if not pool_timeout_s > 0.0:
            raise ValueError(f"pool_timeout_s must be positive, got {pool_timeout_s}")
        if not (math.isfinite(engine_retention_s) and engine_retention_s >= 0.0):
            raise ValueError(f"engine_retention_s must be ≥ 0 seconds (0: keep forever), got {engine_retention_s}")
        address = parse_store_url(url)
        settings = ConnectionSettings(
            socket_timeout_s=socket_timeout_s,
            num_retries=num_retries,
            health_check_interval_s=health_check_interval_s,
            max_connections=max_connections,
        )
        self._keys = KeySpace(prefix)
        self._history_maxlen = history_maxlen
        self._audit_maxlen = audit_maxlen
        self._pool_timeout_s = pool_timeout_s
        self._retention_arg = str(ttl_ms(engine_retention_s)) if engine_retention_s > 0.0 else "0"
        # A pool history's expiry is renewed at most this often per pool (not with every entry).
        self._history_renewal_s = min(engine_retention_s / 10.0, _HISTORY_RENEWAL_MAX_S)
        # ... and entered in the history index as often (hourly without a retention: nothing expires)
        self._history_index_s = self._history_renewal_s if engine_retention_s > 0.0 else _HISTORY_RENEWAL_MAX_S
        self._history_renewed_at: dict[str, float] = {}
        self._connections = RedisConnections(address, settings)
        self._redis = self._connections.client
        self._slots = asyncio.Semaphore(max_connections)
        logger.debug("store on %s, prefix %r", address.redacted(), prefix)

    @property
    def keys(self) -> KeySpace:
        """The key names this store uses."""
        return self._keys

    @property
    def topology(self) -> str:
        """"single", "sentinel" or "cluster"."""
        return self._connections.address.topology

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections. Never raises."""
        await self._connections.aclose()

    async def ping(self, *, timeout_s: float = 2.0) -> bool:
        """True when Redis (every node of a cluster) answers PING within timeout_s seconds; never raises."""
        try:
            async with asyncio.timeout(timeout_s), self._operation("ping"):
                return bool(await self._redis.ping())
        except Exception as err:  # ping is the health probe: every failure means "unavailable"
            logger.debug("redis ping failed: %s", err)
            return False

    # ---- helpers ---------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _operation(self, operation: str) -> AsyncIterator[None]:
        """Hold one of the max_connections operation slots; Redis failures become StoreUnavailable."""
        try:
            async with asyncio.timeout(self._pool_timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise StoreUnavailable(operation, TimeoutError(
                f"no free Redis connection within {self._pool_timeout_s} s")) from None
        try:
            with unavailable_on_error(operation):
                await self._connections.ensure_initialized()
                yield
        finally:
            self._slots.release()

    async def _scan(self, pattern: str) -> list[str]:
        """Every key matching `pattern` (on every primary of a cluster), each once."""
        found = [text(key) async for key in self._redis.scan_iter(match=pattern, count=_SCAN_BATCH)]
        return list(dict.fromkeys(found))

    async def _hashes(self, pattern: str, *, per_pipeline: int = _SCAN_BATCH) -> list[tuple[str, dict[Any, Any]]]:
        """(key, fields) of every hash matching `pattern`, read per_pipeline at a time; a key that expired between
        the SCAN and its HGETALL is left out. Call inside `_operation`."""
        keys = await self._scan(pattern)
        rows = await self._batched(keys, lambda pipe, key: pipe.hgetall(key), per_pipeline=per_pipeline)
        return [(key, row) for key, row in zip(keys, rows, strict=True) if row]

    async def _newest_entries(self, stream: str, count: int, *, newest: str = "+",
                              oldest: str = "-") -> list[tuple[Any, Any]]:
        """The newest `count` entries of one stream with ids in [oldest, newest] (XREVRANGE bounds), newest first,
        read in pages of STREAM_PAGE (a reply is parsed in one piece: pages give the event loop back)."""
        entries: list[tuple[Any, Any]] = []
        while len(entries) < count:
            page = await self._redis.xrevrange(stream, max=newest, min=oldest,
                                               count=min(STREAM_PAGE, count - len(entries)))
            entries.extend(page)
            if len(page) < STREAM_PAGE:
                break
            newest = "(" + text(page[-1][0])  # exclusive: before the page's oldest entry
        return entries

    async def _batched(self, keys: list[str], command: Callable[[Any, str], object], *,
                       per_pipeline: int = _SCAN_BATCH) -> list[Any]:
        """Run `command(pipe, key)` for every key, pipelined (not transactional) in batches of per_pipeline
        (a pipeline's replies are parsed in one piece: a smaller batch gives the event loop back sooner)."""
        results: list[Any] = []
        for start in range(0, len(keys), per_pipeline):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys[start:start + per_pipeline]:
                    command(pipe, key)
                results.extend(await pipe.execute())
        return results


def check_pool_key(pool_key: str) -> None:
    """Raises ValueError unless `pool_key` is a non-empty str."""
    if not isinstance(pool_key, str) or not pool_key:
        raise ValueError(f"pool_key must be a non-empty str, got {pool_key!r}")


def check_payload(payload: bytes) -> bytes:
    """`payload` as bytes; ValueError when it is not bytes-like."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
    return bytes(payload)


def ttl_ms(ttl_s: float) -> int:
    """ttl_s seconds as whole milliseconds (at least 1).

    Raises:
        ValueError: when ttl_s is not a positive finite number.
    """
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not (math.isfinite(ttl_s) and ttl_s > 0.0):
        raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
    return max(1, math.ceil(ttl_s * 1000.0))
