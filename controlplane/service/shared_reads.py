"""`SharedReads`: concurrent callers of one fleet-wide store read share one read (single flight).

ListEngines reads the whole engine registry and ListHistory up to MAX_LIST_LIMIT history entries; parsing
either costs the event loop tens of milliseconds at thousands of engines. Twenty operators (or dashboards)
asking at once would pay for it twenty times. Here a caller that asks while the same read is in flight joins
it and gets its result, so N concurrent callers cost one read. Nothing is kept once a read has answered: a
caller never gets data read before the previous read answered, and a read begun after a write sees it.

A read that fails fails for every caller joined to it (each sees the same exception); a caller that is
cancelled leaves the read running for the others. Use from one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedReads:
    """Single-flight reads by key (see the module docstring)."""

    def __init__(self) -> None:
        self._in_flight: dict[Hashable, asyncio.Future[Any]] = {}
        self.joined = 0  # calls answered by a read another caller began

    async def read(self, key: Hashable, fetch: Callable[[], Awaitable[T]]) -> T:
        """fetch()'s result, shared with every caller of the same key while it runs."""
        future = self._in_flight.get(key)
        if future is not None:
            self.joined += 1
            return await asyncio.shield(future)
        future = asyncio.ensure_future(fetch())
        self._in_flight[key] = future
        future.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(future)

    def _finished(self, key: Hashable, future: asyncio.Future[Any]) -> None:
        self._in_flight.pop(key, None)
        if not future.cancelled():
            future.exception()  # retrieved: every caller may have left (cancelled) before it failed
