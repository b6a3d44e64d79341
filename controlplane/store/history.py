"""The decision-history part of `RedisStore`: each pool's capped history stream of accepted decisions, its
index (a sorted set of stream keys by renewal time, so the fleet-wide watch finds streams without a SCAN),
and the reads of it (newest entries, entries after given ids for a follower).

History is appended after the decisions' guarded writes (not atomic with them; see `redis_store`), spread
over the cluster by pool; a stream's expiry is renewed at most once per renewal interval.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.store.cooperative import map_yielding
from controlplane.store.decisions import DecisionWrite, history_entry, history_fields, stream_id_order
from controlplane.store.errors import REDIS_FAILURES, StoreUnavailable
from controlplane.store.records import text
from controlplane.store.scripts import ZREM_IF_BELOW, ScriptCall, run_script
from controlplane.store.store_base import STREAM_PAGE, StoreBase

logger = logging.getLogger(__name__)
# Pools whose history renewal times are kept before those older than the renewal interval are dropped.
_RENEWAL_RECORD_MAX = 4096


class HistoryMixin(StoreBase):
    """Append to and read the pools' history streams (see the module docstring)."""

    async def _append_history(self, accepted: Sequence[DecisionWrite]) -> None:
        """Append the accepted writes to their pools' history streams; a failure is logged, not raised."""
        try:
            async with self._operation("append_history"), self._redis.pipeline(transaction=False) as pipe:
                keys = [self._keys.history(write.pool_key) for write in accepted]
                due = self._history_keys_due(keys)
                for key, write in zip(keys, accepted, strict=True):
                    pipe.xadd(key, history_fields(write), maxlen=self._history_maxlen, approximate=True)
                if self._retention_arg != "0":
                    for key in due:
                        # A pool nobody decides for any more (any agent may name a new one) is not kept forever.
                        pipe.pexpire(key, int(self._retention_arg))
                if due:
                    pipe.zadd(self._keys.history_index, dict.fromkeys(due, time.time()))
                replies = await pipe.execute(raise_on_error=False)
            failed = [r for r in replies if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            now_s = time.monotonic()
            self._history_renewed_at.update(dict.fromkeys(due, now_s))
        except (StoreUnavailable, *REDIS_FAILURES) as err:
            logger.warning("%d accepted decisions may lack their history entries: %s", len(accepted), err)

    def _history_keys_due(self, keys: Sequence[str]) -> list[str]:
        """The distinct history `keys` not renewed and indexed by this store within the index interval (the
        renewal interval; hourly without a retention). Entries older than the interval are forgotten, so the
        record stays as small as the set of pools decided for lately."""
        now_s = time.monotonic()
        renewed_at = self._history_renewed_at
        if len(renewed_at) > _RENEWAL_RECORD_MAX:
            self._history_renewed_at = renewed_at = {
                key: at_s for key, at_s in renewed_at.items() if now_s - at_s < self._history_index_s}
        return sorted(key for key in set(keys) if now_s - renewed_at.get(key, -math.inf) >= self._history_index_s)

    async def read_history(self, count: int, *, pool_key: str | None = None) -> list[dict[str, Any]]:
        """The latest `count` entries of the decision history, newest first.

        Each entry has "id" (stream id), "engine_id", "version", "mode" (e.g. "MODE_EB"), "k", "n",
        "reason", "decided_at_s", "pool" as strings, and "decision" (the parsed `Decision`, None if
        its payload does not parse) instead of the raw "payload".

        Args:
            count: how many entries, at least 1.
            pool_key: read this pool's stream only; None merges every pool's stream by stream id (the
                servers' millisecond clocks: entries of different pools written in the same millisecond, or
                on servers whose clocks differ, may appear in either order).

        Raises:
            ValueError: when count < 1.
            StoreUnavailable: when Redis fails.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        async with self._operation("read_history"):
            streams = ([self._keys.history(pool_key)] if pool_key is not None
                       else await self._scan(self._keys.history_pattern))
            if count <= STREAM_PAGE:
                replies = await self._batched(streams, lambda pipe, key: pipe.xrevrange(key, count=count))
            else:
                replies = [await self._newest_entries(stream, count) for stream in streams]
        raw = [(stream, entry_id, fields) for stream, reply in zip(streams, replies, strict=True)
               for entry_id, fields in reply]
        entries = await map_yielding(lambda row: history_entry(row[1], row[2], stream=row[0]), raw)
        entries.sort(key=lambda entry: stream_id_order(entry["id"]), reverse=True)
        return entries[:count]

    async def history_last_ids(self, streams: Sequence[str]) -> dict[str, str]:
        """The id of the latest entry of each history stream ("0-0" for one that has none): `read_history_after`
        from them returns what is appended afterwards.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        streams = list(streams)
        async with self._operation("history_last_ids"):
            replies = await self._batched(streams, lambda pipe, key: pipe.xrevrange(key, count=1))
        return {stream: text(reply[0][0]) if reply else "0-0" for stream, reply in zip(streams, replies, strict=True)}

    async def history_streams(self, *, scan: bool = False) -> list[str]:
        """The key of every pool's decision history stream: the history index's members, and, with `scan` or
        when the index is empty (a store written by an earlier release), the streams a SCAN finds (every
        primary of a cluster). A stream only an earlier release's replicas append to is in the index once a
        replica of this release appends to it; until then only a SCAN finds it.

        With a retention, an index entry not renewed within it (plus one renewal interval) is checked: removed
        when its stream is gone, re-stamped now when the stream still exists. The stream may be kept by a
        replica configured with a longer retention (or none), which renews its entries less often than this
        one would expire them.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("history_streams"):
            index = self._keys.history_index
            if self._retention_arg != "0":
                await self._prune_history_index(index)
            streams = [text(key) for key in await self._redis.zrange(index, 0, -1)]
            if scan or not streams:
                streams = list(dict.fromkeys([*streams, *await self._scan(self._keys.history_pattern)]))
            return streams

    async def _prune_history_index(self, index: str) -> None:
        """Remove the index entries past this store's retention whose stream is gone; re-stamp the others."""
        # a stream expires the retention (`_retention_arg`, ms) after its latest renewal; one renewal interval
        # of slack for replicas whose clocks disagree
        now_s = time.time()
        oldest_s = now_s - int(self._retention_arg) / 1000.0 - self._history_renewal_s
        stale = [text(key) for key in await self._redis.zrangebyscore(index, "-inf", f"({oldest_s!r}")]
        if not stale:
            return
        exists = await self._batched(stale, lambda pipe, key: pipe.exists(key))
        gone = [key for key, count in zip(stale, exists, strict=True) if not count]
        alive = [key for key, count in zip(stale, exists, strict=True) if count]
        if gone:  # unless a replica re-created the stream and re-stamped its entry since the ZRANGEBYSCORE
            await run_script(self._redis, ScriptCall(ZREM_IF_BELOW, [index], [repr(oldest_s), *gone]))
        if alive:  # XX: not re-adding an entry another replica removed meanwhile; GT: never moving one back
            await self._redis.zadd(index, dict.fromkeys(alive, now_s), xx=True, gt=True)

    async def read_history_after(self, after: Mapping[str, str], *, count: int) -> list[tuple[str, dict[str, Any]]]:
        """(stream, entry) for the entries of each stream in `after` whose id is greater than after[stream],
        oldest first within a stream, at most `count` per stream; entries as `read_history` gives them.
        Pipelined per server (each stream is one key: no cross-slot command).

        Raises:
            ValueError: when count < 1.
            StoreUnavailable: when Redis fails.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        streams = list(after)
        async with self._operation("read_history_after"):
            replies = await self._batched(streams, lambda pipe, key: pipe.xrange(key, min=f"({after[key]}",
                                                                                 count=count))
        return [(stream, history_entry(entry_id, fields, stream=stream))
                for stream, reply in zip(streams, replies, strict=True) for entry_id, fields in reply]
