"""Guarded rollouts in progress, shared between replicas: each replica writes the views of the rollouts it runs
(`operator_pb2.RolloutView`, serialised, by pool key) in one hash of its own, replaced whenever they change and
renewed with its registry heartbeat, so that it lapses with the replica; `ListRollouts` on any replica shows every
replica's."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.store.store_base import StoreBase, ttl_ms


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
        async with self._operation("put_rollouts"), self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if views:
                pipe.hset(key, mapping=dict(views))
                pipe.pexpire(key, lifetime_ms)
            await pipe.execute()

    async def list_rollouts(self) -> dict[str, list[bytes]]:
        """Every replica's rollout views: controller id → its serialised views.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("list_rollouts"):
            present = await self._hashes(self._keys.rollouts_pattern)
        return {self._keys.rollouts_owner(key): list(row.values()) for key, row in present}
