"""Fleet-wide WatchDecisions: the decisions other replicas push, followed through the pools' history streams.

A replica hands its own engines' decisions to its watchers as it pushes them (`Controller.watch`). Every
accepted decision write is also appended to its pool's history stream (`RedisStore.put_decisions`), whichever
replica wrote it; `follow_history` reads those streams from their latest entries when it started, every
POLL_S, and hands the watchers the entries of engines whose stream is not open on this replica
(`Controller.offer_remote`; the others arrive directly, so each decision is seen once). Streams are found in
the store's history index every SCAN_INTERVAL_S, and by a SCAN of the keyspace at the start and every
FULL_SCAN_INTERVAL_S (`RedisStore.history_streams`: the SCAN finds streams only replicas of an earlier
release append to, which do not index them); one that appears later (a new pool) is read from its first
entry. One follower serves all of a replica's watchers (`SharedFollower`): the store's load does not grow
with them, nor, between the full scans, with the number of keys in the store.

A decision of another replica reaches the watcher up to POLL_S (plus a store round trip) after it was written.
A store that fails leaves the watch to the replica's own engines until it answers again (logged once per
failure spell); entries appended meanwhile are still read then, from where the follower had got to (when it
had read the streams' positions before the failure; else it starts from their latest entries then).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from controlplane.service.controller import Controller
from controlplane.service.watchers import Pushed
from controlplane.store import Store, StoreUnavailable

logger = logging.getLogger(__name__)

POLL_S = 0.5
SCAN_INTERVAL_S = 5.0
FULL_SCAN_INTERVAL_S = 300.0
PER_STREAM = 256  # entries read per stream and poll; a stream with more is read on at the next poll


class SharedFollower:
    """One `follow_history` task per replica, running while at least one watcher is open."""

    def __init__(self, controller: Controller, store: Store) -> None:
        self._controller = controller
        self._store = store
        self._watchers = 0
        self._task: asyncio.Task[None] | None = None
        self._positioned = asyncio.Event()

    async def join(self, *, wait_s: float) -> bool:
        """A watcher opened: start following when it is the first, and wait (at most wait_s) until the
        follower has read where the streams stand, so that every decision written after this returns reaches
        the watcher. Returns False when it had not after wait_s (a store that does not answer: the watch
        starts with this replica's own engines, the others' follow once the store answers)."""
        self._watchers += 1
        if self._task is None or self._task.done():
            self._positioned = asyncio.Event()
            self._task = asyncio.create_task(follow_history(self._controller, self._store,
                                                            on_positioned=self._positioned.set))
        try:
            await asyncio.wait_for(self._positioned.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    def leave(self) -> None:
        """A watcher closed: stop following when it was the last."""
        self._watchers = max(0, self._watchers - 1)
        if self._watchers == 0 and self._task is not None:
            self._task.cancel()
            self._task = None


async def follow_history(controller: Controller, store: Store, *, poll_s: float = POLL_S,
                         scan_interval_s: float = SCAN_INTERVAL_S, full_scan_interval_s: float = FULL_SCAN_INTERVAL_S,
                         clock: Callable[[], float] = time.monotonic,
                         on_positioned: Callable[[], None] = lambda: None) -> None:
    """Hand `controller`'s watchers every decision appended to a history stream after its first read of the
    streams' positions (`on_positioned` is called then), of engines it does not hold, until cancelled (see
    the module docstring)."""
    positions: dict[str, str] | None = None  # stream → the id read up to; None until the first scan
    scanned_at = full_scan_at = -math.inf
    failing = False
    while True:
        try:
            if clock() - scanned_at >= scan_interval_s:
                full = clock() - full_scan_at >= full_scan_interval_s
                streams = await store.history_streams(scan=full)
                if full:
                    full_scan_at = clock()
                if positions is None:
                    positions = await store.history_last_ids(streams)
                    on_positioned()
                else:
                    positions.update({stream: "0-0" for stream in streams if stream not in positions})
                scanned_at = clock()
            if positions:
                for stream, entry in await store.read_history_after(positions, count=PER_STREAM):
                    positions[stream] = entry["id"]
                    _offer(controller, entry)
            if failing:
                logger.info("fleet-wide watch: the store answers again")
            failing = False
        except StoreUnavailable as exc:
            if not failing:
                logger.warning("fleet-wide watch: other replicas' decisions not readable (%s); this replica's "
                               "own engines only until the store answers", exc)
            failing = True
        except Exception:  # a bug here must not end the watch of this replica's own engines, nor go unseen
            logger.exception("fleet-wide watch: reading the history failed; retrying")
        await asyncio.sleep(poll_s)


def _offer(controller: Controller, entry: dict[str, Any]) -> None:
    decision, engine_id = entry.get("decision"), entry.get("engine_id")
    if decision is not None and engine_id:
        controller.offer_remote(Pushed(engine_id=engine_id, pool_key=entry.get("pool", ""), decision=decision))
