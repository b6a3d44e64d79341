"""The shared pool statistics part of `RedisStore`: each replica's per-bucket contribution to a pool's
statistics, and a pool's persisted long-window snapshot (warm start).

The payloads are opaque bytes (the controller serialises them), stored and returned byte for byte, up to
a few MB each. Every key of a pool shares its pool's hash tag, so a pool's buckets are read from one
server in one round trip. Contributions of a bucket live in one hash (field = replica id) that expires
`ttl_s` after its latest write; a snapshot is a string with its own expiry.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.store.records import text
from controlplane.store.scripts import HSET_WITH_TTL, ScriptCall, run_script
from controlplane.store.store_base import StoreBase, check_payload, check_pool_key, ttl_ms


class PoolStatisticsMixin(StoreBase):
    """put/get of pool contributions and snapshots (see the module docstring)."""

    async def put_pool_contribution(
        self, pool_key: str, *, bucket_start_s: int, replica_id: str, payload: bytes, ttl_s: float
    ) -> None:
        """Store one replica's statistics of a pool for one time bucket, replacing its previous ones.

        The bucket's hash (field = replica_id) expires ttl_s seconds after its latest contribution.

        Args:
            pool_key: the pool, as `keys.pool_key` renders it; not empty.
            bucket_start_s: the bucket's start, integer Unix seconds (>= 0): the bucket's name.
            replica_id: the contributing controller replica; not empty.
            payload: the serialized statistics (opaque, binary-safe).
            ttl_s: lifetime of the bucket after this write, seconds (> 0).

        Raises:
            ValueError: for an empty pool_key or replica_id, a bucket_start_s that is not a
                non-negative int, a payload that is not bytes, or ttl_s not > 0.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        _check_bucket(bucket_start_s)
        if not isinstance(replica_id, str) or not replica_id:
            raise ValueError(f"replica_id must be a non-empty str, got {replica_id!r}")
        data = check_payload(payload)
        key = self._keys.pool_contribution(pool_key, bucket_start_s)
        call = ScriptCall(HSET_WITH_TTL, [key], [ttl_ms(ttl_s), "0", replica_id, data])
        async with self._operation("put_pool_contribution"):
            await run_script(self._redis, call)

    async def get_pool_contributions(
        self, pool_key: str, *, bucket_starts: Sequence[int]
    ) -> dict[int, dict[str, bytes]]:
        """Every replica's statistics of a pool for the given buckets, in one round trip.

        Returns:
            bucket_start_s → (replica_id → payload) for every requested bucket; an empty dict for a
            bucket nobody contributed to (or that expired).

        Raises:
            ValueError: for an empty pool_key or a bucket start that is not a non-negative int.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        buckets = list(dict.fromkeys(bucket_starts))
        for bucket_start_s in buckets:
            _check_bucket(bucket_start_s)
        if not buckets:
            return {}
        async with self._operation("get_pool_contributions"), self._redis.pipeline(transaction=False) as pipe:
            for bucket_start_s in buckets:
                pipe.hgetall(self._keys.pool_contribution(pool_key, bucket_start_s))
            rows = await pipe.execute()
        return {bucket: {text(replica): bytes(data) for replica, data in row.items()}
                for bucket, row in zip(buckets, rows, strict=True)}

    async def put_pool_snapshot(self, pool_key: str, payload: bytes, *, ttl_s: float) -> None:
        """Store a pool's long-window statistics (opaque bytes) for the next ttl_s seconds.

        Raises:
            ValueError: for an empty pool_key, a payload that is not bytes, or ttl_s not > 0.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        data = check_payload(payload)
        lifetime_ms = ttl_ms(ttl_s)
        async with self._operation("put_pool_snapshot"):
            await self._redis.set(self._keys.pool_snapshot(pool_key), data, px=lifetime_ms)

    async def get_pool_snapshot(self, pool_key: str) -> bytes | None:
        """The pool's stored long-window statistics, or None when there are none (or they expired).

        Raises:
            ValueError: for an empty pool_key.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        async with self._operation("get_pool_snapshot"):
            raw = await self._redis.get(self._keys.pool_snapshot(pool_key))
        return None if raw is None else bytes(raw)


def _check_bucket(bucket_start_s: int) -> None:
    if isinstance(bucket_start_s, bool) or not isinstance(bucket_start_s, int) or bucket_start_s < 0:
        raise ValueError(f"bucket_start_s must be a non-negative int (Unix seconds), got {bucket_start_s!r}")
