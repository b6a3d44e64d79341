"""`ReadGate`: a bound on the operator reads that scale with the fleet or the history (ListEngines,
ListHistory, ListLatencyHistory), per caller and in all.

Such a read parses thousands of registry entries or history rows; it lets the event loop run every few
hundred (`store.cooperative.map_yielding`), so one read never stalls health checks or agent batches, but
many at once would still share the loop's CPU with them and hold their results in memory. A caller may run
at most MAX_PER_CALLER of them at once (a further call is refused with RESOURCE_EXHAUSTED, naming the
limit), and at most MAX_IN_ALL run at once whoever calls (the others wait their turn, up to their deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

MAX_PER_CALLER = 2
MAX_IN_ALL = 2


class ReadGate:
    """Per-caller and overall limits of heavy reads (see the module docstring). Use from one event loop."""

    def __init__(self, *, per_caller: int = MAX_PER_CALLER, in_all: int = MAX_IN_ALL) -> None:
        self._per_caller = per_caller
        self._running: dict[str, int] = {}
        self._all = asyncio.Semaphore(in_all)

    @contextlib.asynccontextmanager
    async def slot(self, context: grpc.aio.ServicerContext, caller: str, method: str) -> AsyncIterator[None]:
        """Hold a slot for one read of `caller` (aborts with RESOURCE_EXHAUSTED past the caller's limit)."""
        if self._running.get(caller, 0) >= self._per_caller:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{method}: at most {self._per_caller} ListEngines/ListHistory/ListLatencyHistory "
                                f"calls at once per caller; retry when one has answered")
        self._running[caller] = self._running.get(caller, 0) + 1
        try:
            async with self._all:
                yield
        finally:
            left = self._running[caller] - 1
            if left:
                self._running[caller] = left
            else:
                del self._running[caller]
