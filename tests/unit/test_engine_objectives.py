"""Objectives at engine scope (`loop.engine_objectives`): followed for the engines known here, fed by each
engine's own batches, evaluated on its own window, dropped when cleared, lapsed or forgotten."""

from __future__ import annotations

import numpy as np

from controlplane.api.v1 import operator_pb2
from controlplane.loop.engine_objectives import EngineObjectives, engine_objective_records
from controlplane.loop.ingest import Latencies
from controlplane.loop.objective import EVALUATE_EVERY_S, MIN_REQUESTS, ObjectiveState
from controlplane.loop.outcomes import OUTCOME_WINDOW_S

TIGHT = operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=0.5)


def _record(engine_id: str, objective: operator_pb2.LatencyObjective = TIGHT, *, expires_at_s: float = 0.0,
            kind: int = operator_pb2.SCOPE_KIND_ENGINE, cleared: bool = False) -> operator_pb2.OverrideRecord:
    return operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, objective=objective,
                                       scope=operator_pb2.Scope(kind=kind, engine_id=engine_id),
                                       expires_at_s=expires_at_s, cleared=cleared)


def _latencies(ttft_s: float, num: int = 100) -> Latencies:
    return Latencies(ttft_s=np.full(num, ttft_s), tpot_s=np.full(num, 0.02), queue_s=np.zeros(0), num_dropped=0)


def test_only_engine_scope_records_in_force_count() -> None:
    records = [_record("a"), _record("b", expires_at_s=50.0), _record("c", cleared=True),
               _record("", kind=operator_pb2.SCOPE_KIND_FLEET),
               operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_DELTA, scope=operator_pb2.Scope(
                   kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="d"), delta_s_per_token=1e-5)]
    assert set(engine_objective_records(records, now_s=10.0)) == {"a", "b"}
    assert set(engine_objective_records(records, now_s=60.0)) == {"a"}


def test_an_engine_is_judged_on_its_own_window_and_moves_its_own_delta() -> None:
    objectives = EngineObjectives(bucket_s=1.0)
    objectives.sync([_record("slow"), _record("absent")], {"slow", "fast"}, now_s=0.0)
    assert len(objectives) == 1 and objectives.tracker("absent") is None and objectives.tracker("fast") is None
    tracker = objectives.tracker("slow")
    assert tracker is not None and tracker.state == ObjectiveState.NO_LATENCY_DATA  # evaluated at once
    objectives.add("fast", _latencies(5.0), now_s=1.0)  # not followed: nothing kept
    assert objectives.summary("fast") is None
    for second in range(1, 4):
        objectives.add("slow", _latencies(2.0), now_s=float(second))
        objectives.add("slow", _latencies(2.0), now_s=second + 0.5)  # two batches, one bucket: merged
        objectives.add("slow", None, now_s=second + 0.6)  # a batch without stamps
    summary = objectives.summary("slow")
    assert summary is not None and summary.ttft.num_requests == 600 >= MIN_REQUESTS
    assert abs(summary.ttft.p99_s - 2.0) <= 0.02 * 2.0
    assert objectives.evaluate(EVALUATE_EVERY_S + 1.0) == ["slow"]
    assert tracker.delta_s_per_token > 0 and tracker.state == ObjectiveState.ADJUSTING
    # The window forgets what is older than OUTCOME_WINDOW_S.
    objectives.evaluate(4.0 + OUTCOME_WINDOW_S + 1.0)
    assert objectives.summary("slow") is None and tracker.state == ObjectiveState.NO_LATENCY_DATA


def test_a_changed_objective_starts_afresh_and_a_cleared_or_forgotten_one_is_dropped() -> None:
    objectives = EngineObjectives(bucket_s=1.0)
    objectives.sync([_record("e")], {"e"}, now_s=0.0)
    first = objectives.tracker("e")
    objectives.add("e", _latencies(2.0), now_s=1.0)
    objectives.sync([_record("e")], {"e"}, now_s=2.0)  # the same objective: kept with its window
    assert objectives.tracker("e") is first and objectives.summary("e") is not None
    looser = operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=5.0)
    objectives.sync([_record("e", looser)], {"e"}, now_s=3.0)
    assert objectives.tracker("e") is not first and objectives.summary("e") is None
    objectives.sync([_record("e", looser)], set(), now_s=4.0)  # the engine is gone
    assert objectives.tracker("e") is None and len(objectives) == 0
    objectives.sync([_record("e", looser, cleared=True)], {"e"}, now_s=5.0)
    assert objectives.tracker("e") is None
