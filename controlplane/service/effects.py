"""Applying the fleet state machine's effects: the one place its outputs reach the world.

`EffectsApplier.apply` takes what `loop.fleet.FleetState` returned for one event and, in this order: counts
sequence gaps and decide latencies; traces and counts each decision; pushes decisions to their streams'
mailboxes and to the watchers; hands decisions to the coalescing `DecisionWriter`; queues closed buckets for
the store exchange (`PoolSync`); logs and counts pool memberships and rollouts (rollouts are traced and
audited too); counts forgotten engines and forgets their pools. It never awaits: it runs on the push path.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from controlplane.loop.fleet import Effects, FleetState
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer
from controlplane.service.audit_writer import AuditWriter, rollout_audit
from controlplane.service.memory import TrimSchedule
from controlplane.service.pool_sync import PoolSync
from controlplane.service.sessions import Session
from controlplane.service.watchers import Pushed, Watchers
from controlplane.service.writer import DecisionWriter

logger = logging.getLogger(__name__)
# At most one warning per this many seconds that an identity's disconnected engines are forgotten early.
_CAPACITY_WARNING_EVERY_S = 60.0


class EffectsApplier:
    """Applies a replica's `Effects` to its metrics, tracer, streams, watchers, writer, buckets and audits."""

    def __init__(self, fleet: FleetState, *, metrics: ControllerMetrics, tracer: DecisionTracer,
                 watchers: Watchers, writer: DecisionWriter, pools: PoolSync, audits: AuditWriter,
                 trim: TrimSchedule, max_disconnected_engines: int, clock: Callable[[], float]) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._tracer = tracer
        self._watchers = watchers
        self._writer = writer
        self._pools = pools
        self._audits = audits
        self._trim = trim
        self._max_disconnected_engines = max_disconnected_engines
        self._clock = clock
        self._capacity_warned_s = -math.inf

    def apply(self, effects: Effects) -> None:
        """Apply what the machine asked for: trace and count decisions, push, persist, publish, forget."""
        m = self._metrics
        if effects.sequence_gaps:
            m.sequence_gaps.inc(effects.sequence_gaps)
        for latency_s in effects.decide_latencies_s:
            m.decision_latency.observe(latency_s)
        for made in effects.decided:
            latest, loop = made.outcome.latest, self._fleet.engine(made.engine_id).loop
            latest.trace_id = self._tracer.trace_decision(made.outcome.decision, engine_id=made.engine_id,
                                                          pool=made.pool_key, version=latest.version,
                                                          traceparent=made.traceparent)
            m.decisions.labels(mode=made.outcome.decision.mode.value, reason=made.outcome.decision.reason.value).inc()
            m.show_decision(made.engine_id, made.pool_key, loop.current, loop.acked_version)
        for push in effects.pushes:
            if isinstance(push.stream, Session):
                push.stream.mailbox.put(push.decision)
            if push.watch:
                self._watchers.hand_on(Pushed(engine_id=push.engine_id, pool_key=push.pool_key, decision=push.decision))
        for made in effects.decided:
            self._writer.submit(made.engine_id, pool_key=made.pool_key, decision=made.outcome.latest)
        for key, bucket_id, bucket in effects.buckets:
            self._pools.queue(key, bucket_id, bucket)
        for change in effects.memberships:
            v = change.verdict
            logger.warning("engine %s %s pool %s statistics (block mean %.1f tokens vs pool %.1f)", change.engine_id,
                           "kept out of" if v.excluded else "readmitted to", change.pool_key, v.block_mean_tokens,
                           v.pool_mean_tokens)
            m.pool_excluded_engines.labels(pool=change.pool_key).set(change.num_excluded)
        for event in effects.rollouts:
            logger.info("pool %s: rollout %s→%s %s: %s", event.pool_key, event.from_mode, event.to_mode, event.event,
                        event.detail)
            m.pool_rollouts.labels(pool=event.pool_key, event=event.event).inc()
            self._tracer.trace_rollout(event)
            self._audits.submit(rollout_audit(event, actor=event.actor or f"controller {self._fleet.replica_id}",
                                              at_s=self._clock()))
        if effects.forgotten:
            self._note_forgotten(effects)
        for key in effects.forgotten_pools:
            self._pools.forget(key)

    def _note_forgotten(self, effects: Effects) -> None:
        now_s = self._clock()
        capacity = None
        for gone in effects.forgotten:
            self._metrics.forget_engine(gone.engine_id)
            self._metrics.evictions.labels(reason=gone.reason).inc()
            # Early forgets are summed up by their counter and a warning a minute: a client cycling through
            # engine ids would otherwise write hundreds of lines a second.
            logger.log(logging.INFO if gone.reason == "ttl" else logging.DEBUG, "engine %s forgotten (%s) %.0f s "
                       "after it disconnected", gone.engine_id, gone.reason, gone.disconnected_for_s)
            capacity = gone.identity if gone.reason == "capacity" else capacity
        self._trim.note_freed(len(effects.forgotten), now_s)
        if capacity is not None and now_s - self._capacity_warned_s >= _CAPACITY_WARNING_EVERY_S:
            self._capacity_warned_s = now_s
            logger.warning("agent identity %r has more than %d engines disconnected: its longest-disconnected are "
                           "forgotten before engine_ttl_s (cp_engines_evicted_total{reason=\"capacity\"}; "
                           "raise max_disconnected_engines if a fleet this size disconnects at once)",
                           capacity, self._max_disconnected_engines)
