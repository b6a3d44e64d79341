"""The controller: engine sessions, per-pool statistics, the decision loop, overrides and persistence.

It owns no sockets: servicers call it, and it hands decisions to per-stream mailboxes and to watchers.
Everything here runs on one asyncio event loop and never awaits on the push path: a decision is computed
(`loop.EngineLoop.decide` on the pool's estimate: tens of microseconds), pushed to the engine's mailbox,
then handed to the coalescing `DecisionWriter`. One scheduler task (`tick`) owns keep-alives, interval
recomputes, pool estimate refreshes (with the replicas' shared buckets) and evictions.

Redis failures never stop deciding: decisions are kept pending and written when the store returns;
overrides are the exception and fail loudly (StoreUnavailable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import numpy as np

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.cost_sums import StepColumns
from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, CostModel
from controlplane.loop.codec import calibration_to_cost_model, cost_model_to_calibration, resolve_intent
from controlplane.loop.engine import EngineLoop
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.loop.pool_stats import BucketStats, PoolEstimate, PoolStatistics
from controlplane.observability.engine_series import COLUMN, DECISION_SLICE
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer
from controlplane.protocol import MODE_CODES, VERSION_EPOCH_FACTOR, split_version
from controlplane.service.config import ControllerConfig
from controlplane.service.epochs import EpochReserver
from controlplane.service.fleet_view import registry_fields
from controlplane.service.memory import collect_and_release
from controlplane.service.sessions import Session, StreamRefusedError, check_engine_allowed, resolve_takeover
from controlplane.service.writer import DecisionWriter
from controlplane.store import RedisStore, StoreUnavailable, pool_key, scope_key
from controlplane.store.records import record_json

logger = logging.getLogger(__name__)
# Columns of the per-engine metrics table.
_ACKED_SEQUENCE, _TELEMETRY_AGE = COLUMN["cp_engine_acked_sequence"], COLUMN["cp_engine_telemetry_age_seconds"]
_EPOCH_TIMEOUT_S = 1.0
_OUTLIER_BLOCK = 256
_OUTLIER_Z = 8.0
_OUTLIER_RATIO = 2.0
_MIN_POOL_ENGINES_FOR_OUTLIERS = 3
_STALE_AFTER_S = 30.0
_EMPTY = np.zeros(0)
_WATCH_QUEUE = 10_000
_GAUGE_PERIOD_S = 1.0
# Freed memory is handed back to the OS (service/memory.py) after this many evictions, or once evictions
# have stopped for _TRIM_QUIET_S.
_TRIM_AFTER_EVICTIONS = 1000
_TRIM_QUIET_S = 5.0
# At most one warning per this many seconds that an identity's disconnected engines are forgotten early.
_CAPACITY_WARNING_EVERY_S = 60.0
# The scheduler task calls `tick` this often (service/app.py).
SCHEDULER_TICK_S = 0.25
_KEEPALIVE_LEAD_S = 2 * SCHEDULER_TICK_S
_RECENT_BUCKETS_REFETCHED = 3
# A slow store must not hold a pool's estimate back: refresh from this replica's own buckets instead.
_EXCHANGE_TIMEOUT_S = 0.5


class OverrideError(ValueError):
    """An override request is invalid (bad scope, δ out of range, bad pin); the message says which field."""


@dataclass(frozen=True, slots=True)
class Pushed:
    """A decision handed to an engine's mailbox and to watchers."""

    engine_id: str
    pool_key: str
    decision: common_pb2.Decision


@dataclass(frozen=True, slots=True)
class HeldBatch:
    """Completions held on probation: prompts and outputs (tokens), their admission ages as of held_at_s
    (seconds; None when the batch did not report them) and the controller time they arrived at."""

    prompts: np.ndarray
    outputs: np.ndarray
    admitted_age_s: np.ndarray | None
    held_at_s: float


@dataclass(eq=False)
class EngineRecord:
    """What the controller keeps per engine id: its decision loop and the stream holding it (if any)."""

    loop: EngineLoop
    session: Session | None = None
    disconnected_at_s: float = 0.0
    identity: str = ""  # the agent identity that holds the engine id until the record is evicted
    block_count: int = 0
    block_sum_tokens: float = 0.0
    # Probation: an engine's completions wait here until its first block is judged (not an outlier), so a
    # poisoning engine never reaches the pool statistics, even if it changes its id every block. Each held
    # batch keeps its admission ages (None: not reported) and the controller time it was held at.
    probation: list[HeldBatch] | None = field(default_factory=list)
    watched_version: int = -1  # the last version handed to the watchers (keep-alive re-pushes are not)


@dataclass(eq=False)
class PoolRecord:
    stats: PoolStatistics
    unpublished: list[tuple[int, BucketStats]]
    fetched_through: int = -1
    refreshed_bucket: int | None = None
    num_connected: int = 0
    num_records: int = 0  # engine records of the pool here, connected or not: the pool is forgotten at 0
    num_excluded: int = 0
    first_sync: asyncio.Future | None = None
    last_snapshot_s: float = float("-inf")
    # Other replicas' buckets this replica cannot read (bucket id, replica id): not parsed again at each
    # exchange, and the replicas already warned about (a replica of a newer format warns once per pool).
    unreadable: set[tuple[int, str]] = field(default_factory=set)
    unreadable_replicas: set[str] = field(default_factory=set)


class Controller:
    """Decision-making state of one controller replica. Call from one asyncio event loop."""

    def __init__(self, config: ControllerConfig, *, store: RedisStore, tracer: DecisionTracer,
                 metrics: ControllerMetrics, clock: Callable[[], float] = time.time) -> None:
        self._config = config
        self._store = store
        self._tracer = tracer
        self._metrics = metrics
        self._clock = clock
        self._engines: dict[str, EngineRecord] = {}
        # Per agent identity, its disconnected engine ids in the order they disconnected (the oldest first).
        self._disconnected: dict[str, dict[str, None]] = {}
        self._capacity_warned_s = -math.inf
        self._pools: dict[str, PoolRecord] = {}
        self._num_connected = 0  # Σ pool.num_connected, kept as they change (the gauge is set per connect)
        self._watchers: set[asyncio.Queue[Pushed]] = set()
        self._overrides: list[operator_pb2.OverrideRecord] = []
        self._calibrations: dict[str, CostModel] = {}
        self._restored: dict[str, tuple[str, common_pb2.Decision]] = {}
        self.writer = DecisionWriter(store, on_failure=self.note_store_failure, on_success=self._store_ok)
        self._epochs = EpochReserver(store)
        self.store_down_since_s: float | None = None
        self.store_answered = False
        self._gauges_at_s = float("-inf")
        self._restored_at_s = 0.0
        self._evicted_since_trim = 0
        self._last_evicted_s = -math.inf
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
    def store(self) -> RedisStore:
        return self._store

    # ---- start-up and store ----

    async def restore(self) -> None:
        """Load overrides, calibrations and last decisions from the store (best effort; logged on failure)."""
        try:
            self._overrides = await self._store.list_overrides(self._clock())
            for calibration in (await self._store.list_calibrations()).values():
                self._set_calibration(calibration)
            self._restored = await self._store.load_decisions()
            self._restored_at_s = self._clock()
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("restore", exc)
        self._update_override_metrics()

    async def reload_overrides(self) -> None:
        """Re-read overrides and calibrations (after a pub/sub notice from another replica) and re-decide."""
        try:
            self._overrides = await self._store.list_overrides(self._clock())
            for calibration in (await self._store.list_calibrations()).values():
                self._set_calibration(calibration)
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("list_overrides", exc)
            return
        self._update_override_metrics()
        self.redecide_all()

    def _store_ok(self) -> None:
        self.store_down_since_s = None
        self.store_answered = True
        self._metrics.store_up.set(1)

    def note_store_failure(self, operation: str, exc: Exception) -> None:
        """Count a failed store operation and remember since when the store is down."""
        self._metrics.store_errors.labels(operation=operation).inc()
        self._metrics.store_up.set(0)
        if self.store_down_since_s is None:
            self.store_down_since_s = self._clock()
            logger.warning("store unavailable during %s: %s; deciding from memory", operation, exc)

    def note_store_ping(self, ok: bool) -> None:
        if ok:
            self._store_ok()
        else:
            self.note_store_failure("ping", StoreUnavailable("ping: no answer"))

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
        session = Session(hello=hello, identity=identity)
        record = self._engines.get(hello.engine_id)
        self._check_identity(record, session)
        if record is not None and record.session is not None:
            resolve_takeover(record.session, session)
        epoch = await self._reserve_epoch(hello.engine_id, record)
        record = self._engines.get(hello.engine_id)  # re-read: the await let other streams run
        self._check_identity(record, session)
        if record is not None and record.session is None:
            # No await from here until the record holds the session.
            self._leave_disconnected_queue(hello.engine_id, record)
        if record is not None and record.session is not None:
            resolve_takeover(record.session, session)
            record.session.mailbox.close(grpc.StatusCode.ABORTED,
                                         f"engine id {hello.engine_id!r} was taken over by a newer stream "
                                         f"(instance {hello.instance_id or 'unnamed'!r})")
        created = record is None or record.loop.hello.pool_key != hello.pool_key
        if created:
            if record is not None:  # the engine moved to another pool
                if record.session is not None:
                    self._pools[record.loop.hello.pool_key].num_connected -= 1
                    self._num_connected -= 1
                    self._pools[record.loop.hello.pool_key].stats.forget_engine(hello.engine_id)
                self._release_pool(record.loop.hello.pool_key)
            loop = EngineLoop(hello=hello, config=self._config.loop, policy=self._config.policy)
            restored = self._restored.pop(hello.engine_id, None)
            if restored is not None:
                loop.restore(restored[1])
            record = EngineRecord(loop=loop, identity=session.identity)
            self._engines[hello.engine_id] = record
        loop = record.loop
        loop.hello = hello
        loop.last_seq = 0
        loop.last_sent_s = float("-inf")
        loop.begin_epoch(epoch)
        if hello.pool_key not in self._pools:
            self._pools[hello.pool_key] = PoolRecord(
                stats=PoolStatistics(hello.pool_key, self._config.loop, replica_id=self._config.controller_id),
                unpublished=[])
        if created:
            self._pools[hello.pool_key].num_records += 1
        if record.session is None:
            self._pools[hello.pool_key].num_connected += 1
            self._num_connected += 1
        record.session = session
        self._update_connected()
        pool = self._pools[hello.pool_key]
        if pool.stats.estimate is None:
            # A pool's first engines on this replica: take in the pool's shared buckets (or its persisted
            # window) before the first decision, so a pool with history never starts cold. One sync per
            # pool, however many engines connect at once.
            if pool.first_sync is None:
                pool.first_sync = asyncio.ensure_future(self._warm_pool(hello.pool_key, pool))
            with contextlib.suppress(TimeoutError, StoreUnavailable):
                await asyncio.wait_for(asyncio.shield(pool.first_sync), timeout=2 * _EXCHANGE_TIMEOUT_S)
            if record.session is not session:  # taken over while waiting
                return session
        self._decide(record, self._clock(), force_push=True)
        return session

    @staticmethod
    def _check_identity(record: EngineRecord | None, session: Session) -> None:
        """An engine id stays bound to the identity that opened it until its record is evicted (a
        disconnected engine's id cannot be taken by another identity, then lock the real agent out)."""
        if record is not None and record.identity and record.identity != session.identity:
            raise StreamRefusedError(grpc.StatusCode.PERMISSION_DENIED,
                                     f"engine id {session.engine_id!r} is held by another identity")

    async def _reserve_epoch(self, engine_id: str, record: EngineRecord | None) -> int:
        try:
            epoch = await self._epochs.reserve(engine_id, timeout_s=_EPOCH_TIMEOUT_S)
            self._store_ok()
            return epoch
        except (StoreUnavailable, TimeoutError) as exc:
            self.note_store_failure("reserve_epoch", exc if isinstance(exc, Exception) else Exception(exc))
            # Without the store, continue this replica's own sequence: versions still increase for the
            # engine here, but another replica could issue the same numbers (logged).
            logger.warning("engine %s: no version epoch from the store; continuing locally", engine_id)
            if record is not None:
                return record.loop.epoch
            restored = self._restored.get(engine_id)
            return restored[1].version // VERSION_EPOCH_FACTOR if restored is not None else 0

    def close_stream(self, session: Session) -> None:
        """Forget a stream (only if it still holds its engine id)."""
        record = self._engines.get(session.engine_id)
        if record is not None and record.session is session:
            record.session = None
            record.disconnected_at_s = self._clock()
            self._pools[record.loop.hello.pool_key].num_connected -= 1
            self._num_connected -= 1
            self._pools[record.loop.hello.pool_key].stats.forget_engine(session.engine_id)
            self._remember_disconnected(session.engine_id, record)
        self._update_connected()

    def _remember_disconnected(self, engine_id: str, record: EngineRecord) -> None:
        """Queue a newly disconnected engine under its identity; past the identity's max_disconnected_engines
        (unless 0), forget its longest-disconnected engines now (their TTL would let a client cycling through
        engine ids hold memory in proportion to its rate)."""
        queue = self._disconnected.setdefault(record.identity, {})
        queue[engine_id] = None
        limit = self._config.loop.max_disconnected_engines
        if limit == 0 or len(queue) <= limit:
            return
        now_s = record.disconnected_at_s  # set by close_stream just now
        while len(queue) > limit:
            oldest = next(iter(queue))
            self._evict(oldest, self._engines[oldest], reason="capacity", now_s=now_s)
        if now_s - self._capacity_warned_s >= _CAPACITY_WARNING_EVERY_S:
            self._capacity_warned_s = now_s
            logger.warning("agent identity %r has more than %d engines disconnected: its longest-disconnected are "
                           "forgotten before engine_ttl_s (cp_engines_evicted_total{reason=\"capacity\"}; "
                           "raise max_disconnected_engines if a fleet this size disconnects at once)",
                           record.identity, limit)

    def _leave_disconnected_queue(self, engine_id: str, record: EngineRecord) -> None:
        """Take an engine off its identity's disconnected queue (a no-op when it is not on it)."""
        queue = self._disconnected.get(record.identity)
        if queue is None:
            return
        queue.pop(engine_id, None)
        if not queue:
            del self._disconnected[record.identity]

    def _update_connected(self) -> None:
        self._metrics.connected_engines.set(self._num_connected)

    def ingest(self, session: Session, batch: ValidatedBatch) -> None:
        """Feed one validated batch; decide and push at once when the engine's decision is due."""
        record = self._engines.get(session.engine_id)
        if record is None or record.session is not session:
            return
        now_s = self._clock()
        loop = record.loop
        m = self._metrics
        if loop.on_batch(batch, now_s=now_s):
            m.sequence_gaps.inc()
        pool = self._pools[loop.hello.pool_key]
        prompts, outputs = batch.prompt_tokens, batch.output_tokens
        admitted_age_s = batch.admitted_age_s if outputs.size else None
        if outputs.size:
            if record.probation is not None:
                record.probation.append(HeldBatch(prompts, outputs, admitted_age_s, now_s))
                prompts = outputs = _EMPTY
                admitted_age_s = None
            self._judge_outlier(record, pool, batch.output_tokens, now_s)
        if not loop.excluded_from_pool:
            self._add_to_pool(pool, now_s, prompts, outputs,
                              StepColumns(batch.prefill_tokens, batch.decode_tokens, batch.decode_requests,
                                          batch.duration_s), engine_id=session.engine_id,
                              running=(batch.running_lengths, batch.running_counts),
                              admitted_age_s=admitted_age_s, running_admitted_age_s=batch.running_admitted_age_s)
        self._batches_accepted.inc()
        self._completions_accepted.inc(batch.output_tokens.size)
        self._steps_accepted.inc(batch.duration_s.size)
        if batch.num_dropped:
            self._events_dropped.inc(batch.num_dropped)
        if loop.is_due(now_s):
            self._decide(record, now_s, trigger_traceparent=batch.traceparent)

    def _add_to_pool(self, pool: PoolRecord, now_s: float, prompts: np.ndarray, outputs: np.ndarray,
                     steps: StepColumns | None, *, engine_id: str = "",
                     running: tuple[np.ndarray, np.ndarray] | None = None, admitted_age_s: np.ndarray | None = None,
                     running_admitted_age_s: np.ndarray | None = None) -> None:
        lengths, counts = running if running is not None else (None, None)
        closed = pool.stats.add(now_s, prompts=prompts, outputs=outputs, steps=steps, engine_id=engine_id,
                                running_lengths=lengths, running_counts=counts, admitted_age_s=admitted_age_s,
                                running_admitted_age_s=running_admitted_age_s)
        if closed is not None:
            pool.unpublished.append((closed[1], closed[0]))

    def _pool_can_judge(self, pool: PoolRecord) -> bool:
        estimate = pool.stats.estimate
        return (estimate is not None and estimate.fit is not None and estimate.fit.stats.mu_o_tokens > 0
                and estimate.num_samples >= self._config.policy.min_samples
                and pool.num_connected >= _MIN_POOL_ENGINES_FOR_OUTLIERS)

    def _end_probation(self, record: EngineRecord, pool: PoolRecord, now_s: float, *, admit: bool) -> None:
        """Release (admit) or drop the completions held on probation. Released ones enter the open bucket with
        their admission ages carried forward to now_s, so the bucket keeps its admissions (one batch that
        reported none makes the release's admissions unknown, as it would have made its own bucket's)."""
        held, record.probation = record.probation or [], None
        if not (admit and held):
            return
        known = all(h.admitted_age_s is not None and h.admitted_age_s.size == h.outputs.size for h in held)
        ages = np.concatenate([h.admitted_age_s + (now_s - h.held_at_s) for h in held]) if known else None
        self._add_to_pool(pool, now_s, np.concatenate([h.prompts for h in held]),
                          np.concatenate([h.outputs for h in held]), None, admitted_age_s=ages)

    def _judge_outlier(self, record: EngineRecord, pool: PoolRecord, outputs: np.ndarray, now_s: float) -> None:
        """Keep an engine whose output lengths are far from its pool's out of the pool statistics.

        Judged per block of _OUTLIER_BLOCK completions against the pool estimate, when the pool can judge
        (an estimate from min_samples completions and _MIN_POOL_ENGINES_FOR_OUTLIERS connected engines): an
        outlier's block mean is more than _OUTLIER_Z standard errors and a factor _OUTLIER_RATIO away from
        the pool's mean. A new engine's completions are held back until its first block is judged (or
        admitted at once while the pool cannot judge: a young pool has nothing to compare with).
        """
        if record.probation is not None and not self._pool_can_judge(pool):
            self._end_probation(record, pool, now_s, admit=True)
        record.block_count += int(outputs.size)
        record.block_sum_tokens += float(outputs.sum())
        if record.block_count < _OUTLIER_BLOCK:
            return
        mean = record.block_sum_tokens / record.block_count
        count = record.block_count
        record.block_count, record.block_sum_tokens = 0, 0.0
        if not self._pool_can_judge(pool):
            return
        estimate = pool.stats.estimate
        stats = estimate.fit.stats
        z = abs(mean - stats.mu_o_tokens) / max(stats.sigma_o_tokens / math.sqrt(count), 1e-9)
        ratio = mean / stats.mu_o_tokens
        excluded = z > _OUTLIER_Z and not (1.0 / _OUTLIER_RATIO <= ratio <= _OUTLIER_RATIO)
        if record.probation is not None:
            self._end_probation(record, pool, now_s, admit=not excluded)
        if excluded != record.loop.excluded_from_pool:
            record.loop.excluded_from_pool = excluded
            pool.stats.forget_engine(record.loop.hello.engine_id)  # its running requests leave (or rejoin) with it
            logger.warning("engine %s %s pool %s statistics (block mean %.1f tokens vs pool %.1f)",
                           record.loop.hello.engine_id, "kept out of" if excluded else "readmitted to",
                           pool.stats.pool_key, mean, stats.mu_o_tokens)
            pool.num_excluded += 1 if excluded else -1
            self._metrics.pool_excluded_engines.labels(pool=pool.stats.pool_key).set(pool.num_excluded)

    def ack(self, session: Session, *, version: int, applied: bool, reason: str = "") -> None:
        record = self._engines.get(session.engine_id)
        if record is None or record.session is not session:
            return
        result = record.loop.ack(version, applied=applied)
        self._metrics.acks.labels(result=result).inc()
        if result == "unknown_version":
            logger.warning("engine %s acknowledged version %d, which was never sent to it; ignored",
                           session.engine_id, version)
        elif result == "rejected":
            logger.warning("engine %s rejected decision %d: %s", session.engine_id, version, reason[:128])
        else:
            self._set_acked_gauge(record.loop)

    # ---- deciding ----

    def _decide(self, record: EngineRecord, now_s: float, *, force_push: bool = False,
                trigger_traceparent: str = "") -> None:
        loop = record.loop
        hello = loop.hello
        pool = self._pools[hello.pool_key]
        estimate = pool.stats.estimate
        if estimate is not None and hello.pool_key in self._calibrations and estimate.cost_source != "calibration":
            estimate = None
        intent = resolve_intent(self._overrides, engine_id=hello.engine_id, pool_key=hello.pool_key, now_s=now_s)
        started = time.perf_counter()
        outcome = loop.decide(estimate, intent=intent, now_s=now_s, force_push=force_push,
                              trigger_traceparent=trigger_traceparent)
        self._metrics.decision_latency.observe(time.perf_counter() - started)
        if outcome.changed and outcome.latest is not None:
            decision = outcome.decision
            outcome.latest.trace_id = self._tracer.trace_decision(
                decision, engine_id=hello.engine_id, pool=hello.pool_key, version=outcome.latest.version,
                traceparent=loop.traceparent)
            self._metrics.decisions.labels(mode=decision.mode.value, reason=decision.reason.value).inc()
            self._set_engine_gauges(loop)
        if outcome.push is not None:
            self._push(record, outcome.push, now_s)
        if outcome.changed and outcome.latest is not None:
            self.writer.submit(hello.engine_id, pool_key=hello.pool_key, decision=outcome.latest)

    def _push(self, record: EngineRecord, decision: common_pb2.Decision, now_s: float) -> None:
        """Send the decision to the engine's stream; the watchers get each version once (a keep-alive or a
        re-push on reconnect sends the engine a version it may have lost, but tells a watcher nothing new)."""
        loop = record.loop
        if record.session is not None:
            record.session.mailbox.put(decision)
            loop.mark_sent(decision, now_s=now_s)
        if decision.version != record.watched_version:
            record.watched_version = decision.version
            self._fan_out(Pushed(engine_id=loop.hello.engine_id, pool_key=loop.hello.pool_key, decision=decision))

    def _fan_out(self, event: Pushed) -> None:
        """Hand every watcher the event; one that is behind loses it (counted)."""
        for watcher in self._watchers:
            try:
                watcher.put_nowait(event)
            except asyncio.QueueFull:
                self._metrics.watchers_dropped.inc()

    def _set_engine_gauges(self, loop: EngineLoop) -> None:
        d = loop.current
        if d is None:
            return
        epoch, sequence = split_version(d.version)
        row = self._metrics.engine_series.row(loop.hello.engine_id, loop.hello.pool_key)
        row[DECISION_SLICE] = (MODE_CODES.get(d.mode, 0), d.k, d.n, d.budget.b_max_tokens, d.budget.b_cap_tokens,
                               d.delta_s_per_token, epoch, sequence)  # in the order of DECISION_COLUMNS
        self._set_acked_gauge(loop)

    def _set_acked_gauge(self, loop: EngineLoop) -> None:
        """The acked version's sequence within the epoch of the decision in force (-1: none acked in it)."""
        if loop.current is None:
            return
        epoch = split_version(loop.current.version)[0]
        acked_epoch, acked_sequence = split_version(loop.acked_version)
        self._metrics.engine_series.row(loop.hello.engine_id, loop.hello.pool_key)[_ACKED_SEQUENCE] = (
            acked_sequence if acked_epoch == epoch else -1)

    def redecide_all(self) -> None:
        """Re-decide every connected engine now (after an override or calibration change)."""
        now_s = self._clock()
        for record in list(self._engines.values()):
            if record.session is not None:
                self._decide(record, now_s)

    # ---- the scheduler's work ----

    def tick(self, now_s: float | None = None) -> None:
        """Keep-alives, interval recomputes, bucket closes and evictions (called by one scheduler task).

        Per-engine gauges (telemetry age, stale engines) are refreshed at most once per _GAUGE_PERIOD_S.
        """
        now_s = self._clock() if now_s is None else now_s
        gauges = now_s - self._gauges_at_s >= _GAUGE_PERIOD_S
        if gauges:
            self._gauges_at_s = now_s
        stale = 0
        for engine_id, record in list(self._engines.items()):
            loop = record.loop
            if record.session is None:
                if now_s - record.disconnected_at_s >= self._config.loop.engine_ttl_s:
                    self._evict(engine_id, record, reason="ttl", now_s=now_s)
                continue
            if loop.is_due(now_s):
                self._decide(record, now_s)
            elif loop.keepalive_due(now_s + _KEEPALIVE_LEAD_S):
                # Sent up to two ticks before it falls due: one tick of lead keeps the gap inside the
                # keep-alive interval, the second absorbs a tick that runs late under load.
                self._push(record, loop.current, now_s)
            if gauges:
                age = now_s - loop.last_telemetry_s if loop.last_telemetry_s >= 0 else -1.0
                self._metrics.engine_series.row(engine_id, loop.hello.pool_key)[_TELEMETRY_AGE] = age
                stale += int(age > _STALE_AFTER_S)
        if self._evicted_since_trim and (self._evicted_since_trim >= _TRIM_AFTER_EVICTIONS
                                         or now_s - self._last_evicted_s >= _TRIM_QUIET_S):
            self._evicted_since_trim = 0
            collect_and_release()
        if self._restored and now_s - self._restored_at_s >= self._config.loop.engine_ttl_s:
            # Decisions restored at start-up for engines that never came back (the store keeps them).
            self._restored = {}
        if gauges:
            self._metrics.stale_engines.set(stale)
            self._metrics.store_pending_writes.set(self.writer.num_pending)
        for pool in self._pools.values():
            closed = pool.stats.close_due(now_s)
            if closed is not None:
                pool.unpublished.append((closed[1], closed[0]))

    def _evict(self, engine_id: str, record: EngineRecord, *, reason: str, now_s: float) -> None:
        """Forget a disconnected engine: its record, queue entry and metric series, and its pool when it was
        the pool's last engine here. reason: "ttl" (disconnected for engine_ttl_s) or "capacity" (its
        identity's max_disconnected_engines)."""
        del self._engines[engine_id]
        self._leave_disconnected_queue(engine_id, record)
        self._evicted_since_trim += 1
        self._last_evicted_s = now_s
        key = record.loop.hello.pool_key
        self._metrics.forget_engine(engine_id)
        self._metrics.evictions.labels(reason=reason).inc()
        # Early forgets are summed up by their counter and a warning a minute (`_remember_disconnected`): a
        # client cycling through engine ids would otherwise write hundreds of lines a second.
        logger.log(logging.INFO if reason == "ttl" else logging.DEBUG, "engine %s forgotten (%s) %.0f s after it "
                   "disconnected", engine_id, reason, now_s - record.disconnected_at_s)
        self._release_pool(key)

    def _release_pool(self, key: str) -> None:
        """One engine record of the pool is gone (forgotten, or moved to another pool); when it was the last,
        forget the pool here (its buckets stay in the store for the other replicas and for a warm start)."""
        pool = self._pools.get(key)
        if pool is None:
            return
        pool.num_records -= 1
        if pool.num_records <= 0:
            del self._pools[key]
            self._metrics.forget_pool(key)

    async def sync_pools(self, now_s: float | None = None, *, only: str | None = None) -> None:
        """Publish closed buckets, read the other replicas' and refresh each pool's estimate when its end
        bucket advanced (every pool, or `only` that one). Store failures leave the estimate on this
        replica's own buckets."""
        now_s = self._clock() if now_s is None else now_s
        for key, pool in list(self._pools.items()):
            if only is not None and key != only:
                continue
            stats = pool.stats
            closed = stats.close_due(now_s)
            if closed is not None:
                pool.unpublished.append((closed[1], closed[0]))
            if pool.unpublished:
                # Publish as soon as a bucket closes: other replicas read it settle_s later.
                await self._publish_buckets(key, pool)
            end_bucket = stats.estimate_bucket(now_s)
            if pool.refreshed_bucket is not None and end_bucket <= pool.refreshed_bucket:
                continue
            try:
                await asyncio.wait_for(self._exchange_buckets(key, pool, end_bucket), timeout=_EXCHANGE_TIMEOUT_S)
            except TimeoutError:
                self.note_store_failure("pool_statistics", TimeoutError("no answer within "
                                                                        f"{_EXCHANGE_TIMEOUT_S} s"))
            if self._pools.get(key) is not pool:  # forgotten while the exchange awaited the store
                continue
            started = time.perf_counter()
            estimate = stats.refresh(now_s, calibration=self._calibrations.get(key))
            self._metrics.pool_fit_latency.observe(time.perf_counter() - started)
            stats.prune(now_s)
            pool.refreshed_bucket = end_bucket
            self._set_pool_gauges(key, pool, estimate)
            if (now_s - pool.last_snapshot_s >= self._config.loop.snapshot_interval_s
                    and estimate.num_samples >= self._config.policy.min_samples and stats.last_window is not None):
                await self._save_snapshot(key, pool, stats.last_window, now_s)

    async def _warm_pool(self, key: str, pool: PoolRecord) -> None:
        """A pool new on this replica: seed it with its persisted window, then take in the shared buckets."""
        await self._load_snapshot(key, pool, self._clock())
        pool.refreshed_bucket = None
        await self.sync_pools(only=key)

    async def _load_snapshot(self, key: str, pool: PoolRecord, now_s: float) -> None:
        """Warm start: seed a new pool with its persisted window (tried once per pool, when it appears)."""
        try:
            payload = await asyncio.wait_for(self._store.get_pool_snapshot(key), timeout=_EXCHANGE_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            self.note_store_failure("pool_snapshot", exc)
            return
        if payload is None:
            return
        try:
            pool.stats.seed(BucketStats.from_bytes(payload), now_s=now_s)
            logger.info("pool %s: warm start from its persisted statistics", key)
        except ValueError as exc:
            logger.warning("pool %s: ignoring its persisted statistics: %s", key, exc)

    async def _save_snapshot(self, key: str, pool: PoolRecord, window: BucketStats, now_s: float) -> None:
        try:
            await asyncio.wait_for(self._store.put_pool_snapshot(key, window.to_bytes(),
                                                                 ttl_s=self._config.loop.snapshot_ttl_s),
                                   timeout=_EXCHANGE_TIMEOUT_S)
            pool.last_snapshot_s = now_s
        except (StoreUnavailable, TimeoutError) as exc:
            self.note_store_failure("pool_snapshot", exc)

    async def _publish_buckets(self, key: str, pool: PoolRecord) -> None:
        ttl_s = self._config.loop.max_window_s + 60.0
        try:
            for bucket_id, bucket in list(pool.unpublished):
                await asyncio.wait_for(self._store.put_pool_contribution(
                    key, bucket_start_s=bucket_id, replica_id=self._config.controller_id, payload=bucket.to_bytes(),
                    ttl_s=ttl_s), timeout=_EXCHANGE_TIMEOUT_S)
                pool.unpublished.remove((bucket_id, bucket))
        except (StoreUnavailable, TimeoutError) as exc:
            self.note_store_failure("pool_statistics", exc)
        # Buckets that could not be published for longer than a window are of no use to anyone.
        oldest = pool.stats.oldest_bucket(pool.stats.estimate_bucket(self._clock()))
        pool.unpublished = [(b, stats) for b, stats in pool.unpublished if b >= oldest]

    async def _exchange_buckets(self, key: str, pool: PoolRecord, end_bucket: int) -> None:
        stats = pool.stats
        try:
            first = max(0, stats.oldest_bucket(end_bucket), pool.fetched_through - _RECENT_BUCKETS_REFETCHED + 1)
            wanted = list(range(first, end_bucket + 1))
            remote = await self._store.get_pool_contributions(key, bucket_starts=wanted) if wanted else {}
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("pool_statistics", exc)
            return
        for bucket_id, by_replica in remote.items():
            for replica_id, payload in by_replica.items():
                if replica_id == self._config.controller_id or (stats.has_bucket(bucket_id, replica_id) \
                        and bucket_id < end_bucket - _RECENT_BUCKETS_REFETCHED):
                    continue
                if (bucket_id, replica_id) in pool.unreadable:
                    continue
                try:
                    stats.put_remote(bucket_id, replica_id, BucketStats.from_bytes(payload))
                except ValueError as exc:
                    self._note_unreadable_bucket(key, pool, bucket_id, replica_id, exc)
        pool.fetched_through = max(pool.fetched_through, end_bucket)
        if pool.unreadable:
            oldest = stats.oldest_bucket(end_bucket)
            pool.unreadable = {entry for entry in pool.unreadable if entry[0] >= oldest}

    def _note_unreadable_bucket(self, key: str, pool: PoolRecord, bucket_id: int, replica_id: str,
                                exc: ValueError) -> None:
        """A bucket another replica wrote that this one cannot read is left out of the pool's statistics,
        counted once, and warned about once per replica and pool (a replica of a newer bucket format writes
        one every second; the exchange re-reads the recent ones)."""
        pool.unreadable.add((bucket_id, replica_id))
        self._metrics.pool_buckets_unreadable.labels(pool=key).inc()
        if replica_id in pool.unreadable_replicas:
            logger.debug("pool %s: ignoring bucket %d of replica %s: %s", key, bucket_id, replica_id, exc)
            return
        pool.unreadable_replicas.add(replica_id)
        logger.warning("pool %s: ignoring bucket %d of replica %s: %s; its further unreadable buckets are "
                       "counted in cp_pool_buckets_unreadable_total, not logged", key, bucket_id, replica_id, exc)

    def _set_pool_gauges(self, key: str, pool: PoolRecord, estimate: PoolEstimate) -> None:
        m = self._metrics
        m.pool_engines.labels(pool=key).set(pool.num_connected)
        m.pool_samples.labels(pool=key).set(estimate.num_samples)
        if estimate.fit is not None:
            s = estimate.fit.stats
            m.pool_p0.labels(pool=key).set(s.p0)
            m.pool_mu_o.labels(pool=key).set(s.mu_o_tokens)
            m.pool_mu_l.labels(pool=key).set(s.mu_l_tokens)

    def pool_estimate(self, key: str):
        """The pool's latest estimate (None before the first refresh)."""
        pool = self._pools.get(key)
        return pool.stats.estimate if pool is not None else None

    # ---- operator actions ----

    async def set_override(self, record: operator_pb2.OverrideRecord, *, actor: str) -> operator_pb2.OverrideRecord:
        """Validate, store durably (or raise StoreUnavailable), trace, apply, and re-decide."""
        scope = scope_key(record.scope)  # raises ValueError for a bad scope
        if record.kind == operator_pb2.OVERRIDE_KIND_DELTA:
            value = record.delta_s_per_token
            if not (math.isfinite(value) and abs(value) <= DELTA_LIMIT_S_PER_TOKEN):
                raise OverrideError(f"delta_s_per_token must be finite and within ±{DELTA_LIMIT_S_PER_TOKEN} "
                                    f"s/token, got {value}")
        elif record.kind == operator_pb2.OVERRIDE_KIND_PIN:
            if record.mode == operator_pb2.PINNED_MODE_UNSPECIFIED:
                raise OverrideError("mode: a pin needs a mode (MB, EB, PASSTHROUGH or ADVISORY)")
            if record.k and record.n and record.k > record.n:
                raise OverrideError(f"k ({record.k}) must not exceed n ({record.n})")
        now_s = self._clock()
        record.set_by, record.set_at_s = actor, now_s
        old = await self._store.set_override(record, actor=actor, now_s=now_s)
        self._tracer.trace_override(action="set", kind=operator_pb2.OverrideKind.Name(record.kind), scope=scope,
                                    actor=actor, reason=record.reason, old=record_json(old),
                                    new=record_json(record))
        self._overrides = [r for r in self._overrides
                           if not (r.kind == record.kind and scope_key(r.scope) == scope)] + [record]
        self._update_override_metrics()
        self.redecide_all()
        return record

    async def clear_override(self, scope: operator_pb2.Scope, kind: int, *, actor: str,
                             reason: str) -> operator_pb2.OverrideRecord | None:
        """Remove an override; returns the cleared record, or None when there was none (nothing changes)."""
        key = scope_key(scope)
        if kind not in (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.OVERRIDE_KIND_PIN):
            raise OverrideError("kind: must be DELTA or PIN")
        old = await self._store.clear_override(scope, kind, actor=actor, reason=reason, now_s=self._clock())
        if old is None:
            return None
        self._tracer.trace_override(action="clear", kind=operator_pb2.OverrideKind.Name(kind), scope=key,
                                    actor=actor, reason=reason, old=record_json(old), new="")
        self._overrides = [r for r in self._overrides if not (r.kind == kind and scope_key(r.scope) == key)]
        self._update_override_metrics()
        self.redecide_all()
        return operator_pb2.OverrideRecord(scope=scope, kind=kind, set_by=actor, set_at_s=self._clock(),
                                           reason=reason, cleared=True)

    def overrides(self) -> list[operator_pb2.OverrideRecord]:
        """The overrides this replica holds in force (expired ones excluded)."""
        now_s = self._clock()
        return [r for r in self._overrides if not r.cleared and not (0 < r.expires_at_s <= now_s)]

    def _update_override_metrics(self) -> None:
        m = self._metrics
        m.overrides_in_force.clear()
        m.override_expiry.clear()
        for record in self.overrides():
            kind = "delta" if record.kind == operator_pb2.OVERRIDE_KIND_DELTA else "pin"
            scope_kind = operator_pb2.ScopeKind.Name(record.scope.kind).removeprefix("SCOPE_KIND_").lower()
            m.overrides_in_force.labels(kind=kind, scope_kind=scope_kind).inc()
            try:
                m.override_expiry.labels(kind=kind, scope=scope_key(record.scope)).set(record.expires_at_s)
            except ValueError:
                continue

    async def put_calibration(self, calibration: operator_pb2.Calibration, *, actor: str = "") -> \
            operator_pb2.Calibration:
        calibration_to_cost_model(calibration)  # raises ValueError naming the field
        pool_key(calibration.pool)
        try:
            await self._store.put_calibration(calibration, actor=actor)
        except TypeError:  # a store without calibration audit
            await self._store.put_calibration(calibration)
        self._set_calibration(calibration)
        key = pool_key(calibration.pool)
        pool = self._pools.get(key)
        if pool is not None:
            pool.stats.refresh(self._clock(), calibration=self._calibrations.get(key))
        self.redecide_all()
        return calibration

    def _set_calibration(self, calibration: operator_pb2.Calibration) -> None:
        try:
            self._calibrations[pool_key(calibration.pool)] = calibration_to_cost_model(calibration)
        except ValueError as exc:
            logger.warning("ignoring stored calibration for %s: %s", calibration.pool.model[:64], exc)

    def calibration(self, pool: common_pb2.Pool) -> operator_pb2.Calibration | None:
        costs = self._calibrations.get(pool_key(pool))
        return cost_model_to_calibration(costs, pool) if costs is not None else None

    # ---- views ----

    def decision_view(self, engine_id: str) -> operator_pb2.DecisionView | None:
        record = self._engines.get(engine_id)
        if record is not None and record.loop.current is not None:
            loop = record.loop
            view = operator_pb2.DecisionView(
                engine_id=engine_id, pool=common_pb2.Pool(model=loop.hello.model, accelerator=loop.hello.accelerator),
                decision=loop.current, acked_version=loop.acked_version, computed_at_s=loop.latest_computed_at_s)
            if loop.latest is not None:
                view.latest.CopyFrom(loop.latest)
                if loop.excluded_from_pool:
                    view.latest.flags.append("engine_excluded_from_pool")
            return view
        restored = self._restored.get(engine_id)
        if restored is not None:
            model, _, accelerator = restored[0].partition("|")
            return operator_pb2.DecisionView(engine_id=engine_id,
                                             pool=common_pb2.Pool(model=model, accelerator=accelerator),
                                             decision=restored[1])
        return None

    def engine_infos(self, pool: common_pb2.Pool | None = None) -> list[operator_pb2.EngineInfo]:
        now_s = self._clock()
        wanted = pool_key(pool) if pool is not None and (pool.model or pool.accelerator) else None
        return [self._engine_info(engine_id, record, now_s) for engine_id, record in sorted(self._engines.items())
                if wanted is None or record.loop.hello.pool_key == wanted]

    def _engine_info(self, engine_id: str, record: EngineRecord, now_s: float) -> operator_pb2.EngineInfo:
        loop = record.loop
        hello = loop.hello
        limits = hello.limits
        return operator_pb2.EngineInfo(
            engine_id=engine_id,
            pool=common_pb2.Pool(model=hello.model, accelerator=hello.accelerator),
            vllm_version=hello.vllm_version, agent_version=hello.agent_version,
            limits={"max_num_seqs": limits.max_num_seqs, "max_num_batched_tokens": limits.max_num_batched_tokens,
                    "kv_capacity_tokens": limits.kv_capacity_tokens, "block_size_tokens": hello.block_size_tokens,
                    "max_model_len_tokens": limits.max_model_len_tokens},
            connected=record.session is not None,
            telemetry_age_s=now_s - loop.last_telemetry_s if loop.last_telemetry_s >= 0 else -1.0,
            decision_version=loop.version, acked_version=loop.acked_version,
            num_completions=loop.num_completions, num_rejected_events=loop.num_rejected_events,
            num_sequence_gaps=loop.num_sequence_gaps, controller_id=self._config.controller_id,
            instance_id=hello.instance_id, excluded_from_pool=loop.excluded_from_pool,
        )

    def registry_chunks(self, size: int) -> Iterator[dict[str, dict[str, str]]]:
        """Registry entries (`fleet_view.registry_fields`) of the engines connected now, `size` at a time,
        each chunk built when asked for: the app's store loop writes one and lets the event loop run before
        the next (1,000 entries at once hold it for about 10 ms). An engine gone meanwhile is skipped."""
        engine_ids = [engine_id for engine_id, record in self._engines.items() if record.session is not None]
        for start in range(0, len(engine_ids), size):
            now_s = self._clock()
            chunk = {}
            for engine_id in engine_ids[start:start + size]:
                record = self._engines.get(engine_id)
                if record is not None and record.session is not None:
                    chunk[engine_id] = registry_fields(self._engine_info(engine_id, record, now_s), now_s=now_s)
            yield chunk

    def watch(self) -> asyncio.Queue[Pushed]:
        queue: asyncio.Queue[Pushed] = asyncio.Queue(maxsize=_WATCH_QUEUE)
        self._watchers.add(queue)
        return queue

    def offer_remote(self, event: Pushed) -> bool:
        """Hand every watcher another replica's decision, unless the engine's stream is open here (its
        pushes reach the watchers directly). Returns whether it was handed on."""
        record = self._engines.get(event.engine_id)
        if record is not None and record.session is not None:
            return False
        self._fan_out(event)
        return True

    def unwatch(self, queue: asyncio.Queue[Pushed]) -> None:
        self._watchers.discard(queue)

    def close_all_streams(self, message: str) -> None:
        for record in self._engines.values():
            if record.session is not None:
                record.session.mailbox.close(grpc.StatusCode.UNAVAILABLE, message)


__all__ = ["Controller", "EngineHello", "OverrideError", "Pushed", "StreamRefusedError"]
