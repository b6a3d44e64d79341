"""The fleet state machine: every engine and pool one controller replica (or the twin) holds, and how events
move them. The controller's service layer and the twin drive this same object, so they cannot disagree.

Events, each with the time as an argument (`now_s`, controller seconds), each returning `Effects`:
- `attach` (a hello whose stream won the engine id) and `first_decision` (once the pool is warm);
- `batch` (a validated telemetry batch): engine loop → probation and outlier judging → pool buckets →
  decide when due, in that order;
- `detach` (the stream ended), `tick` (due decisions, keep-alives, bucket closes, forgetting disconnected
  engines), `set_overrides`, `set_calibration`, and the replicas' exchange: `close_bucket`, `take_peer_bucket`,
  `seed_pool`, `refresh_pool`, `take_peer_rollouts`.

Effects are what the caller applies: decisions to trace and persist, messages to push to a stream and show
to watchers, closed buckets to publish, engines and pools forgotten, pool membership changes, sequence gaps.
A stream is an opaque handle the caller gives (`attach`): the machine only compares it, so a batch or a
detach from a stream that no longer holds its engine id is ignored.

A pool calibration takes precedence over the online cost fit: while a pool has one, an estimate fitted
with other costs is not decided on (the engine is decided as with no estimate until the refresh).

No I/O and no clock: `timer` (optional) only measures how long each decide() takes, for a metric.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.cost_sums import StepColumns
from controlplane.core.types import CostModel, DeltaSource, OperatorIntent, PolicyConfig
from controlplane.loop.buckets import BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.effects import Decided, Effects, Forgotten, MembershipChange, Push, RolloutEvent
from controlplane.loop.engine import EngineLoop
from controlplane.loop.engine_objectives import EngineObjectives
from controlplane.loop.estimate import PoolEstimate, moved_on_shift
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.loop.judging import CONFIRM_BLOCKS, MIN_POOL_ENGINES, HeldBatch, Reference, Released, judge_block
from controlplane.loop.latest_blocks import LatestBlocks
from controlplane.loop.objective import ObjectiveTracker, sync_tracker
from controlplane.loop.objective_view import PoolView, pool_view
from controlplane.loop.outcomes import LatencySet, OutcomeSummary
from controlplane.loop.overrides import resolve_intent
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.loop.records import DisconnectedEngines, EngineRecord, PoolRecord
from controlplane.loop.rollout import UNGUIDED_SOURCES, Asked, held_intent
from controlplane.loop.rollout import Verdict as RolloutVerdict
from controlplane.loop.rollout_peers import PeerRollout, apply_peers

_EMPTY = np.zeros(0)
# Due engines a tick decides at most: the others wait for their batch or the next tick (a tick never stalls the loop).
MAX_TICK_DECISIONS = 64


class FleetState:
    """Engines and pools of one replica (see the module docstring). default_intent: what an engine is decided
    with where no override of a kind is in force (the twin's δ and pin; empty in the controller)."""

    def __init__(self, loop_config: DecisionLoopConfig, policy: PolicyConfig, *, replica_id: str, budget_sweep=(),
                 default_intent: OperatorIntent | None = None, timer: Callable[[], float] | None = None,
                 guard_rollouts: bool = True, panel_key: bytes | None = None) -> None:
        self.loop_config, self.policy, self.replica_id = loop_config, policy, replica_id
        self.guard_rollouts = guard_rollouts  # mode changes go through canaries (`loop.rollout`); off: at once
        self._budget_sweep = budget_sweep
        self._timer = timer
        # Keys the pools' reference panels (`loop.latest_blocks`): secret to this replica unless given.
        self._panel_key = os.urandom(16) if panel_key is None else panel_key
        self._default_intent = default_intent or OperatorIntent()
        self._engines: dict[str, EngineRecord] = {}
        self._pools: dict[str, PoolRecord] = {}
        self._disconnected = DisconnectedEngines()
        self._overrides: list[operator_pb2.OverrideRecord] = []
        self._trackers: dict[str, ObjectiveTracker] = {}  # per pool under a latency objective
        self._engine_objectives = EngineObjectives(loop_config.bucket_s)  # engines under their own
        self._calibrations: dict[str, CostModel] = {}
        self.restored: dict[str, tuple[str, common_pb2.Decision]] = {}  # engine id → (pool key, decision)
        self._restored_at_s = 0.0
        self.num_connected = 0

    # ---- reads ----

    def engine(self, engine_id: str) -> EngineRecord | None:
        return self._engines.get(engine_id)

    def outcomes_of(self, engine_id: str) -> OutcomeSummary | None:
        """The measured latencies of the statistics an engine is decided from (its pool's, or its own while it
        serves a distinct workload); None when unknown or when none were reported."""
        record = self._engines.get(engine_id)
        if record is None:
            return None
        if self._engine_objectives.tracker(engine_id) is not None:
            return self._engine_objectives.summary(engine_id)
        if record.own is not None:
            return record.own.outcomes.summary()
        pool = self._pools.get(record.loop.hello.pool_key)
        return pool.stats.outcomes.summary() if pool is not None else None

    def engines(self) -> Iterator[tuple[str, EngineRecord]]:
        return iter(list(self._engines.items()))

    def pool(self, key: str) -> PoolRecord | None:
        return self._pools.get(key)

    def pool_keys(self) -> list[str]:
        return list(self._pools)

    def calibration(self, key: str) -> CostModel | None:
        return self._calibrations.get(key)

    @property
    def override_records(self) -> list[operator_pb2.OverrideRecord]:
        """Every override held, as last set (expired ones included: `overrides` filters them)."""
        return list(self._overrides)

    def overrides(self, now_s: float) -> list[operator_pb2.OverrideRecord]:
        """The overrides in force (expired ones excluded)."""
        return [r for r in self._overrides if not r.cleared and not (0 < r.expires_at_s <= now_s)]

    def holds(self, engine_id: str, stream: object) -> EngineRecord | None:
        """The engine's record when `stream` holds its id, else None."""
        record = self._engines.get(engine_id)
        return record if record is not None and record.stream is stream else None

    # ---- state restored from the store, streams ----

    def restore_decisions(self, restored: dict[str, tuple[str, common_pb2.Decision]], now_s: float) -> None:
        """Last decisions from the store (a restart): versions continue above them, views show them."""
        self.restored, self._restored_at_s = restored, now_s

    def attach(self, hello: EngineHello, *, identity: str, epoch: int, stream: object, now_s: float) -> Effects:
        """Bind `stream` to hello's engine id (the caller has checked identity and takeover: the previous
        stream, if any, lost). A new engine, or one that moved pool, gets a new loop."""
        effects = Effects()
        record = self._engines.get(hello.engine_id)
        if record is not None and not record.connected:
            self._disconnected.leave(record.identity, hello.engine_id)
        if record is None or record.loop.hello.pool_key != hello.pool_key:
            if record is not None:  # the engine moved to another pool
                old_key = record.loop.hello.pool_key
                if record.connected:
                    self._pools[old_key].num_connected -= 1
                    self.num_connected -= 1
                    self._pools[old_key].stats.forget_engine(hello.engine_id)
                self._pools[old_key].blocks.pop(hello.engine_id)
                self._release_pool(old_key, effects)
            loop = EngineLoop(hello=hello, config=self.loop_config, policy=self.policy,
                              budget_sweep=self._budget_sweep)
            restored = self.restored.pop(hello.engine_id, None)
            if restored is not None:
                loop.restore(restored[1])
            record = EngineRecord(loop=loop, identity=identity)
            self._engines[hello.engine_id] = record
            self._pool_of(hello.pool_key).num_records += 1
        loop = record.loop
        loop.hello = hello
        loop.last_seq = 0
        loop.last_sent_s = float("-inf")
        loop.begin_epoch(epoch)
        pool = self._pool_of(hello.pool_key)
        if not record.connected:
            pool.num_connected += 1
            self.num_connected += 1
        record.stream = stream
        return effects

    def first_decision(self, engine_id: str, stream: object, now_s: float) -> Effects:
        """The decision pushed when a stream opens (forced out even when unchanged)."""
        effects = Effects()
        record = self.holds(engine_id, stream)
        if record is not None:
            self._decide(record, now_s, effects, force_push=True)
        return effects

    def detach(self, engine_id: str, stream: object, now_s: float) -> Effects:
        """The stream ended; its engine is remembered (disconnected) if the stream still held its id."""
        effects = Effects()
        record = self.holds(engine_id, stream)
        if record is None:
            return effects
        record.stream = None
        record.disconnected_at_s = now_s
        pool = self._pools[record.loop.hello.pool_key]
        pool.num_connected -= 1
        self.num_connected -= 1
        pool.stats.forget_engine(engine_id)
        pool.blocks.pop(engine_id)
        self._remember_disconnected(engine_id, record, now_s, effects)
        return effects

    def _remember_disconnected(self, engine_id: str, record: EngineRecord, now_s: float, effects: Effects) -> None:
        """Queue a newly disconnected engine under its identity; past the identity's max_disconnected_engines
        (unless 0), forget its longest-disconnected engines now (their TTL would let a client cycling through
        engine ids hold memory in proportion to its rate)."""
        for oldest in self._disconnected.add(record.identity, engine_id, self.loop_config.max_disconnected_engines):
            self._forget(oldest, self._engines[oldest], "capacity", now_s, effects)

    def ack(self, engine_id: str, stream: object, *, version: int, applied: bool) -> str | None:
        """Record an ACK: "applied", "rejected" or "unknown_version"; None when the stream lost the id."""
        record = self.holds(engine_id, stream)
        return record.loop.ack(version, applied=applied) if record is not None else None

    # ---- telemetry ----

    def batch(self, engine_id: str, stream: object, batch: ValidatedBatch, now_s: float) -> Effects | None:
        """One validated batch: the engine's loop, judging, the pool's buckets, then a decision if due. None
        when the stream no longer holds the engine id (the batch is ignored)."""
        record = self.holds(engine_id, stream)
        if record is None:
            return None
        effects = Effects()
        loop = record.loop
        effects.sequence_gaps += int(loop.on_batch(batch, now_s=now_s))
        pool = self._pools[loop.hello.pool_key]
        rollout = pool.rollouts.active
        if rollout is not None and batch.duration_s.size:
            rollout.observe(engine_id, now_s, float(batch.decode_tokens.sum()), float(batch.duration_s.sum()))
        latencies = batch.latencies
        if rollout is not None and rollout.objective is not None and latencies is not None:
            rollout.observe_latencies(engine_id, now_s, LatencySet.from_values(latencies.ttft_s, latencies.tpot_s,
                                                                               _EMPTY))
        prompts, outputs = batch.prompt_tokens, batch.output_tokens
        record.finished.add(now_s, outputs.size)
        admitted_age_s = batch.admitted_age_s if outputs.size else None
        self._engine_objectives.add(engine_id, batch.latencies, now_s)
        if outputs.size:
            if record.judge.on_probation:
                record.judge.hold(HeldBatch(prompts, outputs, admitted_age_s, now_s))
                prompts = outputs = _EMPTY
                admitted_age_s = None
            self._judge(record, pool, batch.prompt_tokens, batch.output_tokens, now_s, effects)
        # An engine on probation adds nothing to its pool: neither completions nor running requests nor steps.
        held = record.judge.on_probation
        self._add(record, pool, now_s, effects, prompts=prompts, outputs=outputs,
                  steps=None if held else StepColumns(batch.prefill_tokens, batch.decode_tokens,
                                                      batch.decode_requests, batch.duration_s),
                  running_lengths=None if held else batch.running_lengths,
                  running_counts=None if held else batch.running_counts,
                  admitted_age_s=admitted_age_s, running_admitted_age_s=batch.running_admitted_age_s,
                  latencies=batch.latencies)
        if loop.is_due(now_s, urgent_since_s=pool.urgent_since_s):
            self._decide(record, now_s, effects, trigger_traceparent=batch.traceparent)
        return effects

    def _add(self, record: EngineRecord, pool: PoolRecord, now_s: float, effects: Effects, **columns) -> None:
        """Add an engine's completions and steps to its pool's statistics, or, while it serves a distinct
        workload, to its own (which are never published: only its own decisions read them)."""
        engine_id = record.loop.hello.engine_id
        if record.own is not None:
            record.own.add(now_s, engine_id=engine_id, **columns)
            return
        closed = pool.stats.add(now_s, engine_id=engine_id, **columns)
        if closed is not None:
            effects.buckets.append((pool.stats.pool_key, closed[1], closed[0]))

    def _release(self, record: EngineRecord, pool: PoolRecord, released: Released | None, now_s: float,
                 effects: Effects) -> None:
        if released is not None:
            self._add(record, pool, now_s, effects, prompts=released.prompts, outputs=released.outputs, steps=None,
                      admitted_age_s=released.admitted_age_s)

    def _judge(self, record: EngineRecord, pool: PoolRecord, prompts: np.ndarray, outputs: np.ndarray, now_s: float,
               effects: Effects) -> None:
        """Probation and judging of one batch's completions against the pool's robust reference
        (`loop.judging`): a distinct engine is kept out of the pool and decided from its own statistics."""
        judge = record.judge
        engine_id = record.loop.hello.engine_id
        if judge.on_probation and self._reference(pool, engine_id) is None:
            self._release(record, pool, judge.end_probation(now_s, admit=True), now_s, effects)
        previous = pool.blocks.get(engine_id)
        block = judge.add_to_block(prompts, outputs, now_s)
        if block is None:
            return
        # Compared with the blocks the others ended since this block began (like with like in time); a block of
        # a single batch with those ended since this engine's previous block, a held block with the latest.
        reference = self._reference(pool, engine_id, since_s=block.started_at_s)
        if reference is None and block.started_at_s == block.ended_at_s:
            reference = self._reference(pool, engine_id, since_s=previous.ended_at_s if previous else -math.inf)
        if reference is None and judge.on_probation:  # a held block is judged against the latest there are
            reference = self._reference(pool, engine_id)
        pool.blocks.put(engine_id, block)
        if reference is None:
            return
        verdict = judge_block(block, reference)
        judge.distinct_blocks = judge.distinct_blocks + 1 if verdict.excluded else 0
        distinct = judge.distinct_blocks >= CONFIRM_BLOCKS
        if verdict.excluded and not distinct:
            return  # one distinct block may be a pool-wide shift seen first: the next one decides
        if distinct != record.loop.excluded_from_pool:
            record.loop.excluded_from_pool = distinct
            pool.stats.forget_engine(engine_id)  # its running requests leave (or rejoin) the pool with it
            record.own = PoolStatistics(f"{pool.stats.pool_key}#{engine_id}", self.loop_config,
                                        replica_id=self.replica_id) if distinct else None
            pool.num_excluded += 1 if distinct else -1
            (pool.distinct.add if distinct else pool.distinct.discard)(engine_id)
            effects.memberships.append(MembershipChange(engine_id, pool.stats.pool_key, verdict, pool.num_excluded))
        if judge.on_probation:  # into the pool, or a distinct engine's own statistics
            self._release(record, pool, judge.end_probation(now_s, admit=True), now_s, effects)

    def _reference(self, pool: PoolRecord, engine_id: str, *, since_s: float = -math.inf) -> Reference | None:
        """The pool's robust reference for judging engine_id: its reference panel's other member engines'
        latest blocks (those that ended at or after since_s)."""
        if pool.num_connected < MIN_POOL_ENGINES:
            return None
        return pool.blocks.reference(excluding=engine_id, since_s=since_s, left_out=pool.distinct)

    # ---- deciding ----

    def _decide(self, record: EngineRecord, now_s: float, effects: Effects, *, force_push: bool = False,
                trigger_traceparent: str = "") -> None:
        loop = record.loop
        hello = loop.hello
        own = self._own_estimate(record, now_s)
        record.decided_from_own = own is not None
        estimate = own or self._pools[hello.pool_key].stats.estimate
        if (estimate is not None and hello.pool_key in self._calibrations
                and estimate.cost_source != "calibration"):
            estimate = None
        intent = resolve_intent(self._overrides, engine_id=hello.engine_id, pool_key=hello.pool_key, now_s=now_s,
                                default=self._default_intent)
        tracker = self.objective_for_engine(hello.engine_id)
        if tracker is not None and intent.delta_source == DeltaSource.DEFAULT:
            intent = tracker.intent(pin=intent.pin)
        pool = self._pools[hello.pool_key]
        base_intent = intent
        # Guarded: no pin, no explicit δ override (the operator's changes bypass rollouts), part of its pool.
        guarded = (self.guard_rollouts and intent.pin.mode is None and not intent.pin.advisory
                   and intent.delta_source in UNGUIDED_SOURCES and record.own is None)
        if guarded:
            intent = held_intent(intent, pool.rollouts.hold_for(hello.engine_id, now_s))
        started = self._timer() if self._timer is not None else 0.0
        outcome = loop.decide(estimate, intent=intent, now_s=now_s, force_push=force_push,
                              trigger_traceparent=trigger_traceparent)
        if guarded and outcome.decision.diagnostics.theta0 > 0:  # a data-driven verdict (not a cold start)
            key, wanted = hello.pool_key, loop.policy_state.mode
            # Judged on the pool's objective; a lone engine's switchback on the engine's own.
            judge = self._trackers.get(key) or (tracker if pool.num_connected == 1 else None)
            asked, rollout = pool.rollouts.asked(hello.engine_id, wanted, lambda: self._guarded(key), now_s,
                                                 objective=judge.objective if judge is not None else None)
            if rollout is not None:
                effects.rollouts.append(RolloutEvent(key, "started", rollout.from_mode.value, rollout.to_mode.value,
                                                     rollout.describe(pool.num_connected)))
                self._decide_pool(key, now_s, effects, skip=hello.engine_id)
            if asked is not Asked.NOTHING and outcome.decision.mode != wanted:
                outcome = loop.decide(estimate, intent=held_intent(base_intent, wanted), now_s=now_s,
                                      force_push=force_push, trigger_traceparent=trigger_traceparent)
        effects.num_computed += 1
        if self._timer is not None:
            effects.decide_latencies_s.append(self._timer() - started)
        if outcome.changed and outcome.latest is not None:
            effects.decided.append(Decided(hello.engine_id, hello.pool_key, outcome, loop.traceparent))
        if outcome.push is not None:
            self._push(record, outcome.push, now_s, effects)

    def _own_estimate(self, record: EngineRecord, now_s: float) -> PoolEstimate | None:
        """A distinct engine's own estimate (refreshed when its end bucket advanced), once it holds
        min_samples completions or is re-based at a shift; None otherwise (decided from its pool's)."""
        own = record.own
        if own is None:
            return None
        if own.estimate is None or own.estimate_bucket(now_s) > own.estimate.end_bucket:
            own.refresh(now_s, calibration=self._calibrations.get(record.loop.hello.pool_key))
            own.prune(now_s)
        estimate = own.estimate
        if estimate is None or estimate.fit is None:
            return None
        # As the pool's: a re-based window is decided on whatever its size (a shift is not a cold start).
        established = estimate.window_rebased or estimate.window_cohort
        return estimate if established or estimate.num_samples >= self.policy.min_samples else None

    def _push(self, record: EngineRecord, decision: common_pb2.Decision, now_s: float, effects: Effects) -> None:
        loop = record.loop
        if record.connected:
            loop.mark_sent(decision, now_s=now_s)
        watch = decision.version != record.watched_version
        record.watched_version = decision.version
        effects.pushes.append(Push(loop.hello.engine_id, loop.hello.pool_key, decision, record.stream, watch))

    def redecide_all(self, now_s: float, *, engine_ids: Iterable[str] | None = None) -> Effects:
        """Re-decide every connected engine now (those of engine_ids still connected, when given)."""
        effects = Effects()
        for record in list(self._engines.values() if engine_ids is None else map(self._engines.get, engine_ids)):
            if record is not None and record.connected:
                self._decide(record, now_s, effects)
        return effects

    def set_overrides(self, records: list[operator_pb2.OverrideRecord], now_s: float, *,
                      redecide: bool = True) -> Effects:
        """Replace the overrides held (every scope and kind), follow the pools' objectives (a new or changed one
        is evaluated at once) and re-decide every connected engine (redecide False: the caller does, in parts)."""
        self._overrides = list(records)
        for key, pool in self._pools.items():
            tracker = sync_tracker(self._trackers, self._overrides, key, now_s)
            if tracker is not None and not tracker.evaluated:
                tracker.evaluate(now_s, pool.stats.outcomes.total, force=True, view=self._view(key, tracker, now_s))
        self._engine_objectives.sync(self._overrides, self._engines, now_s)
        return self.redecide_all(now_s) if redecide else Effects()

    def objective_of(self, key: str) -> ObjectiveTracker | None:
        """The pool's objective loop (None: no objective in force for it)."""
        return self._trackers.get(key)

    def objective_for_engine(self, engine_id: str) -> ObjectiveTracker | None:
        """The objective loop an engine is decided with: its own (engine scope), else its pool's; None."""
        record = self._engines.get(engine_id)
        if record is None:
            return None
        return self._engine_objectives.tracker(engine_id) or self._trackers.get(record.loop.hello.pool_key)

    def set_calibration(self, key: str, costs: CostModel | None, now_s: float, *, refresh: bool = True,
                        redecide: bool = True) -> Effects:
        """Put (or with None, drop) a pool's calibration; with refresh, refit the pool and re-decide (as above)."""
        if costs is None:
            self._calibrations.pop(key, None)
        else:
            self._calibrations[key] = costs
        if not refresh:
            return Effects()
        pool = self._pools.get(key)
        if pool is not None:
            pool.stats.refresh(now_s, calibration=self._calibrations.get(key))
        return self.redecide_all(now_s) if redecide else Effects()

    # ---- the scheduler's work ----

    def tick(self, now_s: float, *, keepalive_lead_s: float = 0.0) -> Effects:
        """Forget engines disconnected for engine_ttl_s, decide the due ones (MAX_TICK_DECISIONS at most), send
        keep-alives falling due within keepalive_lead_s, close due buckets, drop restored decisions not claimed."""
        effects, budget = Effects(), MAX_TICK_DECISIONS
        for engine_id, record in self.engines():
            loop = record.loop
            if not record.connected:
                if now_s - record.disconnected_at_s >= self.loop_config.engine_ttl_s:
                    self._forget(engine_id, record, "ttl", now_s, effects)
                continue
            if budget and loop.is_due(now_s):  # an urgent pool's: at their batches, spread over them
                budget -= 1
                self._decide(record, now_s, effects)
            elif loop.keepalive_due(now_s + keepalive_lead_s):
                self._push(record, loop.current, now_s, effects)
        if self.restored and now_s - self._restored_at_s >= self.loop_config.engine_ttl_s:
            self.restored = {}
        if self._overrides:  # engines under their own objective: attached since, or forgotten
            self._engine_objectives.sync(self._overrides, self._engines, now_s)
            self._engine_objectives.evaluate(now_s, self._engines, self._pools, self.policy)
        for key in list(self._pools):
            closed = self.close_bucket(key, now_s)
            if closed is not None:
                effects.buckets.append((key, *closed))
            self._check_rollout(key, now_s, effects)
        return effects

    def _check_rollout(self, key: str, now_s: float, effects: Effects) -> None:
        """What a tick asks of the pool's rollouts (`PoolRollouts.tick`; a challenge only in pools without an
        objective): a challenge started or a switchback's new period re-decides the pool, a verdict ends it."""
        pool = self._pools[key]
        started, redecide, verdict = pool.rollouts.tick(lambda: self._guarded(key), pool.num_connected, now_s,
                                                        challenge=self.guard_rollouts and key not in self._trackers)
        if started is not None:
            effects.rollouts.append(RolloutEvent(key, "started", started.from_mode.value, started.to_mode.value,
                                                 started.describe(pool.num_connected)))
        if redecide:
            self._decide_pool(key, now_s, effects)
        if verdict is not None:
            self._end_rollout(key, verdict, now_s, effects)

    def steer_rollout(self, key: str, verdict: RolloutVerdict, now_s: float) -> Effects | None:
        """An operator ends the pool's rollout now (promoted or aborted); None when none is in progress."""
        pool = self._pools.get(key)
        if pool is None or pool.rollouts.active is None:
            return None
        effects = Effects()
        self._end_rollout(key, verdict, now_s, effects)
        return effects

    def take_peer_rollouts(self, peers: list[PeerRollout], now_s: float) -> Effects:
        """The other replicas' rollouts as published (`loop.rollout_peers`): yield where a peer owns the pool's, start
        none where one runs, take their verdicts; a pool whose rollout state changed has its engines re-decided."""
        effects = Effects()
        by_pool: dict[str, list[PeerRollout]] = {}
        for peer in peers:
            by_pool.setdefault(peer.pool_key, []).append(peer)
        for key, pool in self._pools.items():
            rollout = pool.rollouts.active
            outcome = apply_peers(pool.rollouts, by_pool.get(key, []), replica_id=self.replica_id, now_s=now_s)
            if outcome.yielded_to is not None:
                effects.rollouts.append(RolloutEvent(key, RolloutVerdict.YIELDED.value, rollout.from_mode.value,
                                                     rollout.to_mode.value, pool.rollouts.history[-1].detail))
            if outcome.yielded_to is not None or outcome.newly_applied:
                self._decide_pool(key, now_s, effects)
        return effects

    def _end_rollout(self, key: str, verdict: RolloutVerdict, now_s: float, effects: Effects) -> None:
        pool = self._pools[key]
        rollout = pool.rollouts.active
        detail = rollout.describe(pool.num_connected)
        effects.rollouts.append(RolloutEvent(key, verdict.value, rollout.from_mode.value, rollout.to_mode.value,
                                             detail))
        pool.rollouts.finish(verdict, now_s, detail=detail)
        tracker = self._trackers.get(key) or (self._engine_objectives.tracker(min(rollout.canary_ids))
                                              if rollout.switchback else None)
        if tracker is not None and rollout.objective is not None and tracker.follows(rollout.objective):
            rolled_back = verdict == RolloutVerdict.ROLLED_BACK
            tracker.learn(rollout.to_mode, rollout.measured(0), now_s, rolled_back=rolled_back)
            tracker.learn(rollout.from_mode, rollout.measured(1), now_s)
        self._decide_pool(key, now_s, effects)

    def _guarded(self, key: str) -> list[str]:
        """The engines of pool `key` connected here and decided from the pool: those its rollouts may take."""
        return [e for e, r in self._engines.items() if r.connected and r.loop.hello.pool_key == key and r.own is None]

    def _decide_pool(self, key: str, now_s: float, effects: Effects, *, skip: str = "") -> None:
        for engine_id, record in self.engines():
            if record.connected and record.loop.hello.pool_key == key and engine_id != skip:
                self._decide(record, now_s, effects)

    def _forget(self, engine_id: str, record: EngineRecord, reason: str, now_s: float, effects: Effects) -> None:
        del self._engines[engine_id]
        pool = self._pools.get(record.loop.hello.pool_key)
        if pool is not None:
            pool.distinct.discard(engine_id)
            pool.rollouts.forget(engine_id)
        self._disconnected.leave(record.identity, engine_id)
        key = record.loop.hello.pool_key
        effects.forgotten.append(Forgotten(engine_id, key, reason, record.identity, now_s - record.disconnected_at_s))
        self._release_pool(key, effects)

    def _pool_of(self, key: str) -> PoolRecord:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = PoolRecord(PoolStatistics(key, self.loop_config, replica_id=self.replica_id),
                                                 blocks=LatestBlocks(self._panel_key))
        return pool

    def _release_pool(self, key: str, effects: Effects) -> None:
        """One engine record of the pool is gone; when it was the last, forget the pool here (its buckets stay
        in the store for the other replicas and for a warm start)."""
        pool = self._pools.get(key)
        if pool is None:
            return
        pool.num_records -= 1
        if pool.num_records <= 0:
            del self._pools[key]
            self._trackers.pop(key, None)
            effects.forgotten_pools.append(key)

    # ---- the pool exchange ----

    def close_bucket(self, key: str, now_s: float) -> tuple[int, BucketStats] | None:
        """Close the pool's open bucket when now_s is past it: (bucket id, stats) to publish, else None."""
        closed = self._pools[key].stats.close_due(now_s) if key in self._pools else None
        return (closed[1], closed[0]) if closed is not None else None

    def refresh_due(self, key: str, now_s: float) -> int | None:
        """The end bucket a refresh at now_s would fit through, when it is past the last refresh; else None."""
        pool = self._pools.get(key)
        if pool is None:
            return None
        end_bucket = pool.stats.estimate_bucket(now_s)
        return None if pool.refreshed_bucket is not None and end_bucket <= pool.refreshed_bucket else end_bucket

    def take_peer_bucket(self, key: str, bucket_id: int, replica_id: str, stats: BucketStats) -> None:
        """Another replica's closed bucket of the pool (or a re-read of one)."""
        pool = self._pools.get(key)
        if pool is not None:
            pool.stats.put_remote(bucket_id, replica_id, stats)

    def seed_pool(self, key: str, window: BucketStats | None, now_s: float) -> None:
        """Warm start: the pool's persisted window (None: none found), for a pool new here; the next refresh
        is due whatever the last one fitted."""
        pool = self._pools.get(key)
        if pool is not None:
            if window is not None:
                pool.stats.seed(window, now_s=now_s)
            pool.refreshed_bucket = None

    def refresh_pool(self, key: str, now_s: float) -> PoolEstimate | None:
        """Refit the pool's estimate (its calibration, if any, as the costs) and drop buckets no later window
        can use. The estimate, or None when the pool is not held."""
        pool = self._pools.get(key)
        if pool is None:
            return None
        end_bucket = pool.stats.estimate_bucket(now_s)
        previous = pool.stats.estimate
        estimate = pool.stats.refresh(now_s, calibration=self._calibrations.get(key))
        if moved_on_shift(previous, estimate):
            pool.urgent_since_s = now_s
        pool.stats.prune(now_s)
        pool.refreshed_bucket = end_bucket
        tracker = sync_tracker(self._trackers, self._overrides, key, now_s)
        if tracker is not None:
            tracker.evaluate(now_s, pool.stats.outcomes.total, view=self._view(key, tracker, now_s))
        return estimate

    def _view(self, key: str, tracker: ObjectiveTracker, now_s: float) -> PoolView:
        """What the pool's objective loop sees of it (`loop.objective_view`)."""
        held = [r for _, r in self.engines() if r.connected and r.loop.hello.pool_key == key]
        return pool_view(self._pools[key], held, tracker.objective, now_s, self.policy)
