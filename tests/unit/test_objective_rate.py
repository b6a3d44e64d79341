"""The arrival rate the objective loop sees (`loop.objective_view`): each engine's finished requests a second,
exponentially weighted (a steady rate reads itself, a silence decays it), and the pool's the lower median of its
engines', so one engine reporting a flood of completions does not move it."""

from __future__ import annotations

import math

import pytest

from controlplane.loop.objective_view import RATE_WINDOW_S, RecentRate, typical_rate_per_s


def test_a_steady_rate_reads_itself_and_a_silence_decays_it() -> None:
    rate = RecentRate()
    assert rate.rate_per_s(0.0) == 0.0
    for second in range(int(10 * RATE_WINDOW_S)):
        rate.add(float(second), 27)
    assert rate.rate_per_s(10 * RATE_WINDOW_S) == pytest.approx(27.0, rel=0.02)
    later = 10 * RATE_WINDOW_S + RATE_WINDOW_S
    assert rate.rate_per_s(later) == pytest.approx(27.0 * math.exp(-1.0), rel=0.02)


def test_a_young_series_reads_its_rate_from_the_second_batch_on() -> None:
    rate = RecentRate()
    rate.add(1.0, 27)  # dates the series; the time it covers is not known
    assert rate.rate_per_s(1.0) == 0.0
    for second in range(2, 11):
        rate.add(float(second), 27)
        assert rate.rate_per_s(float(second)) == pytest.approx(27.0, rel=0.01)
    # Without the correction the sum alone reads 27·(1 − e^(−9/60)), 14% low, and 39% low after 30 s.
    assert rate.value_per_s < 0.9 * 27.0


def test_a_batch_from_the_past_is_counted_without_decaying_upwards() -> None:
    rate = RecentRate()
    rate.add(0.0, 0)
    rate.add(100.0, 60)
    rate.add(50.0, 60)  # a clock that went back: counted, not amplified
    assert rate.value_per_s == pytest.approx(2.0)
    assert rate.rate_per_s(100.0) == pytest.approx(2.0 / (1.0 - math.exp(-100.0 / RATE_WINDOW_S)))


def test_one_engines_flood_does_not_move_the_pools_rate() -> None:
    honest = [27.0 + 0.1 * i for i in range(19)]
    assert typical_rate_per_s([*honest, 1e6]) == pytest.approx(27.9)
    assert typical_rate_per_s([1e6, 27.0]) == 27.0  # two engines: the lower
    assert typical_rate_per_s([]) == 0.0
