"""`RedisStore`: the controller's durable state in Redis (decisions, history, overrides, audit, registry,
calibrations) and the pub/sub that propagates override changes across controller replicas.

Contracts:
- Decisions are versioned per engine: a write whose version is not above the stored one is refused
  (checked and applied in one Lua script, so concurrent replicas cannot interleave), and every accepted
  write is appended to the capped history stream in the same script.
- An override change (set or clear) writes the override, appends an audit entry and publishes a notice in
  one MULTI/EXEC transaction under WATCH, so the old value in the audit is exactly the one replaced.
- Overrides with an expiry are dropped by Redis (PEXPIREAT); readers also skip those already past
  their expiry at the `now_s` they pass in, since Redis expires keys lazily.
- Every Redis failure raises `StoreUnavailable` naming the operation (reads and writes alike); bad
  arguments raise `ValueError` before Redis is contacted. Only `ping()` never raises.

Key layout: see `controlplane.store.keys`. The store reads no clock except where a method documents a
wall-clock default, and keeps no state besides its connection pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import redis.asyncio as redis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError, WatchError

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.store.errors import unavailable_on_error
from controlplane.store.keys import KeySpace, override_kind_name, pool_key, scope_key
from controlplane.store.notices import RESYNC, OverrideNotice, decode_notice, encode_notice
from controlplane.store.records import is_expired, parse_payload, record_json, stream_entries, text, text_fields

logger = logging.getLogger(__name__)

DEFAULT_PREFIX = "cp"
DEFAULT_HISTORY_MAXLEN = 10_000
DEFAULT_AUDIT_MAXLEN = 100_000
_SCAN_BATCH = 500
_MAX_WATCH_ATTEMPTS = 16

# KEYS: decision hash, history stream. ARGV: version, mode, k, n, reason, decided_at_s, pool, payload,
# engine_id, history maxlen. Versions are compared as decimal strings (length, then lexically) so that
# uint64 versions beyond 2^53 compare exactly, which Lua's double-based tonumber would not.
_PUT_DECISION_LUA = """
local stored = redis.call('HGET', KEYS[1], 'version')
if stored then
  local v = ARGV[1]
  if #v < #stored or (#v == #stored and v <= stored) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'mode', ARGV[2], 'k', ARGV[3], 'n', ARGV[4],
  'reason', ARGV[5], 'decided_at_s', ARGV[6], 'pool', ARGV[7], 'payload', ARGV[8])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[10], '*', 'engine_id', ARGV[9], 'version', ARGV[1],
  'mode', ARGV[2], 'k', ARGV[3], 'n', ARGV[4], 'reason', ARGV[5], 'decided_at_s', ARGV[6],
  'pool', ARGV[7], 'payload', ARGV[8])
return 1
"""


class RedisStore:
    """The store over one Redis (or Valkey) server, through `redis.asyncio`.

    Create it inside the event loop that uses it; `close()` (or `async with`) releases the connections.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        history_maxlen: int = DEFAULT_HISTORY_MAXLEN,
        audit_maxlen: int = DEFAULT_AUDIT_MAXLEN,
        socket_timeout_s: float = 5.0,
        num_retries: int = 2,
        health_check_interval_s: float = 30.0,
    ) -> None:
        """
        Args:
            url: redis://host:port/db, rediss://... (TLS) or unix:///path/to/redis.sock.
            prefix: namespace of every key and of the channel (see `keys.KeySpace`).
            history_maxlen: approximate cap of the decision history stream, entries (XADD MAXLEN ~,
                so the stream may hold up to one macro node, ~100 entries, more).
            audit_maxlen: approximate cap of the override audit stream, entries.
            socket_timeout_s: connect and per-command timeout, seconds.
            num_retries: retries of a command after a connection error or timeout, with jittered
                exponential backoff (50 ms up to 1 s); they reconnect pooled connections that went
                stale (e.g. after a Redis restart) instead of failing the first command on each.
            health_check_interval_s: idle time after which a connection is PINGed before use (also
                detects a dead pub/sub connection), seconds; 0 disables.

        Raises:
            ValueError: for a malformed URL, an empty prefix, a cap below 1 or negative retries.
        """
        if num_retries < 0:
            raise ValueError(f"num_retries must not be negative, got {num_retries}")
        if history_maxlen < 1 or audit_maxlen < 1:
            raise ValueError(f"stream caps must be at least 1, got {history_maxlen=} {audit_maxlen=}")
        self._keys = KeySpace(prefix)
        self._history_maxlen = history_maxlen
        self._audit_maxlen = audit_maxlen
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), num_retries),
            health_check_interval=health_check_interval_s,
        )
        self._put_decision_script = self._redis.register_script(_PUT_DECISION_LUA)

    @property
    def keys(self) -> KeySpace:
        """The key names this store uses."""
        return self._keys

    async def __aenter__(self) -> RedisStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool. Never raises."""
        with contextlib.suppress(RedisError, OSError):
            await self._redis.aclose()

    async def ping(self, *, timeout_s: float = 2.0) -> bool:
        """True when Redis answers PING within timeout_s seconds; never raises."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self._redis.ping())
        except Exception as err:  # ping is the health probe: every failure means "unavailable"
            logger.debug("redis ping failed: %s", err)
            return False

    # ---- decisions -------------------------------------------------------------------------------------

    async def put_decision(self, engine_id: str, *, pool_key: str, decision: common_pb2.Decision) -> bool:
        """Store `decision` as the latest of `engine_id` and append it to the history stream.

        Args:
            engine_id: the engine; not empty.
            pool_key: the engine's pool, as `keys.pool_key` renders it.
            decision: the decision; its `version` must exceed the stored one.

        Returns:
            True when written; False (nothing written, no history entry) when the stored version is
            greater than or equal to decision.version.

        Raises:
            ValueError: for an empty engine_id.
            StoreUnavailable: when Redis fails.
        """
        if not engine_id:
            raise ValueError("engine_id must not be empty")
        args = [
            str(decision.version),
            common_pb2.Mode.Name(decision.mode),
            str(decision.k),
            str(decision.n),
            decision.reason,
            repr(decision.decided_at_s),
            pool_key,
            decision.SerializeToString(deterministic=True),
            engine_id,
            str(self._history_maxlen),
        ]
        with unavailable_on_error("put_decision"):
            written = await self._put_decision_script(
                keys=[self._keys.decision(engine_id), self._keys.history], args=args
            )
        if not written:
            logger.debug("decision v%s for %s refused: not newer than the stored one", decision.version, engine_id)
        return bool(written)

    async def get_decision(self, engine_id: str) -> common_pb2.Decision | None:
        """The latest decision of `engine_id`, or None when there is none (or it does not parse, logged).

        Raises:
            StoreUnavailable: when Redis fails.
        """
        with unavailable_on_error("get_decision"):
            raw = await self._redis.hget(self._keys.decision(engine_id), "payload")
        return parse_payload(common_pb2.Decision, raw, key=self._keys.decision(engine_id))

    async def load_decisions(self) -> dict[str, tuple[str, common_pb2.Decision]]:
        """Every stored decision: engine_id → (pool_key, decision). Uses SCAN, never KEYS.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        decisions: dict[str, tuple[str, common_pb2.Decision]] = {}
        with unavailable_on_error("load_decisions"):
            keys = await self._scan(self._keys.decision_pattern)
            rows = await self._batched(keys, lambda pipe, key: pipe.hmget(key, "pool", "payload"))
        for key, (pool, payload) in zip(keys, rows, strict=True):
            if payload is None:
                continue  # deleted between SCAN and HMGET
            decision = parse_payload(common_pb2.Decision, payload, key=key)
            if decision is not None:
                decisions[self._keys.suffix(key, kind="decision")] = (text(pool or b""), decision)
        return decisions

    async def read_history(self, count: int) -> list[dict[str, Any]]:
        """The latest `count` entries of the decision history, newest first.

        Each entry has "id" (stream id), "engine_id", "version", "mode" (e.g. "MODE_EB"), "k", "n",
        "reason", "decided_at_s", "pool" as strings, and "decision" (the parsed `Decision`, None if
        its payload does not parse) instead of the raw "payload".

        Raises:
            ValueError: when count < 1.
            StoreUnavailable: when Redis fails.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        with unavailable_on_error("read_history"):
            entries = await self._redis.xrevrange(self._keys.history, count=count)
        history: list[dict[str, Any]] = []
        for entry_id, fields in entries:
            payload = fields.pop(b"payload", None)
            entry: dict[str, Any] = {"id": text(entry_id), **text_fields(fields)}
            entry["decision"] = parse_payload(common_pb2.Decision, payload, key=f"{self._keys.history} {entry['id']}")
            history.append(entry)
        return history

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
        key = self._keys.override(kind, scope)
        notice = OverrideNotice(action="set", kind=kind, scope=scope, actor=actor, at_s=at_s)

        def write(pipe: Pipeline) -> None:
            pipe.delete(key)  # drops a previous expiry too
            pipe.hset(key, mapping={
                "record": stored.SerializeToString(deterministic=True),
                "kind": kind,
                "scope": scope,
                "set_by": actor,
                "expires_at_s": repr(stored.expires_at_s),
            })
            if stored.expires_at_s > 0.0:
                pipe.pexpireat(key, math.ceil(stored.expires_at_s * 1000.0))

        return await self._change_override(
            key, write, operation="set_override", notice=notice, reason=stored.reason, new=stored
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
        key = self._keys.override(kind_name, scope_name)
        notice = OverrideNotice(action="clear", kind=kind_name, scope=scope_name, actor=actor, at_s=at_s)
        return await self._change_override(
            key, lambda pipe: pipe.delete(key), operation="clear_override", notice=notice, reason=reason, new=None
        )

    async def list_overrides(self, now_s: float) -> list[operator_pb2.OverrideRecord]:
        """Every override in force at `now_s` (Unix seconds), sorted by kind then scope key.

        Overrides with 0 < expires_at_s <= now_s are skipped even if Redis still holds them.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        with unavailable_on_error("list_overrides"):
            keys = await self._scan(self._keys.override_pattern)
            raws = await self._batched(keys, lambda pipe, key: pipe.hget(key, "record"))
        in_force = []
        for key, raw in sorted(zip(keys, raws, strict=True)):  # by key: kind, then scope key
            record = parse_payload(operator_pb2.OverrideRecord, raw, key=key)
            if record is not None and not is_expired(record, now_s=now_s):
                in_force.append(record)
        return in_force

    async def read_audit(self, count: int) -> list[dict[str, str]]:
        """The latest `count` audit entries, newest first.

        Each entry has "id" (stream id), "action" ("set" | "clear"), "kind", "scope", "actor", "at_s",
        "reason", "old" and "new" (one-line JSON of the records with proto field names, "" for none).

        Raises:
            ValueError: when count < 1.
            StoreUnavailable: when Redis fails.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        with unavailable_on_error("read_audit"):
            entries = await self._redis.xrevrange(self._keys.audit, count=count)
        return stream_entries(entries)

    async def watch_overrides(
        self, *, retry_delay_s: float = 0.2, max_retry_delay_s: float = 5.0
    ) -> AsyncIterator[OverrideNotice]:
        """Yield every override change notice published by any replica, forever.

        Yields `RESYNC` (action "resync") after every successful (re)subscription, the first included:
        notices published while not subscribed are lost, so reload all overrides then. When the
        connection drops, it resubscribes (redis-py reconnects at once; if Redis stays down it retries
        with exponential backoff from retry_delay_s up to max_retry_delay_s seconds). Never raises
        StoreUnavailable; stop it by cancelling the consuming task or closing the generator, e.g.
        `async with contextlib.aclosing(store.watch_overrides()) as notices: async for n in notices: ...`.
        """
        delay_s = retry_delay_s
        while True:
            pubsub = self._redis.pubsub()
            try:
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
            except (RedisError, OSError) as err:
                logger.warning("override watch lost Redis (%s); resubscribing in %.2f s", err, delay_s)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            await asyncio.sleep(delay_s)
            delay_s = min(2.0 * delay_s, max_retry_delay_s)

    # ---- engine registry -------------------------------------------------------------------------------

    async def heartbeat(self, engine_id: str, *, info: dict[str, str], ttl_s: float) -> None:
        """Register `engine_id` with `info` (replacing the previous fields) for the next ttl_s seconds.

        Raises:
            ValueError: for an empty engine_id or info (Redis has no empty hashes), or ttl_s not > 0.
            StoreUnavailable: when Redis fails.
        """
        if not engine_id:
            raise ValueError("engine_id must not be empty")
        if not info:
            raise ValueError("info must have at least one field")
        if not (math.isfinite(ttl_s) and ttl_s > 0.0):
            raise ValueError(f"ttl_s must be a positive number of seconds, got {ttl_s}")
        key = self._keys.engine(engine_id)
        with unavailable_on_error("heartbeat"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping=info)
                pipe.pexpire(key, max(1, math.ceil(ttl_s * 1000.0)))
                await pipe.execute()

    async def list_registry(self) -> dict[str, dict[str, str]]:
        """Every registered (unexpired) engine: engine_id → its info.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        with unavailable_on_error("list_registry"):
            keys = await self._scan(self._keys.engine_pattern)
            rows = await self._batched(keys, lambda pipe, key: pipe.hgetall(key))
        return {
            self._keys.suffix(key, kind="engine"): text_fields(row)
            for key, row in zip(keys, rows, strict=True)
            if row  # expired between SCAN and HGETALL
        }

    # ---- calibrations ----------------------------------------------------------------------------------

    async def put_calibration(self, calibration: operator_pb2.Calibration) -> None:
        """Store the cost profile of calibration.pool, replacing the previous one.

        Raises:
            ValueError: when the pool is incomplete (see `keys.pool_key`).
            StoreUnavailable: when Redis fails.
        """
        pool = pool_key(calibration.pool)
        with unavailable_on_error("put_calibration"):
            await self._redis.hset(self._keys.calibration(pool), mapping={
                "payload": calibration.SerializeToString(deterministic=True),
                "pool": pool,
                "source": calibration.source,
            })

    async def get_calibration(self, pool: common_pb2.Pool) -> operator_pb2.Calibration | None:
        """The cost profile of `pool`, or None.

        Raises:
            ValueError: when the pool is incomplete.
            StoreUnavailable: when Redis fails.
        """
        key = self._keys.calibration(pool_key(pool))
        with unavailable_on_error("get_calibration"):
            raw = await self._redis.hget(key, "payload")
        return parse_payload(operator_pb2.Calibration, raw, key=key)

    async def list_calibrations(self) -> dict[str, operator_pb2.Calibration]:
        """Every stored cost profile: pool_key → calibration.

        Raises:
            StoreUnavailable: when Redis fails.
        """
        with unavailable_on_error("list_calibrations"):
            keys = await self._scan(self._keys.calibration_pattern)
            raws = await self._batched(keys, lambda pipe, key: pipe.hget(key, "payload"))
        calibrations = {}
        for key, raw in zip(keys, raws, strict=True):
            calibration = parse_payload(operator_pb2.Calibration, raw, key=key)
            if calibration is not None:
                calibrations[self._keys.suffix(key, kind="calibration")] = calibration
        return calibrations

    # ---- helpers ---------------------------------------------------------------------------------------

    async def _change_override(
        self,
        key: str,
        write: Callable[[Pipeline], object],
        *,
        operation: str,
        notice: OverrideNotice,
        reason: str,
        new: operator_pb2.OverrideRecord | None,
    ) -> operator_pb2.OverrideRecord | None:
        """Read the old override under WATCH, then in one MULTI: `write(pipe)`, audit, publish."""
        with unavailable_on_error(operation):
            async with self._redis.pipeline(transaction=True) as pipe:
                for _ in range(_MAX_WATCH_ATTEMPTS):
                    try:
                        await pipe.watch(key)
                        old = parse_payload(operator_pb2.OverrideRecord, await pipe.hget(key, "record"), key=key)
                        if old is not None and is_expired(old, now_s=notice.at_s):
                            old = None
                        pipe.multi()
                        write(pipe)
                        pipe.xadd(
                            self._keys.audit,
                            {
                                "action": notice.action,
                                "kind": notice.kind,
                                "scope": notice.scope,
                                "actor": notice.actor,
                                "at_s": repr(notice.at_s),
                                "reason": reason,
                                "old": record_json(old),
                                "new": record_json(new),
                            },
                            maxlen=self._audit_maxlen,
                            approximate=True,
                        )
                        pipe.publish(self._keys.overrides_channel, encode_notice(notice))
                        await pipe.execute()
                    except WatchError:
                        logger.debug("%s on %s raced another writer; retrying", operation, key)
                        continue
                    logger.info(
                        "override %s %s %s by %s (%s)", notice.action, notice.kind, notice.scope, notice.actor, reason
                    )
                    return old
                raise WatchError(f"{key} kept changing during {_MAX_WATCH_ATTEMPTS} attempts")

    async def _scan(self, pattern: str) -> list[str]:
        return [text(key) async for key in self._redis.scan_iter(match=pattern, count=_SCAN_BATCH)]

    async def _batched(self, keys: list[str], command: Callable[[Pipeline, str], object]) -> list[Any]:
        """Run `command(pipe, key)` for every key, pipelined (not transactional) in batches."""
        results: list[Any] = []
        for start in range(0, len(keys), _SCAN_BATCH):
            async with self._redis.pipeline(transaction=False) as pipe:
                for key in keys[start:start + _SCAN_BATCH]:
                    command(pipe, key)
                results.extend(await pipe.execute())
        return results
