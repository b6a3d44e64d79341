"""The latency-objective loop on a pool whose latency depends on δ through the crossover: it finds the side of
the gap that meets the target in a few evaluations, settles without oscillating, goes back towards throughput
when the target is loose, flags a target nothing reaches, and validates what an operator may set."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.objective import (
    EVALUATE_EVERY_S,
    FORGET_VIOLATION_S,
    INFEASIBLE_AFTER,
    MAX_VIOLATION_MEMORY_S,
    MIN_REQUESTS,
    ObjectiveState,
    ObjectiveTracker,
)
from controlplane.loop.objective_records import objective_for, objective_problem
from controlplane.loop.outcomes import LatencySet

GAP_S_PER_TOKEN = 3.7e-5  # the pool's LHS − RHS: δ above it selects MB


def _pool(delta: float, rng: np.random.Generator, *, ttft_mb_s: float = 0.4, ttft_eb_s: float = 2.0) -> LatencySet:
    """A minute of a pool's latencies: MB (δ above the gap) starts requests sooner, EB decodes faster."""
    mb = delta > GAP_S_PER_TOKEN
    ttft = rng.lognormal(np.log(ttft_mb_s if mb else ttft_eb_s), 0.3, 2000)
    tpot = rng.lognormal(np.log(0.030 if mb else 0.018), 0.1, 2000)
    return LatencySet.from_values(ttft, tpot, np.zeros(0))


def _run(tracker: ObjectiveTracker, rng: np.random.Generator, evaluations: int, **pool) -> list[float]:
    deltas = []
    for i in range(evaluations):
        tracker.evaluate(i * EVALUATE_EVERY_S, _pool(tracker.delta_s_per_token, rng, **pool))
        deltas.append(tracker.delta_s_per_token)
    return deltas


def test_a_ttft_target_only_mb_meets_is_met_within_a_few_evaluations_and_holds() -> None:
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.5))
    deltas = _run(tracker, np.random.default_rng(0), 40)
    first_met = next(i for i, d in enumerate(deltas) if d > GAP_S_PER_TOKEN)
    assert first_met <= 8  # ×4 steps from 1e-6 cross a gap of 3.7e-5 s/token in a few evaluations
    sides = [d > GAP_S_PER_TOKEN for d in deltas]
    crossings = sum(a != b for a, b in itertools.pairwise(sides))
    assert crossings <= 3  # loosening bisects towards the δ that missed: at most one excursion back across
    assert all(sides[20:]) and len(set(deltas[20:])) == 1  # then settled on the side that meets it
    assert tracker.state == ObjectiveState.MEETING


def test_a_retry_of_the_looser_side_that_fails_again_is_made_rarer_each_time() -> None:
    """The violation that kept δ on MB's side is forgotten after FORGET_VIOLATION_S, so loosening retries EB's side;
    each retry that misses again doubles the memory (up to MAX_VIOLATION_MEMORY_S): excursions to the side that
    misses come after 10, 20, 40, 80, 80 minutes, not every 10."""
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.5))
    deltas = _run(tracker, np.random.default_rng(0), 3000)
    sides = [d > GAP_S_PER_TOKEN for d in deltas]
    left_s = [i * EVALUATE_EVERY_S for i in range(1, len(sides)) if sides[i - 1] and not sides[i]]
    retries_s = [t for previous, t in itertools.pairwise(left_s) if t - previous > 120.0]  # each retry's first
    intervals_s = [b - a for a, b in itertools.pairwise([left_s[0], *retries_s])]
    assert len(intervals_s) >= 4
    for i, interval_s in enumerate(intervals_s):
        assert interval_s >= min(2.0 ** i * FORGET_VIOLATION_S, MAX_VIOLATION_MEMORY_S)
    assert intervals_s[-1] >= MAX_VIOLATION_MEMORY_S and sides[-1]


def test_a_loose_target_lets_delta_go_back_to_the_throughput_choice() -> None:
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=30.0))
    tracker.delta_s_per_token = 1e-3  # left high by an earlier, tighter objective
    deltas = _run(tracker, np.random.default_rng(1), 20)
    assert deltas[-1] == 0.0 and tracker.state == ObjectiveState.MEETING


def test_a_tpot_target_pulls_delta_towards_eb() -> None:
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(tpot_quantile=0.9, tpot_target_s=0.025))
    tracker.delta_s_per_token = 2e-4  # MB: TPOT p90 ≈ 0.034 s
    deltas = _run(tracker, np.random.default_rng(2), 30)
    assert deltas[-1] <= GAP_S_PER_TOKEN and tracker.state == ObjectiveState.MEETING


def test_a_target_nothing_reaches_is_infeasible_at_the_bound_that_lowers_latency_most() -> None:
    objective = operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=0.05, delta_min_s_per_token=-1e-4,
                                              delta_max_s_per_token=1e-4)
    tracker = ObjectiveTracker(objective)
    deltas = _run(tracker, np.random.default_rng(3), 20)
    assert deltas[-1] == 1e-4
    assert tracker.state == ObjectiveState.INFEASIBLE and "cannot reach" in tracker.detail
    infeasible_from = next(i for i, d in enumerate(deltas) if d == 1e-4)
    assert infeasible_from + INFEASIBLE_AFTER < 20


def test_without_enough_latencies_nothing_moves() -> None:
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=0.1))
    few = LatencySet.from_values(np.full(MIN_REQUESTS - 1, 5.0), np.zeros(0), np.zeros(0))
    assert not tracker.evaluate(0.0, few) and not tracker.evaluate(10.0, None)
    assert tracker.state == ObjectiveState.NO_LATENCY_DATA and tracker.delta_s_per_token == 0.0


def test_evaluations_are_spaced_unless_forced() -> None:
    tracker = ObjectiveTracker(operator_pb2.LatencyObjective(ttft_quantile=0.5, ttft_target_s=0.1))
    rng = np.random.default_rng(4)
    assert tracker.evaluate(0.0, _pool(0.0, rng))
    assert not tracker.evaluate(1.0, _pool(0.0, rng))
    assert tracker.evaluate(1.5, _pool(0.0, rng), force=True)


@pytest.mark.parametrize(("objective", "problem"), [
    (operator_pb2.LatencyObjective(), "needs a TTFT or a TPOT target"),
    (operator_pb2.LatencyObjective(ttft_quantile=0.2, ttft_target_s=1.0), "ttft_quantile"),
    (operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=float("nan")), "ttft_target_s"),
    (operator_pb2.LatencyObjective(tpot_quantile=0.99, tpot_target_s=-1.0), "tpot_target_s"),
    (operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.0, delta_min_s_per_token=1e-5,
                                   delta_max_s_per_token=1e-4), "delta bounds"),
    (operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.0, delta_max_s_per_token=1.0), "delta bounds"),
    (operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.0, budget_min_tokens=900,
                                   budget_max_tokens=512), "budget_min_tokens"),
])
def test_invalid_objectives_are_named(objective: operator_pb2.LatencyObjective, problem: str) -> None:
    found = objective_problem(objective)
    assert found is not None and problem in found


def test_the_pools_own_objective_wins_over_the_fleets() -> None:
    fleet = operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE,
                                        scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET),
                                        objective=operator_pb2.LatencyObjective(ttft_quantile=0.9, ttft_target_s=2.0))
    pool = operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, scope=operator_pb2.Scope(
        kind=operator_pb2.SCOPE_KIND_POOL, pool=common_pb2.Pool(model="m", accelerator="a")),
        objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.0), expires_at_s=100.0)
    assert objective_for([pool, fleet], "m|a", now_s=50.0) is pool
    assert objective_for([pool, fleet], "m|a", now_s=150.0) is fleet  # the pool's expired
    assert objective_for([pool, fleet], "other|a", now_s=50.0) is fleet
