"""The WatchDecisions clients of one replica: each a bounded queue that every pushed decision is handed to.

A watcher that falls behind loses events (counted in `cp_watch_events_dropped_total`), never holding up the
push path: handing on is `put_nowait`. `cp_decision_watchers` is the number of open watches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from controlplane.api.v1 import common_pb2
from controlplane.observability.metrics import ControllerMetrics

_WATCH_QUEUE = 10_000


@dataclass(frozen=True, slots=True)
class Pushed:
    """A decision handed to an engine's mailbox and to watchers."""

    engine_id: str
    pool_key: str
    decision: common_pb2.Decision


class Watchers:
    """The open watches (see the module docstring). Use from one event loop."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics
        self._queues: set[asyncio.Queue[Pushed]] = set()

    def add(self) -> asyncio.Queue[Pushed]:
        queue: asyncio.Queue[Pushed] = asyncio.Queue(maxsize=_WATCH_QUEUE)
        self._queues.add(queue)
        self._metrics.decision_watchers.set(len(self._queues))
        return queue

    def remove(self, queue: asyncio.Queue[Pushed]) -> None:
        self._queues.discard(queue)
        self._metrics.decision_watchers.set(len(self._queues))

    def hand_on(self, event: Pushed) -> None:
        """Hand every watcher the event; one that is behind loses it (counted)."""
        for queue in self._queues:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self._metrics.watchers_dropped.inc()
