"""The controller: engine registry, estimators, the decision loop, overrides, and the store write-through.

It owns no sockets: the servicers call it, and it hands decisions to per-engine outboxes and to
watchers. Redis failures never stop it: decisions keep being made from memory and are written through
when the store returns; overrides are the exception and fail loudly (StoreUnavailable).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.cost_model import CostModelEstimator
from controlplane.core.hazard import LengthWindow
from controlplane.core.policy import decide
from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, CostModel, Observations
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer
from controlplane.service.config import ControllerConfig
from controlplane.service.convert import (
    calibration_to_cost_model,
    cost_model_to_calibration,
    decision_to_proto,
    resolve_intent,
    same_instruction,
)
from controlplane.service.engines import EngineState, PoolState
from controlplane.service.ingest import EngineHello, ValidatedBatch
from controlplane.store import RedisStore, StoreUnavailable, pool_key, scope_key
from controlplane.store.records import record_json

logger = logging.getLogger(__name__)


class OverrideError(ValueError):
    """An override request is invalid (bad scope, δ out of range, bad pin); the message says which field."""


@dataclass(frozen=True, slots=True)
class Pushed:
    """A decision handed to an engine's outbox and to watchers."""

    engine_id: str
    pool_key: str
    decision: common_pb2.Decision


class Controller:
    """Decision-making state of one controller replica. Call from one asyncio event loop."""

    def __init__(
        self,
        config: ControllerConfig,
        *,
        store: RedisStore,
        tracer: DecisionTracer,
        metrics: ControllerMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store = store
        self._tracer = tracer
        self._metrics = metrics
        self._clock = clock
        self._engines: dict[str, EngineState] = {}
        self._pools: dict[str, PoolState] = {}
        self._outboxes: dict[str, asyncio.Queue[common_pb2.Decision]] = {}
        self._watchers: set[asyncio.Queue[Pushed]] = set()
        self._overrides: list[operator_pb2.OverrideRecord] = []
        self._calibrations: dict[str, CostModel] = {}
        self._stored_versions: dict[str, int] = {}
        self._restored: dict[str, tuple[str, common_pb2.Decision]] = {}
        self._pending_writes: dict[str, tuple[str, common_pb2.Decision]] = {}
        self.store_down_since_s: float | None = None

    def now_s(self) -> float:
        """The controller clock (Unix seconds)."""
        return self._clock()

    # ---- start-up and store ----

    async def restore(self) -> None:
        """Load overrides, calibrations and last decisions from the store (best effort; logged on failure)."""
        try:
            self._overrides = await self._store.list_overrides(self._clock())
            for calibration in (await self._store.list_calibrations()).values():
                self._set_calibration(calibration)
            self._restored = await self._store.load_decisions()
            self._stored_versions = {eid: d.version for eid, (_, d) in self._restored.items()}
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("restore", exc)

    async def reload_overrides(self) -> None:
        """Re-read overrides (after a pub/sub notice from another replica) and re-decide affected engines."""
        try:
            self._overrides = await self._store.list_overrides(self._clock())
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("list_overrides", exc)
            return
        await self.redecide_all()

    async def flush_pending(self) -> None:
        """Write through decisions that could not be stored while Redis was down; refresh the registry."""
        for engine_id, (pool, decision) in list(self._pending_writes.items()):
            try:
                await self._store.put_decision(engine_id, pool_key=pool, decision=decision)
            except StoreUnavailable as exc:
                self.note_store_failure("put_decision", exc)
                return
            if self._pending_writes.get(engine_id, (None, None))[1] is decision:
                del self._pending_writes[engine_id]
        try:
            for state in self._engines.values():
                if state.connected:
                    await self._store.heartbeat(state.hello.engine_id, info=self._registry_info(state),
                                                ttl_s=self._config.registry_ttl_s)
            self._store_ok()
        except StoreUnavailable as exc:
            self.note_store_failure("heartbeat", exc)

    def _store_ok(self) -> None:
        self.store_down_since_s = None

    def note_store_failure(self, operation: str, exc: Exception) -> None:
        """Count a failed store operation and remember since when the store is down."""
        self._metrics.store_errors.labels(operation=operation).inc()
        if self.store_down_since_s is None:
            self.store_down_since_s = self._clock()
            logger.warning("store unavailable during %s: %s; deciding from memory", operation, exc)

    @property
    def num_pending_writes(self) -> int:
        return len(self._pending_writes)

    # ---- engines ----

    def connect(self, hello: EngineHello) -> asyncio.Queue[common_pb2.Decision]:
        """Register an engine's new stream; returns the outbox its decisions are pushed to."""
        state = self._engines.get(hello.engine_id)
        if state is None or state.hello.pool_key != hello.pool_key:
            state = EngineState.create(hello, self._config.loop)
            restored = self._restored.get(hello.engine_id)
            if restored is not None:
                state.version = restored[1].version
            state.version = max(state.version, self._stored_versions.get(hello.engine_id, 0))
            self._engines[hello.engine_id] = state
        state.hello = hello
        state.connected = True
        state.last_seq = 0
        state.last_sent_s = float("-inf")
        if hello.pool_key not in self._pools:
            loop = self._config.loop
            self._pools[hello.pool_key] = PoolState(
                window=LengthWindow(output_window=loop.output_window, prompt_window=loop.prompt_window),
                costs=CostModelEstimator(window=loop.step_window),
            )
        outbox: asyncio.Queue[common_pb2.Decision] = asyncio.Queue()
        self._outboxes[hello.engine_id] = outbox
        self._metrics.connected_engines.set(sum(1 for s in self._engines.values() if s.connected))
        return outbox

    def disconnect(self, engine_id: str, outbox: asyncio.Queue[common_pb2.Decision]) -> None:
        """Forget a stream (only if it is still the engine's current one)."""
        if self._outboxes.get(engine_id) is outbox:
            del self._outboxes[engine_id]
            state = self._engines.get(engine_id)
            if state is not None:
                state.connected = False
        self._metrics.connected_engines.set(sum(1 for s in self._engines.values() if s.connected))

    def ingest(self, engine_id: str, batch: ValidatedBatch) -> None:
        state = self._engines[engine_id]
        gap = state.ingest(batch, now_s=self._clock(), loop=self._config.loop)
        pool = self._pools[state.hello.pool_key]
        pool.window.add_completions(batch.prompt_tokens, batch.output_tokens)
        pool.costs.add_steps(prefill_tokens=batch.prefill_tokens, decode_tokens=batch.decode_tokens,
                             decode_requests=batch.decode_requests, duration_s=batch.duration_s)
        m = self._metrics
        m.batches.labels(result="accepted").inc()
        m.events.labels(kind="completion", result="accepted").inc(batch.output_tokens.size)
        m.events.labels(kind="step", result="accepted").inc(batch.duration_s.size)
        m.events.labels(kind="any", result="dropped").inc(batch.num_dropped)
        if gap:
            m.sequence_gaps.inc(gap)

    def record_ack(self, engine_id: str, *, version: int, applied: bool) -> None:
        state = self._engines.get(engine_id)
        self._metrics.acks.labels(result="applied" if applied else "rejected").inc()
        if state is not None and applied:
            state.acked_version = max(state.acked_version, version)

    def decision_due(self, engine_id: str) -> bool:
        state = self._engines[engine_id]
        loop = self._config.loop
        return (state.completions_since_decision >= loop.recompute_completions
                or self._clock() - state.last_decided_s >= loop.interval_s)

    def refresh_due(self, engine_id: str) -> bool:
        state = self._engines[engine_id]
        return state.current is not None and self._clock() - state.last_sent_s >= self._config.loop.ttl_s / 3

    # ---- deciding ----

    def _observations(self, state: EngineState) -> Observations:
        pool = self._pools[state.hello.pool_key]
        own = len(state.window) >= self._config.policy.min_samples
        window = state.window if own else pool.window
        costs = self._calibrations.get(state.hello.pool_key)
        if costs is None:
            # The pool's fit fills the phases the engine has not measured (an engine in MB mode rarely
            # runs a pure prefill step, one pinned to EB never a mixed one); it is only computed then.
            own_fit = state.costs.fit() if own else None
            if own_fit is not None and own_fit.is_complete():
                costs = own_fit.to_cost_model()
            else:
                pooled = pool.costs.fit().to_cost_model()
                costs = own_fit.to_cost_model(fallback=pooled) if own_fit is not None else pooled
        return Observations(
            output_lengths_tokens=window.output_lengths(),
            prompt_lengths_tokens=window.prompt_lengths(),
            costs=costs,
            limits=state.hello.limits,
            n_obs=state.n_obs,
            num_rejected_samples=state.num_rejected_events,
            num_preemptions=state.preemptions_since_decision,
        )

    async def decide_engine(self, engine_id: str, *, force_push: bool = False) -> common_pb2.Decision | None:
        """Recompute one engine's decision; push it (new version) when the instruction changed.

        With force_push a refresh of the current decision (same version) is pushed when nothing changed.
        Returns what was pushed, or None.
        """
        state = self._engines[engine_id]
        now_s = self._clock()
        started = time.perf_counter()
        intent = resolve_intent(self._overrides, engine_id=engine_id, pool_key=state.hello.pool_key, now_s=now_s)
        decision, state.policy_state = decide(self._observations(state), state.policy_state, now_s,
                                              intent=intent, config=self._config.policy)
        self._metrics.decision_latency.observe(time.perf_counter() - started)
        state.last_decided_s = now_s
        state.completions_since_decision = 0
        state.preemptions_since_decision = 0
        candidate = decision_to_proto(decision, version=state.version + 1, ttl_s=self._config.loop.ttl_s,
                                      decided_at_s=now_s, trace_id="")
        if state.current is not None and same_instruction(state.current, candidate):
            if force_push or self.refresh_due(engine_id):
                return self._push(state, state.current, now_s)
            return None
        state.version += 1
        candidate.trace_id = self._tracer.trace_decision(
            decision, engine_id=engine_id, pool=state.hello.pool_key, version=state.version,
            traceparent=state.traceparent,
        )
        state.current = candidate
        self._metrics.decisions.labels(mode=decision.mode.value, reason=decision.reason.value).inc()
        await self._write_decision(engine_id, state.hello.pool_key, candidate)
        return self._push(state, candidate, now_s)

    def _push(self, state: EngineState, decision: common_pb2.Decision, now_s: float) -> common_pb2.Decision:
        state.last_sent_s = now_s
        outbox = self._outboxes.get(state.hello.engine_id)
        if outbox is not None:
            outbox.put_nowait(decision)
        event = Pushed(engine_id=state.hello.engine_id, pool_key=state.hello.pool_key, decision=decision)
        for watcher in self._watchers:
            watcher.put_nowait(event)
        return decision

    async def _write_decision(self, engine_id: str, pool: str, decision: common_pb2.Decision) -> None:
        try:
            await self._store.put_decision(engine_id, pool_key=pool, decision=decision)
            self._pending_writes.pop(engine_id, None)
            self._store_ok()
        except StoreUnavailable as exc:
            self._pending_writes[engine_id] = (pool, decision)
            self.note_store_failure("put_decision", exc)

    async def redecide_all(self) -> None:
        """Re-decide every connected engine now (after an override change)."""
        for engine_id, state in list(self._engines.items()):
            if state.connected:
                await self.decide_engine(engine_id)

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
        await self.redecide_all()
        return record

    async def clear_override(self, scope: operator_pb2.Scope, kind: int, *, actor: str,
                             reason: str) -> operator_pb2.OverrideRecord:
        key = scope_key(scope)
        if kind not in (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.OVERRIDE_KIND_PIN):
            raise OverrideError("kind: must be DELTA or PIN")
        old = await self._store.clear_override(scope, kind, actor=actor, reason=reason, now_s=self._clock())
        self._tracer.trace_override(action="clear", kind=operator_pb2.OverrideKind.Name(kind), scope=key,
                                    actor=actor, reason=reason, old=record_json(old), new="")
        self._overrides = [r for r in self._overrides if not (r.kind == kind and scope_key(r.scope) == key)]
        await self.redecide_all()
        cleared = operator_pb2.OverrideRecord(scope=scope, kind=kind, set_by=actor, set_at_s=self._clock(),
                                              reason=reason, cleared=True)
        return cleared

    async def put_calibration(self, calibration: operator_pb2.Calibration) -> operator_pb2.Calibration:
        calibration_to_cost_model(calibration)  # raises ValueError naming the field
        pool_key(calibration.pool)
        await self._store.put_calibration(calibration)
        self._set_calibration(calibration)
        await self.redecide_all()
        return calibration

    def _set_calibration(self, calibration: operator_pb2.Calibration) -> None:
        try:
            self._calibrations[pool_key(calibration.pool)] = calibration_to_cost_model(calibration)
        except ValueError as exc:
            logger.warning("ignoring stored calibration for %s: %s", pool_key(calibration.pool), exc)

    def calibration(self, pool: common_pb2.Pool) -> operator_pb2.Calibration | None:
        costs = self._calibrations.get(pool_key(pool))
        return cost_model_to_calibration(costs, pool) if costs is not None else None

    # ---- views ----

    def decision_view(self, engine_id: str) -> operator_pb2.DecisionView | None:
        state = self._engines.get(engine_id)
        if state is not None and state.current is not None:
            model, accelerator = state.hello.model, state.hello.accelerator
            return operator_pb2.DecisionView(engine_id=engine_id,
                                             pool=common_pb2.Pool(model=model, accelerator=accelerator),
                                             decision=state.current, acked_version=state.acked_version)
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
        infos = []
        for engine_id, state in sorted(self._engines.items()):
            hello = state.hello
            if wanted is not None and hello.pool_key != wanted:
                continue
            limits = hello.limits
            infos.append(operator_pb2.EngineInfo(
                engine_id=engine_id,
                pool=common_pb2.Pool(model=hello.model, accelerator=hello.accelerator),
                vllm_version=hello.vllm_version, agent_version=hello.agent_version,
                limits={"max_num_seqs": limits.max_num_seqs, "max_num_batched_tokens": limits.max_num_batched_tokens,
                        "kv_capacity_tokens": limits.kv_capacity_tokens, "block_size_tokens": hello.block_size_tokens,
                        "max_model_len_tokens": limits.max_model_len_tokens},
                connected=state.connected,
                telemetry_age_s=now_s - state.last_telemetry_s if state.last_telemetry_s >= 0 else -1.0,
                decision_version=state.current.version if state.current is not None else 0,
                acked_version=state.acked_version, num_completions=state.num_completions,
                num_rejected_events=state.num_rejected_events, num_sequence_gaps=state.num_sequence_gaps,
                controller_id=self._config.controller_id,
            ))
        return infos

    def _registry_info(self, state: EngineState) -> dict[str, str]:
        return {"pool": state.hello.pool_key, "controller_id": self._config.controller_id,
                "vllm_version": state.hello.vllm_version, "agent_version": state.hello.agent_version,
                "decision_version": str(state.current.version if state.current is not None else 0),
                "last_telemetry_s": repr(state.last_telemetry_s)}

    def watch(self) -> asyncio.Queue[Pushed]:
        queue: asyncio.Queue[Pushed] = asyncio.Queue(maxsize=10_000)
        self._watchers.add(queue)
        return queue

    def unwatch(self, queue: asyncio.Queue[Pushed]) -> None:
        self._watchers.discard(queue)

    def connected_engine_ids(self) -> list[str]:
        return [eid for eid, s in self._engines.items() if s.connected]
