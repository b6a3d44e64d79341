"""Guarded rollouts, shared between replicas: each replica writes the views of its rollouts in progress and of
its recent verdicts (`operator_pb2.RolloutView`, serialised) in one hash of its own, replaced whenever they change
and renewed with its registry heartbeat, so that it lapses with the replica; every replica reads the others' every
store round (who owns a pool's rollout, whose verdict holds) and `ListRollouts` shows them. The replicas with views
are found through an index (a sorted set scored by when their views expire), not a SCAN of the key space: the
read runs every second on every replica."""

from __future__ import annotations

import time
from collections.abc import Mapping

from controlplane.store.records import text
from controlplane.store.store_base import StoreBase, ttl_ms

# An index entry outlives its views by this much before it is pruned (replicas' clocks may disagree; an entry
# whose hash has lapsed only costs an empty read).
INDEX_SLACK_S = 60.0


class RolloutsMixin(StoreBase):
    """`put_rollouts` / `list_rollouts` (see the module docstring)."""

    async def put_rollouts(self, controller_id: str, views: Mapping[str, bytes], *, ttl_s: float) -> None:
        """Replace controller_id's rollout views (pool key → serialised view; empty: none), living ttl_s.

        Raises:
            ValueError: for an empty controller_id or ttl_s not > 0 (nothing is then written).
            StoreUnavailable: when Redis fails.
        """
        if not controller_id:
            raise ValueError("controller_id must not be empty")
        lifetime_ms = ttl_ms(ttl_s)
        key = self._keys.rollouts(controller_id)
        async with self._operation("put_rollouts"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                if views:
                    pipe.hset(key, mapping=dict(views))
                    pipe.pexpire(key, lifetime_ms)
                await pipe.execute()
            if views:
                await self._redis.zadd(self._keys.rollouts_index, {controller_id: time.time() + ttl_s})

    async def list_rollouts(self) -> dict[str, list[bytes]]:
        """Every replica's rollout views: controller id → its serialised views (replicas without any left out).

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("list_rollouts"):
            index = self._keys.rollouts_index
            await self._redis.zremrangebyscore(index, "-inf", f"({time.time() - INDEX_SLACK_S!r}")
            owners = [text(owner) for owner in await self._redis.zrange(index, 0, -1)]
            rows = await self._batched([self._keys.rollouts(owner) for owner in owners],
                                       lambda pipe, key: pipe.hgetall(key))
        return {owner: list(row.values()) for owner, row in zip(owners, rows, strict=True) if row}
