"""Which way the objective loop moves δ when it sees its pool (`loop.objective_view.PoolView`): the model's predicted
latencies per mode choose the first direction, measurements per mode correct it, a bound that misses makes it try
the other mode before calling the target infeasible, an infeasible pool is held on the mode measured lowest, and
the loop holds while a guarded rollout measures the pool or while its latency window still holds the mode before."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.latency_model import LatencyPrediction
from controlplane.core.types import Mode
from controlplane.loop.objective import (
    DRAIN_S,
    EVALUATE_EVERY_S,
    MAX_BUDGET_SCALE,
    ObjectiveState,
    ObjectiveTracker,
)
from controlplane.loop.objective_view import PoolView, unanimous_mode
from controlplane.loop.outcomes import LatencySet

GAP_S_PER_TOKEN = 2e-5  # the pool runs MB while δ > −GAP_S_PER_TOKEN: MB is its throughput choice at δ = 0
BOUND_S_PER_TOKEN = 1e-4
WINDOW_S = 60.0


def _objective(target_s: float) -> operator_pb2.LatencyObjective:
    return operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=target_s,
                                         delta_min_s_per_token=-BOUND_S_PER_TOKEN,
                                         delta_max_s_per_token=BOUND_S_PER_TOKEN)


def _prediction(mode: Mode, ttft_s: float) -> LatencyPrediction:
    return LatencyPrediction(mode, 2048, ttft_s, 0.02, 0.02, 10.0, 0.5)


class _Pool:
    """A simulated pool: MB runs while δ > gap (δ = 0 gives MB when the gap is negative), each mode with its own
    TTFT p99 (the window holds the new mode's requests at once: the loop still holds a window + DRAIN_S)."""

    def __init__(self, *, ttft_mb_s: float, ttft_eb_s: float, gap: float = -GAP_S_PER_TOKEN,
                 predictions: dict[Mode, LatencyPrediction] | None = None) -> None:
        self.ttft = {Mode.MB: ttft_mb_s, Mode.EB: ttft_eb_s}
        self.gap = gap
        self.predictions = predictions or {}
        self.mode: Mode | None = None
        self.since_s = math.inf
        self.rng = np.random.default_rng(0)

    def run(self, tracker: ObjectiveTracker, evaluations: int) -> list[tuple[float, Mode]]:
        return [self.run_one(tracker, i) for i in range(evaluations)]

    def run_one(self, tracker: ObjectiveTracker, i: int) -> tuple[float, Mode]:
        """Evaluation i (at i · EVALUATE_EVERY_S): (δ after it, the mode the pool ran)."""
        now_s = i * EVALUATE_EVERY_S
        mode = Mode.MB if tracker.delta_s_per_token > self.gap else Mode.EB
        if mode != self.mode:
            self.mode, self.since_s = mode, now_s if self.mode is not None else -WINDOW_S
        p99_s = self.ttft[mode]
        latencies = LatencySet.from_values(self.rng.lognormal(math.log(p99_s) - 2.326 * 0.3, 0.3, 2000),
                                           np.zeros(0), np.zeros(0))
        view = PoolView(mode=mode, mode_since_s=self.since_s, window_s=WINDOW_S, predictions=self.predictions)
        tracker.evaluate(now_s, latencies, view=view)
        return tracker.delta_s_per_token, mode


def test_the_models_prediction_chooses_the_first_direction() -> None:
    pool = _Pool(ttft_mb_s=0.26, ttft_eb_s=0.13, predictions={Mode.MB: _prediction(Mode.MB, 0.3),
                                                              Mode.EB: _prediction(Mode.EB, 0.1)})
    tracker = ObjectiveTracker(_objective(0.16))
    path = pool.run(tracker, 80)
    assert path[0][0] < 0.0  # towards EB at once: the model predicts EB's TTFT lower
    assert path[-1][1] == Mode.EB and tracker.state == ObjectiveState.MEETING
    assert tracker.measured[Mode.EB].quantiles["ttft"] < 0.16


def test_without_a_model_a_bound_that_misses_makes_it_try_the_other_mode_before_infeasible() -> None:
    pool = _Pool(ttft_mb_s=0.26, ttft_eb_s=0.13)
    tracker = ObjectiveTracker(_objective(0.16))
    path = pool.run(tracker, 160)
    assert any(delta == BOUND_S_PER_TOKEN for delta, _ in path)  # first the default direction (MB) to its bound
    assert path[-1][1] == Mode.EB and tracker.state == ObjectiveState.MEETING
    assert all(mode == Mode.EB for _, mode in path[-20:])  # and it stays there, no oscillation
    assert "ttft" in tracker.measured[Mode.MB].quantiles and "ttft" in tracker.measured[Mode.EB].quantiles


def test_a_target_neither_mode_meets_is_infeasible_on_the_mode_measured_lowest() -> None:
    pool = _Pool(ttft_mb_s=0.26, ttft_eb_s=0.13)
    tracker = ObjectiveTracker(_objective(0.05))
    path = pool.run(tracker, 160)
    assert tracker.state == ObjectiveState.INFEASIBLE and "cannot reach" in tracker.detail
    assert path[-1][1] == Mode.EB and "measured" in tracker.detail


def test_measurements_correct_a_wrong_prediction() -> None:
    # The model says MB is faster; the pool's own MB window says 0.26 s; EB, never run, is predicted at the
    # MB's measured/predicted ratio: 0.2 × (0.26 / 0.1) = 0.52 s, so MB stays first, and EB is still tried at
    # MB's bound before the target is called infeasible.
    pool = _Pool(ttft_mb_s=0.26, ttft_eb_s=0.13, predictions={Mode.MB: _prediction(Mode.MB, 0.1),
                                                              Mode.EB: _prediction(Mode.EB, 0.2)})
    tracker = ObjectiveTracker(_objective(0.16))
    path = pool.run(tracker, 160)
    assert path[-1][1] == Mode.EB and tracker.state == ObjectiveState.MEETING


def test_it_holds_while_a_guarded_rollout_measures_the_pool() -> None:
    tracker = ObjectiveTracker(_objective(0.1))
    latencies = LatencySet.from_values(np.full(1000, 0.5), np.zeros(0), np.zeros(0))
    assert not tracker.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-100.0,
                                                              rollout_active=True))
    assert tracker.delta_s_per_token == 0.0 and "rollout" in tracker.detail
    assert tracker.evaluate(10.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-100.0))


def test_both_modes_beyond_the_target_in_a_rollout_so_far_is_infeasible_while_it_holds() -> None:
    tracker = ObjectiveTracker(_objective(0.1))
    latencies = LatencySet.from_values(np.full(1000, 0.5), np.zeros(0), np.zeros(0))
    both = {Mode.EB: {"ttft": 0.14}, Mode.MB: {"ttft": 0.19}}
    assert not tracker.evaluate(0.0, latencies, view=PoolView(mode=None, rollout_active=True, rollout_measured=both))
    assert tracker.state == ObjectiveState.INFEASIBLE and "eb TTFT 0.14 s, mb TTFT 0.19 s" in tracker.detail
    one = {Mode.EB: {"ttft": 0.105}, Mode.MB: {"ttft": 0.19}}  # EB within the margin: not yet
    assert not tracker.evaluate(10.0, latencies, view=PoolView(mode=None, rollout_active=True, rollout_measured=one))
    assert tracker.state == ObjectiveState.ADJUSTING and tracker.delta_s_per_token == 0.0


def test_it_holds_while_its_window_holds_the_mode_before() -> None:
    tracker = ObjectiveTracker(_objective(0.1))
    latencies = LatencySet.from_values(np.full(1000, 0.5), np.zeros(0), np.zeros(0))
    assert tracker.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-100.0))
    before = tracker.delta_s_per_token
    assert not tracker.evaluate(10.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=8.0))
    assert tracker.delta_s_per_token == before and "window holds mb's requests" in tracker.detail
    assert not tracker.evaluate(8.0 + WINDOW_S + DRAIN_S - EVALUATE_EVERY_S, latencies,
                                view=PoolView(mode=Mode.EB, mode_since_s=8.0))
    assert tracker.evaluate(8.0 + WINDOW_S + DRAIN_S, latencies, view=PoolView(mode=Mode.EB, mode_since_s=8.0))
    assert "ttft" in tracker.measured[Mode.EB].quantiles  # a clean window of EB: measured


def test_a_rolled_back_canary_teaches_the_loop_its_modes_latency() -> None:
    tracker = ObjectiveTracker(_objective(0.2))
    tracker.delta_s_per_token = 3e-5  # moved towards MB for a TTFT excess; MB's canary measured worse
    tracker.learn(Mode.MB, {"ttft": 0.4}, 100.0, rolled_back=True)
    tracker.learn(Mode.EB, {"ttft": 0.3}, 100.0)
    assert tracker.measured[Mode.MB].quantiles == {"ttft": 0.4} and tracker.measured[Mode.MB].at_s == 100.0
    latencies = LatencySet.from_values(np.full(1000, 0.3), np.zeros(0), np.zeros(0))
    assert tracker.evaluate(101.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=0.0))
    assert tracker.delta_s_per_token < 3e-5  # towards EB now, the lower measured
    assert "eb TTFT 0.3 s, mb TTFT 0.4 s" in tracker.detail  # both beyond 0.2 s by more than the margin:
    assert tracker.state == ObjectiveState.INFEASIBLE  # infeasible, on the lower


def _explored(*, ttft_mb_s: float, ttft_eb_s: float, predictions: dict[Mode, LatencyPrediction],
              evaluations: int = 120) -> list[tuple[float, ObjectiveState, str]]:
    """(time, state, detail) per evaluation of a 0.1 s TTFT target on a `_Pool` starting on MB, its B_cap lever at
    its bound from the start (the budget cannot help)."""
    pool = _Pool(ttft_mb_s=ttft_mb_s, ttft_eb_s=ttft_eb_s, predictions=predictions)
    tracker = ObjectiveTracker(_objective(0.1))
    tracker.budget_cap_scale = MAX_BUDGET_SCALE
    states = []
    for i in range(evaluations):
        pool.run_one(tracker, i)
        states.append((i * EVALUATE_EVERY_S, tracker.state, tracker.detail))
    return states


def test_a_target_both_modes_are_expected_to_miss_is_infeasible_while_the_other_mode_is_explored() -> None:
    # MB measures 0.4 s (twice its prediction), the model puts EB at 0.25 s, corrected ×2: about 0.5 s, 5× the
    # target; the model's order made the loop take MB first, and MB's bound misses.
    states = _explored(ttft_mb_s=0.4, ttft_eb_s=0.45, predictions={Mode.MB: _prediction(Mode.MB, 0.2),
                                                                   Mode.EB: _prediction(Mode.EB, 0.25)})
    explored = [i for i, (_, _, detail) in enumerate(states) if "trying eb" in detail]
    first = next(i for i, (_, state, _) in enumerate(states) if state == ObjectiveState.INFEASIBLE)
    assert explored and first == explored[0]  # called as the exploration starts, not after it
    expected = re.search(r"eb expected at ([0-9.]+) s \(mb measured ([0-9.]+) s against its predicted 0.2 s\)",
                         states[first][2])
    assert expected is not None and float(expected[1]) == pytest.approx(float(expected[2]) * 0.25 / 0.2, rel=0.01)
    # It stays so while EB is explored and the pool returns to MB (an alert does not flap), then on what both modes
    # measured.
    assert all(state == ObjectiveState.INFEASIBLE for _, state, _ in states[first:])
    assert "the lower of the two (eb measured" in states[-1][2]


def test_without_a_model_nothing_is_expected_and_the_exploration_decides() -> None:
    states = _explored(ttft_mb_s=0.4, ttft_eb_s=0.45, predictions={})
    explored = next(i for i, (_, _, detail) in enumerate(states) if "trying eb" in detail)
    assert states[explored][1] == ObjectiveState.ADJUSTING and "expected" not in states[explored][2]
    assert states[-1][1] == ObjectiveState.INFEASIBLE  # measured: both beyond it


def test_a_pool_on_the_mode_it_started_with_is_measured_at_once() -> None:
    """No engine ever changed its mode (since −inf): the window holds that mode's requests alone, so the first
    evaluation with enough latencies is a measurement of it; after a change the loop waits a window + DRAIN_S."""
    latencies = LatencySet.from_values(np.full(1000, 0.5), np.zeros(0), np.zeros(0))
    tracker = ObjectiveTracker(_objective(0.1))
    tracker.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-math.inf))
    assert tracker.measured[Mode.MB].quantiles["ttft"] == pytest.approx(0.5, rel=0.01)
    switched = ObjectiveTracker(_objective(0.1))
    switched.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-WINDOW_S))
    assert Mode.MB not in switched.measured


def test_the_pools_mode_dates_from_its_engines_latest_change_to_it() -> None:
    mb, eb = common_pb2.MODE_MB, common_pb2.MODE_EB
    assert unanimous_mode([(mb, -math.inf), (mb, -math.inf)]) == (Mode.MB, -math.inf)
    assert unanimous_mode([(mb, -math.inf), (mb, 30.0)]) == (Mode.MB, 30.0)
    assert unanimous_mode([(mb, -math.inf), (eb, 30.0)]) == (None, math.inf)
    assert unanimous_mode([(mb, -math.inf), (None, -math.inf)]) == (None, math.inf)
    assert unanimous_mode([]) == (None, math.inf)


def test_both_modes_measured_beyond_the_target_stays_infeasible_while_the_budget_lever_is_tried() -> None:
    """Once both modes were measured beyond the target by more than the hysteresis, the pool is infeasible; the
    budget steps that follow (δ at its bound) leave it so instead of flapping to adjusting and back."""
    latencies = LatencySet.from_values(np.full(1000, 0.3), np.zeros(0), np.zeros(0))
    tracker = ObjectiveTracker(_objective(0.1))
    tracker.learn(Mode.EB, {"ttft": 0.4}, 0.0)
    view = PoolView(mode=Mode.MB, mode_since_s=-math.inf, crossing_s_per_token={Mode.MB: -1e-5, Mode.EB: -3e-5})
    states, scales = [], []
    for i in range(20):
        tracker.evaluate(i * EVALUATE_EVERY_S, latencies, view=view)
        states.append(tracker.state)
        scales.append(tracker.budget_cap_scale)
    assert scales[-1] == MAX_BUDGET_SCALE  # the lever was tried to its bound
    assert states == [ObjectiveState.INFEASIBLE] * len(states)
    assert "cannot reach it" in tracker.detail


def test_a_miss_within_the_windows_sampling_error_holds_and_a_clear_one_moves() -> None:
    """3,000 latencies whose p99 is 1% above the target: the quantile 1.645 standard errors down the ranks (p98.7)
    is under it, so the loop holds (adjusting, nothing moved); 10% above, it moves. 200 latencies need more."""
    rng = np.random.default_rng(5)
    values = rng.lognormal(0.0, 0.3, 3000)
    p99 = float(np.quantile(values, 0.99))
    for scale, moves in ((1.01, False), (1.10, True)):
        latencies = LatencySet.from_values(values, np.zeros(0), np.zeros(0))
        tracker = ObjectiveTracker(_objective(p99 / scale))
        tracker.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-math.inf))
        assert tracker.state == ObjectiveState.ADJUSTING
        assert (tracker.delta_s_per_token != 0.0) == moves, tracker.detail
        assert ("sampling error" in tracker.detail) != moves
    few = LatencySet.from_values(values[:200], np.zeros(0), np.zeros(0))
    tracker = ObjectiveTracker(_objective(float(np.quantile(values[:200], 0.99)) / 1.05))
    tracker.evaluate(0.0, few, view=PoolView(mode=Mode.MB, mode_since_s=-math.inf))
    assert tracker.delta_s_per_token == 0.0 and "sampling error" in tracker.detail


def test_delta_goes_to_its_bound_at_once_when_the_pool_runs_that_mode_past_its_crossing() -> None:
    """The pool runs MB, every engine past its gap (MB's crossing −1e−5 s/token, δ 0), and MB misses the TTFT
    target with MB predicted lower: a deeper δ changes no engine's mode, so δ goes to its bound at once and the
    budget lever acts next. Without the crossings, or with the pool on the other mode, δ steps."""
    latencies = LatencySet.from_values(np.full(1000, 0.3), np.zeros(0), np.zeros(0))
    predictions = {Mode.MB: _prediction(Mode.MB, 0.1), Mode.EB: _prediction(Mode.EB, 0.3)}
    crossings = {Mode.MB: -1e-5, Mode.EB: -3e-5}
    tracker = ObjectiveTracker(_objective(0.16))
    view = PoolView(mode=Mode.MB, mode_since_s=-math.inf, predictions=predictions, crossing_s_per_token=crossings)
    tracker.evaluate(0.0, latencies, view=view)
    assert tracker.delta_s_per_token == BOUND_S_PER_TOKEN and tracker.budget_cap_scale == 1.0
    tracker.evaluate(EVALUATE_EVERY_S, latencies, view=view)
    assert tracker.budget_cap_scale == 2.0
    unknown = ObjectiveTracker(_objective(0.16))
    unknown.evaluate(0.0, latencies, view=PoolView(mode=Mode.MB, mode_since_s=-math.inf, predictions=predictions))
    assert 0.0 < unknown.delta_s_per_token < BOUND_S_PER_TOKEN
    on_eb = ObjectiveTracker(_objective(0.16))
    on_eb.evaluate(0.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=-math.inf, predictions=predictions,
                                                 crossing_s_per_token={Mode.MB: 5e-5, Mode.EB: 2e-5}))
    assert 5e-5 < on_eb.delta_s_per_token < BOUND_S_PER_TOKEN  # just past MB's crossing, not to the bound


def test_at_a_switch_from_a_mode_run_alone_the_window_is_that_modes_and_the_early_call_can_fire() -> None:
    """The pool ran MB from its start and its first fitted decisions moved it to EB just now: the window (all MB's
    requests) is measured as MB's, so the loop heading for EB, predicted beyond the target too once corrected by MB's
    measured / predicted ratio, calls the target infeasible at once instead of after a window and a drain."""
    latencies = LatencySet.from_values(np.full(1000, 0.23), np.zeros(0), np.zeros(0))
    predictions = {Mode.MB: _prediction(Mode.MB, 0.211), Mode.EB: _prediction(Mode.EB, 0.181)}
    tracker = ObjectiveTracker(_objective(0.112))
    tracker.evaluate(22.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=22.0, mode_before=Mode.MB,
                                                    mode_before_since_s=-math.inf, predictions=predictions))
    assert tracker.measured[Mode.MB].quantiles["ttft"] == pytest.approx(0.23, rel=0.01)
    assert Mode.EB not in tracker.measured
    assert tracker.state == ObjectiveState.INFEASIBLE and "eb expected at" in tracker.detail
    later = ObjectiveTracker(_objective(0.112))  # a switch older than an evaluation: the window is mixed, nothing
    later.evaluate(40.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=22.0, mode_before=Mode.MB,
                                                  mode_before_since_s=-math.inf, predictions=predictions))
    assert not later.measured
    promoted = ObjectiveTracker(_objective(0.112))  # a rollout's control group measured MB: its figure stays
    promoted.learn(Mode.MB, {"ttft": 0.25}, 20.0)
    promoted.evaluate(22.0, latencies, view=PoolView(mode=Mode.EB, mode_since_s=22.0, mode_before=Mode.MB,
                                                     mode_before_since_s=-math.inf, predictions=predictions))
    assert promoted.measured[Mode.MB].quantiles["ttft"] == 0.25
