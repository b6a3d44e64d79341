"""Audit entries that change no record (a rollout started or ended, an operator steering one), appended to the
store's audit stream by one task, so the event that caused them never waits for the store.

`AuditWriter.submit` only queues (O(1)); `run` appends what waits every `flush_interval_s`, keeping an entry
until the store takes it. At most `max_pending` wait: past that the oldest are dropped and counted (a store down
for a long time loses the oldest rollout entries, never blocks the controller).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Callable, Mapping

from controlplane.loop.effects import RolloutEvent
from controlplane.service.writer import flush_forever
from controlplane.store import Store, StoreUnavailable

logger = logging.getLogger(__name__)


def rollout_audit(event: RolloutEvent, *, actor: str, at_s: float) -> dict[str, str]:
    """The audit entry of a rollout event (the fields `read_audit` returns)."""
    return {"action": f"rollout_{event.event}", "kind": "rollout", "scope": f"pool:{event.pool_key}",
            "actor": actor, "at_s": repr(at_s), "reason": event.reason,
            "old": json.dumps({"mode": event.from_mode}),
            "new": json.dumps({"mode": event.to_mode, "detail": event.detail}, ensure_ascii=False)}


class AuditWriter:
    """A bounded queue of audit entries and the task that appends them (see the module docstring)."""

    def __init__(self, store: Store, *, on_failure: Callable[[str, Exception], None], flush_interval_s: float = 0.5,
                 max_pending: int = 1024) -> None:
        self._store = store
        self._on_failure = on_failure
        self._flush_interval_s = flush_interval_s
        self._pending: collections.deque[Mapping[str, str]] = collections.deque()
        self._max_pending = max_pending
        self._wakeup = asyncio.Event()
        self.num_dropped = 0

    def submit(self, entry: Mapping[str, str]) -> None:
        self._pending.append(entry)
        if len(self._pending) > self._max_pending:
            self._pending.popleft()
            self.num_dropped += 1
            logger.warning("audit entries dropped: %d waited for the store (%d dropped so far)", self._max_pending,
                           self.num_dropped)
        self._wakeup.set()

    async def flush(self) -> bool:
        """Append everything pending; True when nothing is left."""
        while self._pending:
            try:
                await self._store.append_audit(self._pending[0])
            except StoreUnavailable as exc:
                self._on_failure("append_audit", exc)
                return False
            self._pending.popleft()
        return True

    async def run(self) -> None:
        await flush_forever(self._wakeup, lambda: bool(self._pending), self.flush, interval_s=self._flush_interval_s,
                            retry_s=self._flush_interval_s)
