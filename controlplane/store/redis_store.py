"""`RedisStore`: the controller's durable state in Redis (decisions, history, epochs, overrides, audit,
registry, calibrations, shared pool statistics) and the pub/sub that propagates override changes across
controller replicas, on one server, a Sentinel-managed master or a Redis Cluster. Open one with
`create_store(url)`; the URL says which (details and query options: `controlplane.store.urls`):

    redis://[[user]:password@]host[:port][/db]      rediss://... (TLS)      unix:///path/redis.sock[?db=N]
    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/<service_name>[/db]
    redis+cluster://[[user]:password@]host[:port][,host[:port]...]
    (rediss+sentinel:// and rediss+cluster:// with TLS)

The key layout and its Cluster hash tags: `controlplane.store.keys`.

Contracts:
- Decisions are versioned per engine: a write whose version is not above the stored one is refused
  (checked and applied in one Lua script on the engine's slot, so concurrent replicas cannot interleave).
  `put_decisions` sends a whole batch pipelined: one round trip per server involved.
- History: every accepted write is appended to its pool's history stream (capped, MAXLEN ~) in a second
  pipelined round trip after the guarded writes. The trade-off: the engine's decision and its pool's
  stream live in different slots, so the append is not atomic with the write. A Redis failure between the
  two leaves an accepted decision without its history entry (logged; the decision itself is durable and is
  the source of truth), and when two replicas race for one engine their entries may land out of version
  order. In return the history spreads over the cluster by pool, a chatty pool only trims its own history,
  and `read_history(pool_key=...)` reads one pool without filtering the fleet's.
- Epochs: `reserve_epoch` INCRs the engine's epoch and never returns an epoch at or below the one of the
  engine's stored decision version; versions are epoch · 10^9 + sequence (`fencing`).
- Retention: with `engine_retention_s` > 0, an engine's decision and epoch keys expire that long after its
  last decision write or epoch reservation (an engine id seen once does not stay in Redis forever), a
  pool's history stream 0.9–1× that long after its latest entry (its expiry is renewed at most once per
  tenth of the retention, or per hour if that is shorter: nor does a pool name stay), and epochs are floored
  at the server's Unix time so that versions still increase after an expiry; 0 keeps them forever.
- An override or calibration change writes the record, appends an audit entry and (overrides) publishes a
  notice in one script on the operator slot, as a compare-and-set against the record read just before, so
  the old value in the audit is exactly the one replaced.
- Overrides with an expiry are dropped by Redis (PEXPIREAT); readers also skip those already past
  their expiry at the `now_s` they pass in, since Redis expires keys lazily.
- Pool statistics, rollout views and latency samples (`store.rollouts`, `store.latency_history`) are opaque
  bytes, stored and returned byte for byte.
- At most `max_connections` operations run at once (more wait up to `pool_timeout_s`), so the pool
  never overflows however many engines a replica serves.
- Every Redis failure raises `StoreUnavailable` naming the operation (reads and writes alike); bad
  arguments raise `ValueError` before Redis is contacted. Only `ping()` never raises.

The store reads no clock except where a method documents a wall-clock default; it keeps only its connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.store.cooperative import map_yielding
from controlplane.store.decisions import (
    DecisionWrite,
    decision_fields,
)
from controlplane.store.errors import REDIS_FAILURES, StoreUnavailable
from controlplane.store.history import HistoryMixin
from controlplane.store.keys import override_kind_name, pool_key, scope_key
from controlplane.store.latency_history import LatencyHistoryMixin
from controlplane.store.notices import RESYNC, OverrideNotice, decode_notice, encode_notice
from controlplane.store.pool_statistics import PoolStatisticsMixin
from controlplane.store.records import is_expired, parse_payload, record_json, stream_entries, text, text_fields
from controlplane.store.rollouts import RolloutsMixin
from controlplane.store.scripts import (
    CHANGE_RECORD,
    HSET_WITH_TTL,
    PUT_DECISION,
    RESERVE_EPOCH,
    ScriptCall,
    run_script,
    run_scripts,
)
from controlplane.store.store_base import (
    DEFAULT_AUDIT_MAXLEN,
    DEFAULT_HISTORY_MAXLEN,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PREFIX,
    ttl_ms,
)

__all__ = ["DEFAULT_AUDIT_MAXLEN", "DEFAULT_HISTORY_MAXLEN", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_PREFIX",
           "RedisStore", "create_store"]

logger = logging.getLogger(__name__)

_MAX_CAS_ATTEMPTS = 32


class RedisStore(HistoryMixin, PoolStatisticsMixin, RolloutsMixin, LatencyHistoryMixin):
    """The store over one Redis (or Valkey) deployment, through `redis.asyncio`.

    Construct with `RedisStore(url, ...)` or `create_store(url, ...)` (arguments: `StoreBase.__init__`).
    Create it inside the event loop that uses it; `close()` (or `async with`) releases the connections.
    """

    # ---- decisions -------------------------------------------------------------------------------------

    async def put_decision(self, engine_id: str, *, pool_key: str, decision: common_pb2.Decision) -> bool:
        """Store `decision` as the latest of `engine_id` and append it to its pool's history stream.

        Returns:
            True when written; False (nothing written, no history entry) when the stored version is
            greater than or equal to decision.version.

        Raises:
            ValueError: for an empty engine_id.
            StoreUnavailable: when Redis fails.
        """
        [written] = await self._put_decisions([DecisionWrite(engine_id, pool_key, decision)], "put_decision")
        return written

    async def put_decisions(self, writes: Sequence[DecisionWrite]) -> list[bool]:
        """Store a batch of decisions, each version-guarded as in `put_decision`, pipelined.

        One round trip per server involved for the guarded writes (plus one per server for the history
        entries of the accepted ones). Writes for one engine apply in the given order.

        Returns:
            For each write, in order: True when written, False when the stored version was greater than
            or equal to its version (which includes an earlier attempt of the same write that succeeded).

        Raises:
            ValueError: when an element is not a DecisionWrite.
            StoreUnavailable: when Redis fails for any of the writes (some may have been applied; repeating
                the batch is safe: applied ones then answer False).
        """
        return await self._put_decisions(writes, "put_decisions")

    async def _put_decisions(self, writes: Sequence[DecisionWrite], operation: str) -> list[bool]:
        for write in writes:
            if not isinstance(write, DecisionWrite):
                raise ValueError(f"{operation} takes DecisionWrite items, got {type(write).__name__}")
        if not writes:
            return []
        calls = [ScriptCall(PUT_DECISION, [self._keys.decision(w.engine_id), self._keys.epoch(w.engine_id)],
                            [*decision_fields(w), self._retention_arg]) for w in writes]
        async with self._operation(operation):
            replies = await run_scripts(self._redis, calls)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise StoreUnavailable(operation, reply) from reply
        written = [bool(reply) for reply in replies]
        accepted = [w for w, ok in zip(writes, written, strict=True) if ok]
        if len(accepted) < len(writes):
            logger.debug("%d of %d decision writes refused: not newer than the stored ones",
                         len(writes) - len(accepted), len(writes))
        if accepted:
            await self._append_history(accepted)
        return written

    async def get_decision(self, engine_id: str) -> common_pb2.Decision | None:
        """The latest decision of `engine_id`, or None when there is none (or it does not parse, logged).

        Raises:
            StoreUnavailable: when Redis fails.
        """
        entry = await self.get_decision_entry(engine_id)
        return entry[1] if entry is not None else None

    async def get_decision_entry(self, engine_id: str) -> tuple[str, common_pb2.Decision] | None:
        """(pool key, latest decision) of `engine_id`, or None (see `get_decision`).

        Raises:
            StoreUnavailable: when Redis fails.
        """
        key = self._keys.decision(engine_id)
        async with self._operation("get_decision"):
            pool, raw = await self._redis.hmget(key, "pool", "payload")
        decision = parse_payload(common_pb2.Decision, raw, key=key)
        return (text(pool or b""), decision) if decision is not None else None

    async def load_decisions(self) -> dict[str, tuple[str, common_pb2.Decision]]:
        """Every stored decision: engine_id → (pool_key, decision). Uses SCAN (every node of a cluster).

        Raises:
            StoreUnavailable: when Redis fails.
        """
        decisions: dict[str, tuple[str, common_pb2.Decision]] = {}
        async with self._operation("load_decisions"):
            keys = await self._scan(self._keys.decision_pattern)
            rows = await self._batched(keys, lambda pipe, key: pipe.hmget(key, "pool", "payload"))
        for key, (pool, payload) in zip(keys, rows, strict=True):
            if payload is None:
                continue  # deleted between SCAN and HMGET
            decision = parse_payload(common_pb2.Decision, payload, key=key)
            if decision is not None:
                decisions[self._keys.engine_id_of(key, kind="decision")] = (text(pool or b""), decision)
        return decisions

    # ---- epochs (version fencing) ----------------------------------------------------------------------

    async def reserve_epoch(self, engine_id: str) -> int:
        """A new epoch for `engine_id`: its epoch counter incremented atomically.

        Call it whenever an engine's stream opens on a replica and number the engine's decisions
        `fencing.compose_version(epoch, seq)`. The epoch is also above the epoch of the engine's stored
        decision version, so versions keep increasing even if the counter was lost; with a retention it is
        also above the server's Unix time in seconds (see `engine_retention_s`).

        Raises:
            ValueError: for an empty engine_id.
            StoreUnavailable: when Redis fails (or the counter holds something that is not an integer).
        """
        if not engine_id:
            raise ValueError("engine_id must not be empty")
        call = ScriptCall(RESERVE_EPOCH, [self._keys.epoch(engine_id), self._keys.decision(engine_id)],
                          [self._retention_arg])
        async with self._operation("reserve_epoch"):
            return int(await run_script(self._redis, call))

    async def reserve_epochs(self, engine_ids: Sequence[str]) -> dict[str, int]:
        """`reserve_epoch` for many engines in one pipelined round trip (per server): what a replica does
        when many streams open at once (a restart, a rebalance).

        Returns:
            engine id → its new epoch, for every engine whose reservation succeeded (a failed one is
            absent, so the caller can fall back for it alone).
        Raises:
            ValueError: for an empty engine id.
            StoreUnavailable: when Redis fails as a whole.
        """
        if any(not engine_id for engine_id in engine_ids):
            raise ValueError("engine ids must not be empty")
        unique = list(dict.fromkeys(engine_ids))
        calls = [ScriptCall(RESERVE_EPOCH, [self._keys.epoch(e), self._keys.decision(e)], [self._retention_arg])
                 for e in unique]
        async with self._operation("reserve_epochs"):
            replies = await run_scripts(self._redis, calls)
        return {engine_id: int(reply) for engine_id, reply in zip(unique, replies, strict=True)
                if not isinstance(reply, Exception)}

    async def current_epoch(self, engine_id: str) -> int:
        """The last epoch reserved for `engine_id`; 0 when none was.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("current_epoch"):
            raw = await self._redis.get(self._keys.epoch(engine_id))
        return 0 if raw is None else int(raw)

    # ---- overrides -------------------------------------------------------------------------------------

    async def set_override(
        self, record: operator_pb2.OverrideRecord, *, actor: str, now_s: float | None = None
    ) -> operator_pb2.OverrideRecord | None:
        """Store an override, replacing the one of the same kind and scope; audit and announce it.

        The stored copy has set_by = actor, set_at_s = now_s when record.set_at_s is 0, and cleared =
        False. With record.expires_at_s > 0 Redis drops it at that Unix time (PEXPIREAT); 0 never
        expires (a previous expiry is removed).

        Args:
            record: the override; its scope and kind (DELTA or PIN) select the key.
            actor: the caller's identity, recorded in set_by and in the audit.
            now_s: Unix seconds of the change; None reads the wall clock.

        Returns:
            The override it replaced, or None when there was none (or it had expired).

        Raises:
            ValueError: for an invalid scope or kind.
            StoreUnavailable: when Redis fails; nothing is then written.
        """
        at_s = time.time() if now_s is None else now_s
        kind = override_kind_name(record.kind)
        scope = scope_key(record.scope)
        stored = operator_pb2.OverrideRecord()
        stored.CopyFrom(record)
        stored.set_by = actor
        stored.cleared = False
        if stored.set_at_s == 0.0:
            stored.set_at_s = at_s
        fields: dict[str, str | bytes] = {
            "record": stored.SerializeToString(deterministic=True),
            "kind": kind,
            "scope": scope,
            "set_by": actor,
            "expires_at_s": repr(stored.expires_at_s),
        }
        expire_at_ms = math.ceil(stored.expires_at_s * 1000.0) if stored.expires_at_s > 0.0 else 0
        notice = OverrideNotice(action="set", kind=kind, scope=scope, actor=actor, at_s=at_s)
        return await self._change_override(
            self._keys.override(kind, scope), fields, expire_at_ms=expire_at_ms, operation="set_override",
            notice=notice, reason=stored.reason, new=stored,
        )

    async def clear_override(
        self,
        scope: operator_pb2.Scope,
        kind: operator_pb2.OverrideKind,
        *,
        actor: str,
        reason: str,
        now_s: float | None = None,
    ) -> operator_pb2.OverrideRecord | None:
        """Remove the override of `kind` at `scope`; audit and announce it (also when there was none).

        Args:
            scope: the override's scope.
            kind: OVERRIDE_KIND_DELTA or OVERRIDE_KIND_PIN.
            actor: the caller's identity, recorded in the audit.
            reason: recorded in the audit.
            now_s: Unix seconds of the change; None reads the wall clock.

        Returns:
            The override removed, or None when there was none (or it had expired).

        Raises:
            ValueError: for an invalid scope or kind.
            StoreUnavailable: when Redis fails; nothing is then removed.
        """
        at_s = time.time() if now_s is None else now_s
        kind_name = override_kind_name(kind)
        scope_name = scope_key(scope)
        notice = OverrideNotice(action="clear", kind=kind_name, scope=scope_name, actor=actor, at_s=at_s)
        return await self._change_override(
            self._keys.override(kind_name, scope_name), {}, expire_at_ms=0, operation="clear_override",
            notice=notice, reason=reason, new=None,
        )

    async def list_overrides(self, now_s: float) -> list[operator_pb2.OverrideRecord]:
        """Every override in force at `now_s` (Unix seconds), sorted by kind then scope key.

        Overrides with 0 < expires_at_s <= now_s are skipped even if Redis still holds them.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("list_overrides"):
            keys = await self._scan(self._keys.override_pattern)
            raws = await self._batched(keys, lambda pipe, key: pipe.hget(key, "record"))
        in_force = []
        for key, raw in sorted(zip(keys, raws, strict=True)):  # by key: kind, then scope key
            record = parse_payload(operator_pb2.OverrideRecord, raw, key=key)
            if record is not None and not is_expired(record, now_s=now_s):
                in_force.append(record)
        return in_force

    async def append_audit(self, entry: Mapping[str, str]) -> None:
        """Append one audit entry that changes no record (a rollout started or ended, an operator's steering of
        one): the fields as `read_audit` returns them ("action", "kind", "scope", "actor", "at_s", "reason",
        "old", "new").

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("append_audit"):
            await self._redis.xadd(self._keys.audit, dict(entry), maxlen=self._audit_maxlen, approximate=True)

    async def read_audit(self, count: int) -> list[dict[str, str]]:
        """The latest `count` audit entries, newest first.

        Each entry has "id" (stream id), "action" ("set" | "clear" | "calibration"), "kind", "scope" (a
        scope key, or the pool key of a calibration), "actor", "at_s", "reason", "old" and "new" (one-line
        JSON of the records with proto field names, "" for none).

        Raises:
            ValueError: when count < 1.
            StoreUnavailable: when Redis fails.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        async with self._operation("read_audit"):
            entries = await self._redis.xrevrange(self._keys.audit, count=count)
        return stream_entries(entries)

    async def watch_overrides(
        self, *, retry_delay_s: float = 0.2, max_retry_delay_s: float = 5.0
    ) -> AsyncIterator[OverrideNotice]:
        """Yield every override change notice published by any replica, forever.

        Yields `RESYNC` (action "resync") after every successful (re)subscription, the first included:
        notices published while not subscribed are lost, so reload all overrides then. When the
        connection drops (a restart, a Sentinel failover, a cluster node lost), it subscribes again
        (redis-py reconnects at once — to the new master behind Sentinel, to the slot's new owner on a
        cluster; if Redis stays down it retries with exponential backoff from retry_delay_s up to
        max_retry_delay_s seconds). Never raises StoreUnavailable; stop it by cancelling the consuming
        task or closing the generator, e.g.
        `async with contextlib.aclosing(store.watch_overrides()) as notices: async for n in notices: ...`.
        """
        delay_s = retry_delay_s
        while True:
            pubsub = None
            try:
                pubsub = await self._connections.pubsub()
                await pubsub.subscribe(self._keys.overrides_channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        delay_s = retry_delay_s
                        yield RESYNC
                    elif message["type"] == "message":
                        notice = decode_notice(message["data"])
                        if notice is not None:
                            yield notice
            except REDIS_FAILURES as err:
                logger.warning("override watch lost Redis (%s); resubscribing in %.2f s", err, delay_s)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(*REDIS_FAILURES):
                        await pubsub.aclose()
            await asyncio.sleep(delay_s)
            delay_s = min(2.0 * delay_s, max_retry_delay_s)

    # ---- engine registry -------------------------------------------------------------------------------

    async def heartbeat(self, engine_id: str, *, info: Mapping[str, str], ttl_s: float) -> None:
        """Register `engine_id` with `info` (replacing the previous fields) for the next ttl_s seconds.

        Raises:
            ValueError: for an empty engine_id or info (Redis has no empty hashes), or ttl_s not > 0.
            StoreUnavailable: when Redis fails.
        """
        await self._heartbeats({engine_id: info}, ttl_s=ttl_s, operation="heartbeat")

    async def heartbeats(self, entries: Mapping[str, Mapping[str, str]], *, ttl_s: float) -> None:
        """`heartbeat` for many engines at once, pipelined (one round trip per server involved).

        Raises:
            ValueError: for an empty engine_id or info, or ttl_s not > 0 (nothing is then written).
            StoreUnavailable: when Redis fails for any of them.
        """
        await self._heartbeats(entries, ttl_s=ttl_s, operation="heartbeats")

    async def _heartbeats(self, entries: Mapping[str, Mapping[str, str]], *, ttl_s: float, operation: str) -> None:
        lifetime_ms = ttl_ms(ttl_s)
        calls = []
        for engine_id, info in entries.items():
            if not engine_id:
                raise ValueError("engine_id must not be empty")
            if not info:
                raise ValueError(f"info of engine {engine_id!r} must have at least one field")
            items = [item for pair in info.items() for item in pair]
            calls.append(ScriptCall(HSET_WITH_TTL, [self._keys.engine(engine_id)], [lifetime_ms, "1", *items]))
        if not calls:
            return
        async with self._operation(operation):
            replies = await run_scripts(self._redis, calls)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise StoreUnavailable(operation, reply) from reply

    async def list_registry(self) -> dict[str, dict[str, str]]:
        """Every registered (unexpired) engine: engine_id → its info.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("list_registry"):
            present = await self._hashes(self._keys.engine_pattern, per_pipeline=100)
        parsed = await map_yielding(lambda item: (self._keys.engine_id_of(item[0], kind="engine"),
                                                  text_fields(item[1])), present)
        return dict(parsed)

    # ---- calibrations ----------------------------------------------------------------------------------

    async def put_calibration(
        self, calibration: operator_pb2.Calibration, *, actor: str = "", reason: str = ""
    ) -> None:
        """Store the cost profile of calibration.pool, replacing the previous one, and audit the change.

        In one script on the operator slot (like an override change, a compare-and-set against the
        profile read just before): the profile is written and an audit entry appended with action and
        kind "calibration", scope = the pool key, actor = `actor` (calibration.set_by when ""),
        at_s = calibration.set_at_s (the wall clock when 0), reason, and old/new one-line JSON of the
        profiles; a notice (kind "calibration") is published on the override channel.

        Raises:
            ValueError: when the pool is incomplete (see `keys.pool_key`).
            StoreUnavailable: when Redis fails; nothing is then written.
        """
        pool = pool_key(calibration.pool)
        key = self._keys.calibration(pool)
        at_s = calibration.set_at_s or time.time()
        fields: dict[str, str | bytes] = {
            "payload": calibration.SerializeToString(deterministic=True),
            "pool": pool,
            "source": calibration.source,
        }

        def audit(old_raw: bytes | None) -> dict[str, str]:
            old = parse_payload(operator_pb2.Calibration, old_raw, key=key)
            return {"action": "calibration", "kind": "calibration", "scope": pool, "actor": actor or calibration.set_by,
                    "at_s": repr(at_s), "reason": reason, "old": record_json(old), "new": record_json(calibration)}

        # Announced on the override channel like an override change, so every replica reloads the profile.
        notice = OverrideNotice(action="set", kind="calibration", scope=pool, actor=actor or calibration.set_by,
                                at_s=at_s)
        await self._compare_and_set(key, "payload", fields, audit, expire_at_ms=0,
                                    channel=self._keys.overrides_channel, notice=encode_notice(notice),
                                    operation="put_calibration")

    async def get_calibration(self, pool: common_pb2.Pool) -> operator_pb2.Calibration | None:
        """The cost profile of `pool`, or None.

        Raises:
            ValueError: when the pool is incomplete.
            StoreUnavailable: when Redis fails.
        """
        key = self._keys.calibration(pool_key(pool))
        async with self._operation("get_calibration"):
            raw = await self._redis.hget(key, "payload")
        return parse_payload(operator_pb2.Calibration, raw, key=key)

    async def list_calibrations(self) -> dict[str, operator_pb2.Calibration]:
        """Every stored cost profile: pool_key → calibration.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        async with self._operation("list_calibrations"):
            keys = await self._scan(self._keys.calibration_pattern)
            raws = await self._batched(keys, lambda pipe, key: pipe.hget(key, "payload"))
        calibrations = {}
        for key, raw in zip(keys, raws, strict=True):
            calibration = parse_payload(operator_pb2.Calibration, raw, key=key)
            if calibration is not None:
                calibrations[self._keys.pool_of_calibration(key)] = calibration
        return calibrations

    # ---- helpers ---------------------------------------------------------------------------------------

    async def _change_override(
        self,
        key: str,
        fields: Mapping[str, str | bytes],
        *,
        expire_at_ms: int,
        operation: str,
        notice: OverrideNotice,
        reason: str,
        new: operator_pb2.OverrideRecord | None,
    ) -> operator_pb2.OverrideRecord | None:
        """Replace (fields) or delete (no fields) an override; audit and publish; return the old one."""
        replaced: list[operator_pb2.OverrideRecord | None] = [None]

        def audit(old_raw: bytes | None) -> dict[str, str]:
            old = parse_payload(operator_pb2.OverrideRecord, old_raw, key=key)
            if old is not None and is_expired(old, now_s=notice.at_s):
                old = None
            replaced[0] = old
            return {"action": notice.action, "kind": notice.kind, "scope": notice.scope, "actor": notice.actor,
                    "at_s": repr(notice.at_s), "reason": reason, "old": record_json(old), "new": record_json(new)}

        await self._compare_and_set(key, "record", fields, audit, expire_at_ms=expire_at_ms,
                                    channel=self._keys.overrides_channel, notice=encode_notice(notice),
                                    operation=operation)
        logger.info("override %s %s %s by %s (%s)", notice.action, notice.kind, notice.scope, notice.actor, reason)
        return replaced[0]

    async def _compare_and_set(
        self,
        key: str,
        field: str,
        fields: Mapping[str, str | bytes],
        audit: Callable[[bytes | None], Mapping[str, str]],
        *,
        expire_at_ms: int,
        channel: str,
        notice: str,
        operation: str,
    ) -> None:
        """Read `field` of the record at `key`, then in one script (if the record is still the one read):
        replace the record by `fields` (delete it when empty), append `audit(old value)` to the audit
        stream and publish `notice` on `channel` (none when ""). Retries when another writer won."""
        items = [item for pair in fields.items() for item in pair]
        async with self._operation(operation):
            for _ in range(_MAX_CAS_ATTEMPTS):
                old_raw = await self._redis.hget(key, field)
                audit_items = [item for pair in audit(old_raw).items() for item in pair]
                args = [field, "0" if old_raw is None else "1", old_raw or b"", str(expire_at_ms),
                        str(self._audit_maxlen), channel, notice, str(len(items)), *items, *audit_items]
                call = ScriptCall(CHANGE_RECORD, [key, self._keys.audit], args)
                if await run_script(self._redis, call):
                    return
                logger.debug("%s on %s raced another writer; retrying", operation, key)
            raise StoreUnavailable(operation, RuntimeError(f"{key} kept changing during {_MAX_CAS_ATTEMPTS} attempts"))

def create_store(url: str, **options: Any) -> RedisStore:
    """Open the store at `url`: one server (redis://, rediss://, unix://), the master of a Sentinel service
    (redis+sentinel://host:port[,host:port...]/service_name[/db]) or a Redis Cluster
    (redis+cluster://host:port[,host:port...]); `controlplane.store.urls` lists the forms and options, and
    `StoreBase.__init__` the keyword options. Connects lazily (the first operation connects).

    Raises:
        ValueError: for a malformed URL (naming what is wrong), an invalid option or an unknown one.
    """
    try:
        return RedisStore(url, **options)
    except TypeError as err:  # an unknown keyword: say which, as a ValueError like every other bad option
        raise ValueError(f"create_store: {err}") from None
