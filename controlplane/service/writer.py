"""One writer for the store: decisions coalesced (latest per engine) and written in pipelined batches.

A decision is pushed to its engine before it is persisted; `DecisionWriter.submit` only records it
(O(1), never awaits), so a slow or dead store never delays a push. One task drains the pending map:
every `flush_interval_s` (or as soon as `batch_size` decisions wait) it writes them with one
`RedisStore.put_decisions` call (pipelined, one round trip per slot group), batch_size at a time: packing and
parsing a batch holds the event loop (512 decisions 42–95 ms, 128 decisions 11–13 ms, measured against an
embedded redis-server), and after a fleet-wide change thousands wait at once. A failed write keeps the
decisions pending — unless a newer one for the same engine arrived meanwhile — and the task backs off
by `retry_s`. The store's connection pool bounds the connections; this task is their only writer of
decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from controlplane.api.v1 import common_pb2
from controlplane.store import DecisionWrite, Store, StoreUnavailable

logger = logging.getLogger(__name__)


class DecisionWriter:
    """Coalescing, pipelined decision persistence (see the module docstring). Use from one event loop."""

    def __init__(self, store: Store, *, on_failure: Callable[[str, Exception], None],
                 on_success: Callable[[], None], flush_interval_s: float = 0.05, batch_size: int = 128,
                 retry_s: float = 1.0) -> None:
        self._store = store
        self._on_failure = on_failure
        self._on_success = on_success
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._retry_s = retry_s
        self._pending: dict[str, DecisionWrite] = {}
        self._wakeup = asyncio.Event()
        self.num_written = 0
        self.num_batches = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def submit(self, engine_id: str, *, pool_key: str, decision: common_pb2.Decision) -> None:
        """Record a decision to persist (replaces an unwritten older one of the same engine)."""
        self._pending[engine_id] = DecisionWrite(engine_id=engine_id, pool_key=pool_key, decision=decision)
        if len(self._pending) >= self._batch_size:
            self._wakeup.set()

    async def flush(self) -> bool:
        """Write everything pending now; True when nothing is left pending."""
        while self._pending:
            batch = list(self._pending.values())[: self._batch_size]
            try:
                await self._store.put_decisions(batch)
            except StoreUnavailable as exc:
                self._on_failure("put_decisions", exc)
                return False
            self.num_written += len(batch)
            self.num_batches += 1
            for write in batch:
                if self._pending.get(write.engine_id) is write:
                    del self._pending[write.engine_id]
            self._on_success()
        return True

    async def run(self) -> None:
        """The writer task: flush on a short interval, back off while the store fails."""
        await flush_forever(self._wakeup, lambda: bool(self._pending), self.flush, interval_s=self._flush_interval_s,
                            retry_s=self._retry_s)


async def flush_forever(wakeup: asyncio.Event, pending: Callable[[], bool], flush: Callable[[], Awaitable[bool]], *,
                        interval_s: float, retry_s: float) -> None:
    """A store writer's task: every `interval_s`, or as soon as `wakeup` is set, `flush()` what is `pending()`;
    after a flush that left work (the store failed), wait `retry_s` before the next."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wakeup.wait(), timeout=interval_s)
        wakeup.clear()
        if pending() and not await flush():
            await asyncio.sleep(retry_s)
