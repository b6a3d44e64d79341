"""Latency objectives at engine scope: one engine held to its own TTFT/TPOT quantile, from its own latencies.

An objective set on an engine scope (`SetObjective`, like a δ override on one engine) wins, for that engine,
over its pool's and the fleet's: the engine gets an `ObjectiveTracker` of its own (the same loop as a pool's,
`loop.objective`: δ first, then P-PAS's B_cap, within the objective's bounds) fed by the engine's own finished
requests over the last OUTCOME_WINDOW_S, summed batch by batch into one-second buckets. Only engines under an
engine objective keep such a window (three latency sketches a bucket), so the cost is bounded by the engine
objectives in force, not by the fleet. The engine's lengths and costs still come from its pool: only the
levers the objective moves are its own. Its loop sees the engine as a pool's loop sees its pool
(`loop.objective_view`): the mode it was last decided and since when, its own arrival rate, the model's latencies
per mode from its pool's estimate and its own decision, and its crossings; so it too learns which mode meets its
objective. An engine held by another replica is followed by that replica (an engine's stream is held by one
replica at a time); when it moves, the new holder starts a fresh window.

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import PolicyConfig
from controlplane.loop.ingest import Latencies
from controlplane.loop.objective import ObjectiveTracker
from controlplane.loop.objective_view import (
    DEFAULT_QUANTILE,
    PoolView,
    crossings,
    predictions,
    rollout_measured,
    unanimous_mode,
)
from controlplane.loop.outcomes import OUTCOME_WINDOW_S, LatencySet, OutcomeSummary, OutcomeWindow
from controlplane.loop.records import EngineRecord, PoolRecord


def engine_objective_records(records: Iterable[operator_pb2.OverrideRecord], *,
                             now_s: float) -> dict[str, operator_pb2.OverrideRecord]:
    """The engine-scope objective records in force, by engine id."""
    found = {}
    for record in records:
        if (record.kind == operator_pb2.OVERRIDE_KIND_OBJECTIVE and not record.cleared
                and record.scope.kind == operator_pb2.SCOPE_KIND_ENGINE
                and not (record.expires_at_s > 0 and record.expires_at_s <= now_s)):
            found[record.scope.engine_id] = record
    return found


class EngineObjectives:
    """The trackers and latency windows of the engines under an engine objective (see the module docstring)."""

    def __init__(self, bucket_s: float) -> None:
        self._bucket_s = bucket_s
        self._window_buckets = max(1, math.ceil(OUTCOME_WINDOW_S / bucket_s))
        self._trackers: dict[str, ObjectiveTracker] = {}
        self._windows: dict[str, OutcomeWindow] = {}

    def __len__(self) -> int:
        return len(self._trackers)

    def sync(self, records: Iterable[operator_pb2.OverrideRecord], engines: Container[str], now_s: float) -> None:
        """Follow the engine objectives in force for the engines known here: a new or changed one gets a fresh
        tracker (evaluated at once, with no latency data yet) and window; one cleared, lapsed or of an engine
        no longer known is dropped."""
        wanted = {engine_id: record for engine_id, record in engine_objective_records(records, now_s=now_s).items()
                  if engine_id in engines}
        for engine_id in [e for e in self._trackers if e not in wanted]:
            self.forget(engine_id)
        for engine_id, record in wanted.items():
            tracker = self._trackers.get(engine_id)
            if tracker is not None and tracker.follows(record.objective):
                continue
            tracker = self._trackers[engine_id] = ObjectiveTracker(objective=record.objective)
            window = self._windows[engine_id] = OutcomeWindow(self._window_buckets, self._bucket_s)
            tracker.evaluate(now_s, window.total, force=True)

    def add(self, engine_id: str, latencies: Latencies | None, now_s: float) -> None:
        """One batch's latencies of engine_id, arrived at now_s (nothing kept for an engine without an engine
        objective, or a batch without latency stamps)."""
        window = self._windows.get(engine_id)
        if window is None or latencies is None:
            return
        window.add(self._bucket(now_s), LatencySet.from_values(latencies.ttft_s, latencies.tpot_s,
                                                                latencies.queue_s))

    def evaluate(self, now_s: float, engines: Mapping[str, EngineRecord] | None = None,
                 pools: Mapping[str, PoolRecord] | None = None, policy: PolicyConfig | None = None) -> list[str]:
        """Run each engine's loop (each at most every EVALUATE_EVERY_S) over its window as of now_s, with its view
        of the engine (`engines`, their `pools` and the `policy`; none given: no view); the engines whose δ or
        B_cap changed."""
        changed = []
        for engine_id, tracker in self._trackers.items():
            window = self._windows[engine_id]
            window.advance(self._bucket(now_s))
            record = engines.get(engine_id) if engines is not None else None
            view = self._view(engine_id, tracker, record, pools or {}, policy, now_s) if record is not None else None
            if tracker.evaluate(now_s, window.total, view=view):
                changed.append(engine_id)
        return changed

    def _view(self, engine_id: str, tracker: ObjectiveTracker, record: EngineRecord, pools: Mapping[str, PoolRecord],
              policy: PolicyConfig | None, now_s: float) -> PoolView:
        decision = record.loop.current
        mode, since_s = unanimous_mode([(decision.mode if decision is not None else None, record.loop.mode_since_s)])
        pool = pools.get(record.loop.hello.pool_key)
        rate_s = record.finished.rate_per_s(now_s)
        active = pool.rollouts.active if pool is not None else None
        switchback = active if active is not None and active.switchback and engine_id in active.canary_ids else None
        return PoolView(mode=mode, mode_since_s=since_s, window_s=OUTCOME_WINDOW_S, rate_per_s=rate_s,
                        rollout_active=switchback is not None, rollout_measured=rollout_measured(switchback),
                        predictions=predictions(pool.stats.estimate if pool is not None else None, decision, rate_s,
                                                quantile=tracker.objective.ttft_quantile or DEFAULT_QUANTILE),
                        crossing_s_per_token=crossings([decision], policy) if policy is not None else {})

    def tracker(self, engine_id: str) -> ObjectiveTracker | None:
        """engine_id's own objective loop; None when no engine objective is in force for it."""
        return self._trackers.get(engine_id)

    def summary(self, engine_id: str) -> OutcomeSummary | None:
        """Quantiles over engine_id's own window; None without an engine objective or latencies."""
        window = self._windows.get(engine_id)
        return window.summary() if window is not None else None

    def forget(self, engine_id: str) -> None:
        for kept in (self._trackers, self._windows):
            kept.pop(engine_id, None)

    def _bucket(self, now_s: float) -> int:
        return math.floor(now_s / self._bucket_s)
