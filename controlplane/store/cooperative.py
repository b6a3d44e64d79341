"""`map_yielding`: map a function over many items on the event loop without holding it: the loop runs other
work (health checks, agent batches) every `every` items. For reads that scale with the fleet or the history
(thousands of registry entries or history rows parsed in one call)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
# Items between two yields to the loop: 1-3 ms of protobuf parsing or building, so that a health check or a
# batch waits at most a few such slices behind the reads running at once (`service.read_gate`).
YIELD_EVERY = 32


async def map_yielding(function: Callable[[T], R], items: Iterable[T], *, every: int = YIELD_EVERY) -> list[R]:
    """[function(item) for item in items], letting the event loop run after every `every` items."""
    out: list[R] = []
    for index, item in enumerate(items, start=1):
        out.append(function(item))
        if index % every == 0:
            await asyncio.sleep(0)
    return out
