"""Version epochs for opening streams, reserved in batches.

Every stream that opens needs a new epoch from the store (`RedisStore.reserve_epochs`) before its engine
gets a new version. When many streams open at once (a controller restart, a rebalance after a scale-up,
thousands of engines), one store call per stream queues behind the connection pool; `EpochReserver`
gathers the reservations made within `gather_s` into one pipelined call.
"""

from __future__ import annotations

import asyncio
import contextlib

from controlplane.store import Store, StoreUnavailable


class EpochReserver:
    """Batches `reserve` calls into `RedisStore.reserve_epochs`. Use from one event loop."""

    def __init__(self, store: Store, *, gather_s: float = 0.002) -> None:
        self._store = store
        self._gather_s = gather_s
        self._pending: dict[str, list[asyncio.Future[int]]] = {}
        self._flush: asyncio.Future[None] | None = None

    async def reserve(self, engine_id: str, *, timeout_s: float) -> int:
        """A new epoch for engine_id; raises StoreUnavailable or TimeoutError (after timeout_s)."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(engine_id, []).append(future)
        if self._flush is None:
            self._flush = asyncio.ensure_future(self._run())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=timeout_s)
        finally:
            if not future.done():
                future.cancel()

    async def _run(self) -> None:
        await asyncio.sleep(self._gather_s)  # let the streams opening now join this batch
        batch, self._pending, self._flush = self._pending, {}, None
        try:
            epochs = await self._store.reserve_epochs(list(batch))
            failure: Exception = StoreUnavailable("reserve_epochs: no epoch returned for this engine")
        except Exception as exc:  # handed to every waiter
            epochs, failure = {}, exc
        for engine_id, futures in batch.items():
            for future in futures:
                if future.done():
                    continue
                with contextlib.suppress(asyncio.InvalidStateError):
                    if engine_id in epochs:
                        future.set_result(epochs[engine_id])
                    else:
                        future.set_exception(failure)
