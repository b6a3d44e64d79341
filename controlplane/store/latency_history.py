"""The latency-history part of `RedisStore`: each pool's capped stream of recorded latency samples.

One entry per sampling slot: its stream id is the slot's start in Unix milliseconds, so replicas that sample the
same pool in the same slot write it once (the first write wins; a later one, or one for an older slot, is
refused by Redis and reported as not written). The payload is opaque (the controller serialises the pool's
latency view), stored and returned byte for byte. The stream expires `ttl_s` after its latest sample, so a
pool nobody samples any more is not kept.
"""

from __future__ import annotations

import math

from redis.exceptions import ResponseError

from controlplane.store.errors import StoreUnavailable
from controlplane.store.records import text
from controlplane.store.store_base import StoreBase, check_payload, check_pool_key, ttl_ms

_FIELD = "outcomes"
_SLOT_TAKEN = "equal or smaller"  # Redis' refusal of an XADD id not after the stream's newest


class LatencyHistoryMixin(StoreBase):
    """put/read of the pools' latency samples (see the module docstring)."""

    async def put_latency_sample(self, pool_key: str, *, slot_ms: int, payload: bytes, max_samples: int,
                                 ttl_s: float) -> bool:
        """Append a pool's sample for the slot starting at `slot_ms` unless the stream already holds that slot or
        a later one.

        Args:
            pool_key: the pool, as `keys.pool_key` renders it; not empty.
            slot_ms: the slot's start, integer Unix milliseconds (> 0): the entry's id.
            payload: the serialized sample (opaque, binary-safe).
            max_samples: approximate cap of the pool's stream, entries (≥ 1).
            ttl_s: lifetime of the stream after this write, seconds (> 0).

        Returns:
            True when written; False when the slot (or a later one) was already written, by this replica or
            another.

        Raises:
            ValueError: for an empty pool_key, a slot_ms that is not a positive int, a payload that is not
                bytes-like, max_samples < 1 or ttl_s not > 0.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        if not isinstance(slot_ms, int) or isinstance(slot_ms, bool) or slot_ms <= 0:
            raise ValueError(f"slot_ms must be a positive int, got {slot_ms!r}")
        payload = check_payload(payload)
        if max_samples < 1:
            raise ValueError(f"max_samples must be ≥ 1, got {max_samples}")
        key = self._keys.latency_history(pool_key)
        async with self._operation("put_latency_sample"), self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(key, {_FIELD: payload}, id=f"{slot_ms}-0", maxlen=max_samples, approximate=True)
            pipe.pexpire(key, ttl_ms(ttl_s))
            added, _ = await pipe.execute(raise_on_error=False)
        if isinstance(added, ResponseError) and _SLOT_TAKEN in str(added):
            return False
        if isinstance(added, BaseException):
            raise StoreUnavailable("put_latency_sample", added)
        return True

    async def read_latency_history(self, pool_key: str, *, since_s: float, until_s: float,
                                   count: int) -> list[tuple[float, bytes]]:
        """The newest `count` samples of a pool recorded for slots in [since_s, until_s], oldest first, as
        (slot start in Unix seconds, payload).

        Raises:
            ValueError: for an empty pool_key, times that are not finite and ≥ 0, since_s > until_s, or
                count < 1.
            StoreUnavailable: when Redis fails.
        """
        check_pool_key(pool_key)
        if not (math.isfinite(since_s) and math.isfinite(until_s) and 0.0 <= since_s <= until_s):
            raise ValueError(f"need finite 0 ≤ since_s ≤ until_s, got {since_s=} {until_s=}")
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        newest, oldest = str(math.floor(until_s * 1000.0)), str(math.ceil(since_s * 1000.0))
        async with self._operation("read_latency_history"):
            replies = await self._newest_entries(self._keys.latency_history(pool_key), count, newest=newest,
                                                 oldest=oldest)
        entries = [(int(text(entry_id).split("-", 1)[0]) / 1000.0, payload) for entry_id, fields in replies
                   if isinstance(fields, dict) and isinstance(payload := fields.get(_FIELD.encode()), bytes)]
        entries.reverse()
        return entries
