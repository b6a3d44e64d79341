"""The controller: the I/O shell around the fleet state machine (`loop.fleet.FleetState`).

The machine decides; this class feeds it events from the gRPC streams, the scheduler and the operators,
and applies the effects it returns through `service.effects.EffectsApplier`: decisions traced (the trace id
goes into the message), pushed to the engine's mailbox and to the watchers, then handed to the coalescing
`DecisionWriter`; closed buckets queued for the store exchange (`PoolSync`); metrics. Everything runs on one
asyncio event loop and never awaits on the push path.

Redis failures never stop deciding: decisions are kept pending and written when the store returns;
overrides are the exception and fail loudly (StoreUnavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import grpc

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.codec import calibration_to_cost_model, cost_model_to_calibration
from controlplane.loop.fleet import Effects, FleetState
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.loop.overrides import OverrideError, check_kind, check_override, check_reason
from controlplane.loop.rollout import Ended
from controlplane.loop.rollout import Verdict as RolloutVerdict
from controlplane.loop.rollout_peers import PeerRollout
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer
from controlplane.protocol import VERSION_EPOCH_FACTOR
from controlplane.service import fleet_view
from controlplane.service.audit_writer import AuditWriter
from controlplane.service.config import ControllerConfig
from controlplane.service.effects import EffectsApplier
from controlplane.service.epochs import EpochReserver
from controlplane.service.memory import TrimSchedule
from controlplane.service.pool_sync import EXCHANGE_TIMEOUT_S, PoolSync
from controlplane.service.sessions import (
    Session,
    StreamRefusedError,
    check_engine_allowed,
    check_started_at,
    resolve_takeover,
)
from controlplane.service.store_health import StoreHealth
from controlplane.service.watchers import Pushed, Watchers
from controlplane.service.writer import DecisionWriter
from controlplane.store import Store, StoreUnavailable, pool_key, scope_key
from controlplane.store.keys import override_kind_name
from controlplane.store.records import record_json

logger = logging.getLogger(__name__)
_EPOCH_TIMEOUT_S = 1.0
# After an override or calibration change every connected engine is re-decided, this many at a time with the
# event loop's other work between the parts: at 5,000 engines one pass held the loop for 475-665 ms
# (benchmarks/redecide_stall.py): 95-133 µs an engine, so a part of 64 holds it 6-9 ms.
REDECIDE_PART = 64
_STALE_AFTER_S = 30.0
_GAUGE_PERIOD_S = 1.0
# The scheduler task calls `tick` this often (service/app.py).
SCHEDULER_TICK_S = 0.25
# Keep-alives go out up to two ticks before they fall due: one tick of lead keeps the gap inside the
# keep-alive interval, the second absorbs a tick that runs late under load.
_KEEPALIVE_LEAD_S = 2 * SCHEDULER_TICK_S
# A stream that sends nothing for this long is closed (the agent's idle heartbeat comes every batch interval,
# which its settings bound to 60 s).
STREAM_IDLE_TIMEOUT_S = 180.0


class Controller:
    """One controller replica's shell around its fleet state machine. Call from one asyncio event loop."""

    def __init__(self, config: ControllerConfig, *, store: Store, tracer: DecisionTracer,
                 metrics: ControllerMetrics, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._store = store
        self._tracer = tracer
        self._metrics = metrics
        self._clock = clock
        self.fleet = FleetState(config.loop, config.policy, replica_id=config.controller_id, timer=time.perf_counter)
        self._health = StoreHealth(metrics, clock)
        self._pools = PoolSync(self.fleet, store, self._health, metrics, clock=clock)
        self._watchers = Watchers(metrics)
        self.writer = DecisionWriter(store, on_failure=self.note_store_failure, on_success=self._health.ok)
        self._audits = AuditWriter(store, on_failure=self.note_store_failure)
        self._epochs = EpochReserver(store)
        self._trim = TrimSchedule()
        self._redeciding: set[asyncio.Task] = set()  # re-decisions of every engine in progress (`_redecide_all`)
        self._applier = EffectsApplier(self.fleet, metrics=metrics, tracer=tracer, watchers=self._watchers,
                                       writer=self.writer, pools=self._pools, audits=self._audits, trim=self._trim,
                                       max_disconnected_engines=config.loop.max_disconnected_engines, clock=clock)
        self._gauges_at_s = float("-inf")
        # Label children resolved once: the ingest path runs ~1,000 times per second per 1,000 engines.
        self._batches_accepted = metrics.batches.labels(result="accepted")
        self._completions_accepted = metrics.events.labels(kind="completion", result="accepted")
        self._steps_accepted = metrics.events.labels(kind="step", result="accepted")
        self._events_dropped = metrics.events.labels(kind="any", result="dropped")

    @property
    def controller_id(self) -> str:
        return self._config.controller_id

    def now_s(self) -> float:
        """The controller clock (Unix seconds)."""
        return self._clock()

    @property
    def store(self) -> Store:
        return self._store

    # ---- start-up and store ----

    async def restore(self) -> None:
        """Load overrides, calibrations and last decisions from the store (best effort; logged on failure)."""
        try:
            await self._load_overrides_and_calibrations()
            self.fleet.restore_decisions(await self._store.load_decisions(), self._clock())
            self._health.ok()
        except StoreUnavailable as exc:
            self.note_store_failure("restore", exc)
        self._update_override_metrics()

    async def reload_overrides(self) -> None:
        """Re-read overrides and calibrations (after a pub/sub notice from another replica) and re-decide."""
        try:
            await self._load_overrides_and_calibrations()
            self._health.ok()
        except StoreUnavailable as exc:
            self.note_store_failure("list_overrides", exc)
            return
        self._update_override_metrics()
        await self._redecide_all()

    async def _load_overrides_and_calibrations(self) -> None:
        now_s = self._clock()
        overrides = await self._store.list_overrides(now_s)
        for calibration in (await self._store.list_calibrations()).values():
            self._set_calibration(calibration, refresh=False)
        self.fleet.set_overrides(overrides, now_s, redecide=False)

    @property
    def store_down_since_s(self) -> float | None:
        return self._health.down_since_s

    @property
    def store_answered(self) -> bool:
        return self._health.answered

    @property
    def audits(self) -> AuditWriter:
        """The audit entries of rollouts, appended by their own task (`service.audit_writer`)."""
        return self._audits

    def note_store_failure(self, operation: str, exc: Exception) -> None:
        """Count a failed store operation and remember since when the store is down."""
        self._health.failed(operation, exc)

    def note_store_ping(self, ok: bool) -> None:
        self._health.ping(ok)

    @property
    def num_pending_writes(self) -> int:
        return self.writer.num_pending

    async def flush_pending(self) -> bool:
        return await self.writer.flush()

    # ---- streams ----

    async def open_stream(self, hello: EngineHello, *, identity: str) -> Session:
        """Bind a new stream to its engine id (raises StreamRefusedError), reserve a version epoch, push the
        current decision. The losing stream of a takeover is closed with ABORTED."""
        check_engine_allowed(hello.engine_id, identity, self._config.security.agent_scopes)
        check_started_at(hello, self._clock())
        session = Session(hello=hello, identity=identity, last_message_s=self._clock())
        self._check_stream(session)
        epoch = await self._reserve_epoch(hello.engine_id)
        holder = self._check_stream(session)  # again: the await let other streams run
        if holder is not None:
            holder.mailbox.close(grpc.StatusCode.ABORTED, f"engine id {hello.engine_id!r} was taken over by a "
                                 f"newer stream (instance {hello.instance_id or 'unnamed'!r})")
        now_s = self._clock()
        self._apply(self.fleet.attach(hello, identity=identity, epoch=epoch, stream=session, now_s=now_s))
        self._metrics.connected_engines.set(self.fleet.num_connected)
        pool = self.fleet.pool(hello.pool_key)
        if pool is not None and pool.stats.estimate is None:
            # A pool with history never starts cold: its shared buckets or persisted window come first.
            await self._pools.warm(hello.pool_key, timeout_s=2 * EXCHANGE_TIMEOUT_S)
        self._apply(self.fleet.first_decision(hello.engine_id, session, self._clock()))
        return session

    def _check_stream(self, session: Session) -> Session | None:
        """Raise StreamRefusedError when `session` may not hold its engine id; the live stream it displaces,
        if any. An engine id stays bound to the identity that opened it until its record is forgotten (a
        disconnected engine's id cannot be taken by another identity, then lock the real agent out)."""
        record = self.fleet.engine(session.engine_id)
        if record is None:
            return None
        if record.identity and record.identity != session.identity:
            raise StreamRefusedError(grpc.StatusCode.PERMISSION_DENIED,
                                     f"engine id {session.engine_id!r} is held by another identity")
        holder = record.stream
        if isinstance(holder, Session):
            resolve_takeover(holder, session)
            return holder
        return None

    async def _reserve_epoch(self, engine_id: str) -> int:
        try:
            epoch = await self._epochs.reserve(engine_id, timeout_s=_EPOCH_TIMEOUT_S)
            self._health.ok()
            return epoch
        except (StoreUnavailable, TimeoutError) as exc:
            self.note_store_failure("reserve_epoch", exc)
            # Without the store, continue this replica's own sequence: versions still increase for the
            # engine here, but another replica could issue the same numbers (logged).
            logger.warning("engine %s: no version epoch from the store; continuing locally", engine_id)
            record = self.fleet.engine(engine_id)
            if record is not None:
                return record.loop.epoch
            restored = self.fleet.restored.get(engine_id)
            return restored[1].version // VERSION_EPOCH_FACTOR if restored is not None else 0

    def close_stream(self, session: Session) -> None:
        """Forget a stream (only if it still holds its engine id)."""
        self._apply(self.fleet.detach(session.engine_id, session, self._clock()))
        self._metrics.connected_engines.set(self.fleet.num_connected)

    def ingest(self, session: Session, batch: ValidatedBatch) -> None:
        """Feed one validated batch; decide and push at once when the engine's decision is due."""
        effects = self.fleet.batch(session.engine_id, session, batch, self._clock())
        if effects is None:
            return
        self._batches_accepted.inc()
        self._completions_accepted.inc(batch.output_tokens.size)
        self._steps_accepted.inc(batch.duration_s.size)
        if batch.num_dropped:
            self._events_dropped.inc(batch.num_dropped)
        self._apply(effects)

    def ack(self, session: Session, *, version: int, applied: bool, reason: str = "") -> None:
        result = self.fleet.ack(session.engine_id, session, version=version, applied=applied)
        if result is None:
            return
        self._metrics.acks.labels(result=result).inc()
        if result == "unknown_version":
            logger.warning("engine %s acknowledged version %d, which was never sent to it; ignored",
                           session.engine_id, version)
        elif result == "rejected":
            logger.warning("engine %s rejected decision %d: %s", session.engine_id, version, reason[:128])
        else:
            loop = self.fleet.engine(session.engine_id).loop
            if loop.current is not None:
                self._metrics.show_acked(session.engine_id, loop.hello.pool_key, loop.current, loop.acked_version)

    # ---- applying effects ----

    def _apply(self, effects: Effects) -> None:
        self._applier.apply(effects)

    async def _redecide_all(self) -> None:
        """Re-decide every connected engine (after an override or calibration change), REDECIDE_PART at a time,
        yielding to the event loop between parts; returns once every engine connected at the start was decided
        (one that connects meanwhile is decided with the new state at its Hello). A caller cancelled meanwhile
        (an operator's deadline) does not stop it: the change is already in force."""
        engine_ids = [engine_id for engine_id, record in self.fleet.engines() if record.connected]
        task = asyncio.create_task(self._redecide_parts(engine_ids))
        self._redeciding.add(task)
        task.add_done_callback(self._redeciding.discard)
        await asyncio.shield(task)

    async def _redecide_parts(self, engine_ids: list[str]) -> None:
        for start in range(0, len(engine_ids), REDECIDE_PART):
            if start:
                await asyncio.sleep(0)
            self._apply(self.fleet.redecide_all(self._clock(), engine_ids=engine_ids[start:start + REDECIDE_PART]))

    # ---- the scheduler's work ----

    def tick(self, now_s: float | None = None) -> None:
        """Keep-alives, interval recomputes, bucket closes and evictions (called by one scheduler task);
        per-engine gauges (telemetry age, stale engines) at most once per _GAUGE_PERIOD_S."""
        now_s = self._clock() if now_s is None else now_s
        self._apply(self.fleet.tick(now_s, keepalive_lead_s=_KEEPALIVE_LEAD_S))
        self._trim.release_if_due(now_s)
        if now_s - self._gauges_at_s >= _GAUGE_PERIOD_S:
            self._gauges_at_s = now_s
            stale = 0
            for engine_id, record in self.fleet.engines():
                if isinstance(record.stream, Session) and now_s - record.stream.last_message_s > STREAM_IDLE_TIMEOUT_S:
                    self._metrics.rejections.labels(cause="idle_timeout").inc()
                    record.stream.mailbox.close(grpc.StatusCode.DEADLINE_EXCEEDED, "no message for "
                                                f"{STREAM_IDLE_TIMEOUT_S:.0f} s (an agent sends a batch at least "
                                                "every batch interval)")
                if record.connected:
                    loop = record.loop
                    age = now_s - loop.last_telemetry_s if loop.last_telemetry_s >= 0 else -1.0
                    self._metrics.show_telemetry_age(engine_id, loop.hello.pool_key, age)
                    stale += int(age > _STALE_AFTER_S)
            self._metrics.stale_engines.set(stale)
            self._metrics.store_pending_writes.set(self.writer.num_pending)

    async def sync_pools(self, now_s: float | None = None, *, only: str | None = None) -> None:
        """Publish closed buckets, read the other replicas' and refresh each pool's estimate (`PoolSync`)."""
        await self._pools.sync(self._clock() if now_s is None else now_s, only=only)

    def note_stream_churn(self, count: int = 1) -> None:
        """Streams refused or ended before their Hello: their memory is handed back as evictions' is (`tick`)."""
        self._trim.note_freed(count, self._clock())

    # ---- operator actions ----

    async def set_override(self, record: operator_pb2.OverrideRecord, *, actor: str) -> operator_pb2.OverrideRecord:
        """Validate (before any write; OverrideError or ValueError names the field), store durably (or raise
        StoreUnavailable), trace, apply, and re-decide."""
        scope = scope_key(record.scope)  # raises ValueError for a bad scope
        check_override(record, now_s=self._clock())
        now_s = self._clock()
        record.set_by, record.set_at_s = actor, now_s
        old = await self._store.set_override(record, actor=actor, now_s=now_s)
        self._tracer.trace_override(action="set", kind=operator_pb2.OverrideKind.Name(record.kind), scope=scope,
                                    actor=actor, reason=record.reason, old=record_json(old), new=record_json(record))
        await self._replace_override(scope, record.kind, record)
        return record

    async def clear_override(self, scope: operator_pb2.Scope, kind: int, *, actor: str,
                             reason: str) -> operator_pb2.OverrideRecord | None:
        """Remove an override; returns the cleared record, or None when there was none (nothing changes)."""
        key = scope_key(scope)
        check_kind(kind)
        check_reason(reason)
        old = await self._store.clear_override(scope, kind, actor=actor, reason=reason, now_s=self._clock())
        if old is None:
            return None
        self._tracer.trace_override(action="clear", kind=operator_pb2.OverrideKind.Name(kind), scope=key,
                                    actor=actor, reason=reason, old=record_json(old), new="")
        await self._replace_override(key, kind, None)
        return operator_pb2.OverrideRecord(scope=scope, kind=kind, set_by=actor, set_at_s=self._clock(),
                                           reason=reason, cleared=True)

    async def _replace_override(self, scope: str, kind: int, record: operator_pb2.OverrideRecord | None) -> None:
        """The held overrides with the one of (scope, kind) replaced by record (None: removed); re-decide."""
        kept = [r for r in self.fleet.override_records if not (r.kind == kind and scope_key(r.scope) == scope)]
        self.fleet.set_overrides(kept + ([record] if record is not None else []), self._clock(), redecide=False)
        self._update_override_metrics()
        await self._redecide_all()

    def overrides(self) -> list[operator_pb2.OverrideRecord]:
        """The overrides this replica holds in force (expired ones excluded)."""
        return self.fleet.overrides(self._clock())

    def _update_override_metrics(self) -> None:
        shown = []
        for r in self.overrides():
            with contextlib.suppress(ValueError):  # a scope no valid request has (an older release's record)
                shown.append((override_kind_name(r.kind),
                              operator_pb2.ScopeKind.Name(r.scope.kind).removeprefix("SCOPE_KIND_").lower(),
                              scope_key(r.scope), r.expires_at_s))
        self._metrics.show_overrides(shown)

    def take_peer_rollouts(self, peers: list[PeerRollout]) -> None:
        """The other replicas' rollouts as published (`loop.rollout_peers`)."""
        self._apply(self.fleet.take_peer_rollouts(peers, self._clock()))

    def steer_rollout(self, pool_key: str, verdict: RolloutVerdict, *, actor: str, reason: str) -> Ended | None:
        """An operator promotes or aborts the pool's rollout now (audited with `actor` and `reason`); the ended
        rollout, or None when none is in progress here."""
        check_reason(reason)
        effects = self.fleet.steer_rollout(pool_key, verdict, self._clock())
        if effects is None:
            return None
        effects.rollouts[:] = [replace(e, actor=actor, reason=reason) for e in effects.rollouts]
        self._apply(effects)
        return self.fleet.pool(pool_key).rollouts.history[-1]

    async def put_calibration(self, calibration: operator_pb2.Calibration, *, actor: str = "") -> \
            operator_pb2.Calibration:
        calibration_to_cost_model(calibration)  # raises ValueError naming the field
        pool_key(calibration.pool)
        await self._store.put_calibration(calibration, actor=actor)
        self._set_calibration(calibration, refresh=True)
        await self._redecide_all()
        return calibration

    def _set_calibration(self, calibration: operator_pb2.Calibration, *, refresh: bool) -> None:
        try:
            costs = calibration_to_cost_model(calibration)
        except ValueError as exc:
            logger.warning("ignoring stored calibration for %s: %s", calibration.pool.model[:64], exc)
            return
        self.fleet.set_calibration(pool_key(calibration.pool), costs, self._clock(), refresh=refresh, redecide=False)

    def calibration(self, pool: common_pb2.Pool) -> operator_pb2.Calibration | None:
        costs = self.fleet.calibration(pool_key(pool))
        return cost_model_to_calibration(costs, pool) if costs is not None else None

    # ---- views ----

    def decision_view(self, engine_id: str) -> operator_pb2.DecisionView | None:
        return fleet_view.decision_view(self.fleet, engine_id)

    def engine_infos(self, pool: common_pb2.Pool | None = None) -> list[operator_pb2.EngineInfo]:
        wanted = pool_key(pool) if pool is not None and (pool.model or pool.accelerator) else None
        return fleet_view.engine_infos(self.fleet, now_s=self._clock(), pool_key=wanted)

    def registry_chunks(self, size: int) -> Iterator[dict[str, dict[str, str]]]:
        """Registry entries of the engines connected now, `size` at a time (`fleet_view.registry_chunks`)."""
        return fleet_view.registry_chunks(self.fleet, size, clock=self._clock)

    def watch(self) -> asyncio.Queue[Pushed]:
        return self._watchers.add()

    def offer_remote(self, event: Pushed) -> bool:
        """Hand every watcher another replica's decision, unless the engine's stream is open here (its
        pushes reach the watchers directly). Returns whether it was handed on."""
        record = self.fleet.engine(event.engine_id)
        if record is not None and record.connected:
            return False
        self._watchers.hand_on(event)
        return True

    def unwatch(self, queue: asyncio.Queue[Pushed]) -> None:
        self._watchers.remove(queue)

    def close_all_streams(self, message: str) -> None:
        for _, record in self.fleet.engines():
            if isinstance(record.stream, Session):
                record.stream.mailbox.close(grpc.StatusCode.UNAVAILABLE, message)


__all__ = ["Controller", "EngineHello", "OverrideError", "Pushed", "StreamRefusedError"]
