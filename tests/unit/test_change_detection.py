"""Shift detection on completion streams: false alarms on stationary workloads, detection delay of 2× shifts,
the change point, the threshold, and input handling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.change_detection import ShiftDetector, _lindley, cusum_threshold, normal_quantile
from testbench.cusum_reference import RecursionDetector

FAMILIES = ["geometric", "uniform", "lognormal", "bimodal"]
BATCH = 10  # completions per update, the decision loop's cadence


def lengths(rng: np.random.Generator, family: str, n: int, *, scale: float = 1.0) -> np.ndarray:
    """n output lengths of a family whose mean is proportional to `scale`."""
    if family == "geometric":
        return rng.geometric(1.0 / (256.0 * scale), n)
    if family == "uniform":
        return rng.integers(round(128 * scale), round(384 * scale) + 1, n)
    if family == "lognormal":
        return np.maximum(1.0, np.round(rng.lognormal(math.log(200.0 * scale), 1.0, n)))
    if family == "bimodal":  # short chat answers and long reasoning traces
        short = rng.geometric(1.0 / (40.0 * scale), n)
        long = np.maximum(1.0, np.round(rng.normal(900.0 * scale, 100.0 * scale, n)))
        return np.where(rng.random(n) < 0.6, short, long)
    raise AssertionError(family)


def feed(detector: ShiftDetector, stream: np.ndarray) -> list:
    events = []
    for i in range(0, stream.size, BATCH):
        event = detector.update(stream[i : i + BATCH])
        if event is not None:
            events.append(event)
    return events


# ------------------------------------------------------------------------------------------ threshold


def test_threshold_solves_siegmunds_approximation() -> None:
    for drift, run_length in ((0.25, 2e6), (0.5, 1e4), (0.1, 1e5)):
        h = cusum_threshold(drift=drift, in_control_run_length=run_length)
        b = h + 1.166
        x = 2.0 * drift * b
        assert (math.exp(x) - x - 1.0) / (2.0 * drift**2) == pytest.approx(run_length, rel=1e-9)
    # The textbook one-sided CUSUM with k = 0.5 and h = 5 runs about 930 samples in control (465 two-sided).
    assert cusum_threshold(drift=0.5, in_control_run_length=930.0) == pytest.approx(5.0, abs=0.02)


@pytest.mark.parametrize(("drift", "run_length", "match"), [
    (0.0, 1e5, "drift"), (math.nan, 1e5, "drift"), (0.25, math.inf, "run length"), (0.25, 1.0, "run length"),
])
def test_threshold_rejects_bad_parameters(drift: float, run_length: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cusum_threshold(drift=drift, in_control_run_length=run_length)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"min_reference": 0}, "min_reference"), ({"min_reference": 5000, "max_reference": 4096}, "min_reference"),
    ({"reference_lag": -1}, "reference_lag"), ({"history": 0}, "history"),
    ({"false_alarm_interval": 0.5}, "false_alarm_interval"), ({"drift": -1.0}, "drift"),
])
def test_detector_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ShiftDetector(**kwargs)


# ------------------------------------------------------------------------------------- false alarms


@pytest.mark.sim  # 10⁵ completions a family (a seeded simulation: `make test`, not `make test-fast`)
@pytest.mark.parametrize("family", FAMILIES)
def test_at_most_one_false_alarm_per_100k_completions(family: str) -> None:
    rng = np.random.default_rng(100 + FAMILIES.index(family))
    detector = ShiftDetector()
    events = feed(detector, lengths(rng, family, 100_000))
    print(f"{family}: {len(events)} false alarm(s) in 100,000 stationary completions")
    assert detector.num_samples == 100_000
    assert len(events) <= 1


def test_heavily_tied_lengths_do_not_raise_false_alarms() -> None:
    # Mean 3 tokens: a third of the lengths are 1; the randomised transform spreads the ties.
    detector = ShiftDetector()
    events = feed(detector, np.random.default_rng(9).geometric(1.0 / 3.0, 100_000))
    assert len(events) <= 1


# ------------------------------------------------------------------------------------------ detection


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("factor", [2.0, 0.5], ids=["longer", "shorter"])
def test_a_2x_shift_is_detected_within_a_few_hundred_completions(family: str, factor: float) -> None:
    change = 3000
    delays, start_errors = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        stream = np.concatenate([lengths(rng, family, change), lengths(rng, family, 1000, scale=factor)])
        detector = ShiftDetector()
        events = [e for e in feed(detector, stream) if e.detected_index >= change]
        assert events, f"seed {seed}: no detection within 1,000 completions"
        first = events[0]
        assert first.direction == (1 if factor > 1.0 else -1)
        assert (first.mean_ratio > 1.0) if factor > 1.0 else (first.mean_ratio < 1.0)
        assert first.start_index <= first.detected_index
        delays.append(first.detected_index - change)
        start_errors.append(first.start_index - change)
    print(f"{family} ×{factor}: detection delay median {np.median(delays):.0f}, max {max(delays)}; "
          f"change point error median {np.median(start_errors):+.0f}")
    assert np.median(delays) <= 200
    assert abs(np.median(start_errors)) <= 50


def test_no_detection_before_the_reference_is_built() -> None:
    detector = ShiftDetector(min_reference=200)
    assert not detector.armed
    # Anything at all in the first 200 samples builds the reference.
    assert detector.update(np.concatenate([np.full(100, 5), np.full(99, 5000)])) is None
    assert not detector.armed
    detector.update(np.array([7]))
    assert detector.armed
    assert detector.statistics == (0.0, 0.0)


def test_after_an_alarm_the_reference_restarts_from_the_change_point() -> None:
    rng = np.random.default_rng(4)
    detector = ShiftDetector()
    events = feed(detector, np.concatenate([rng.geometric(1 / 100, 3000), rng.geometric(1 / 400, 3000)]))
    assert len(events) == 1  # the new regime becomes the reference: no second alarm in it
    assert detector.num_events == 1
    assert 3000 <= events[0].detected_index < 3300


def test_invalid_samples_are_skipped_without_an_index() -> None:
    detector = ShiftDetector()
    detector.update(np.array([10, math.nan, 0, -5, 2.5, math.inf, 20]))
    assert detector.num_samples == 2
    assert detector.num_rejected == 5


def test_a_copy_continues_independently_from_the_same_state() -> None:
    rng = np.random.default_rng(11)
    detector = ShiftDetector()
    feed(detector, rng.geometric(1 / 100, 2000))
    copy = detector.copy()
    tail = np.concatenate([rng.geometric(1 / 100, 500), rng.geometric(1 / 400, 1500)])
    events = feed(copy, tail)
    assert detector.num_samples == 2000 and detector.num_events == 0  # feeding the copy left it alone
    assert events == feed(detector, tail) and detector.statistics == copy.statistics


def test_detectors_started_at_different_points_converge_when_tie_positions_come_from_the_stream() -> None:
    # Positions from the stream (as the pool's shift tracker derives them from bucket ids), not from each
    # detector's own count: after enough common samples both are in the same state.
    rng = np.random.default_rng(12)
    stream = rng.geometric(1 / 50, 20_000)  # many ties
    early, late = ShiftDetector(), ShiftDetector()
    for i in range(0, stream.size, BATCH):
        early.update(stream[i : i + BATCH], jitter_index=i)
        if i >= 3000:
            late.update(stream[i : i + BATCH], jitter_index=i)
    assert early.statistics == late.statistics


@pytest.mark.parametrize("start", [0.0, 0.7, 12.0])
def test_the_vectorised_cusum_equals_the_recursion(start: float) -> None:
    rng = np.random.default_rng(int(start * 10))
    increments = rng.normal(-0.1, 1.0, 5000)
    expected, value = [], start
    for x in increments:
        value = max(0.0, value + x)
        expected.append(value)
    sums, zeros = _lindley(increments, start)
    np.testing.assert_allclose(sums, expected, rtol=0.0, atol=1e-9)
    # The resets are exact zeros at the same steps, which the change point is read from.
    assert zeros.tolist() == [i for i, v in enumerate(expected) if v == 0.0]
    assert zeros.size > 100


@pytest.mark.parametrize("batch", [1, 10, 1024])
def test_the_vectorised_detector_raises_the_alarms_of_the_recursion(batch: int) -> None:
    rng = np.random.default_rng(batch)
    stream = np.concatenate([rng.geometric(1 / 200, 3000), rng.geometric(1 / 500, 2000), rng.geometric(1 / 90, 3000),
                             rng.integers(50, 150, 2000)])
    vectorised, sequential = ShiftDetector(), RecursionDetector()
    events = {id(vectorised): [], id(sequential): []}
    for detector in (vectorised, sequential):
        for i in range(0, stream.size, batch):
            event = detector.update(stream[i : i + batch], jitter_index=i)
            if event is not None:
                events[id(detector)].append(event)
    assert len(events[id(sequential)]) >= 3
    assert events[id(vectorised)] == pytest.approx(events[id(sequential)])
    assert vectorised.statistics == pytest.approx(sequential.statistics, abs=1e-9)
    assert vectorised.num_samples == sequential.num_samples


def test_normal_quantile_matches_the_standard_library() -> None:
    import statistics
    normal = statistics.NormalDist()
    p = np.concatenate([np.linspace(1e-6, 1 - 1e-6, 2001), np.logspace(-300, -2, 300), 1 - np.logspace(-15, -2, 100)])
    expected = np.array([normal.inv_cdf(float(v)) for v in p])
    assert np.max(np.abs(normal_quantile(p) - expected) / np.maximum(np.abs(expected), 1e-3)) < 2e-9
    assert list(normal_quantile(np.array([0.0, 0.5, 1.0]))) == [-np.inf, 0.0, np.inf]
    assert np.isnan(normal_quantile(np.array([-0.1, 1.1, np.nan]))).all()


def test_the_decision_loop_does_not_load_scipy() -> None:
    """scipy.special and scipy.optimize cost a controller about 40 MiB of RSS; the loop needs neither, not
    even when a cost line's bound binds."""
    import subprocess
    import sys
    code = ("import sys, numpy as np, controlplane.loop.pool_stats, controlplane.loop.engine\n"
            "from controlplane.core.cost_sums import CostSums, StepColumns\n"
            "sums = CostSums()\n"  # decode steps whose line would have a negative intercept: a bound binds
            "d = np.arange(1.0, 200.0)\n"
            "sums.add_steps(StepColumns(np.zeros(d.size), d, d, np.maximum(1e-4, 1e-4 * d - 5e-3)))\n"
            "sums.fit()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('scipy.special', 'scipy.optimize'))))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert loaded == "[]"
