"""Engines that enter or leave a pool inside its window (`loop.turnover`): the fit stays on the law.

Closed-loop engines (`testbench.closed_loop`: 512 requests in flight each, started in their law's stationary
state, one token per request per step) report to one `PoolStatistics` on a simulated clock, as the controller
passes `ValidatedBatch` columns: completions with their admission ages, the running requests' histogram and its
admission ages, every 0.1 s. Before the turnover was counted, four engines joining one second apart put μ̂_O at
2–3× a law of mean 128 for tens of seconds (their old requests counted as if started inside the window).
"""

from __future__ import annotations

import numpy as np
import pytest

from agents.running_lengths import running_length_entries
from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.length_histogram import LengthHistogram
from controlplane.loop import running_reports
from controlplane.loop.buckets import BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.loop.running_reports import RunningReports
from controlplane.loop.turnover import Turnover
from controlplane.sim.lengths import GeometricLengths
from testbench.closed_loop import ClosedLoopEngine

CONFIG = DecisionLoopConfig(output_window=4096, prompt_window=4096)
SLOTS = 512
BATCH_S = 0.1
MEAN_TOKENS = 128.0


def _feed(stats: PoolStatistics, engine_id: str, engine: ClosedLoopEngine, now_s: float) -> None:
    engine.advance(now_s)
    drained = engine.drain()
    tokens = engine.running_tokens()
    lengths, counts, earliest = running_length_entries(tokens.tolist(), engine.wall_s(engine._start).tolist())
    stats.add(now_s, prompts=drained.prompt_tokens, outputs=drained.output_tokens.astype(np.float64), steps=None,
              engine_id=engine_id, running_lengths=np.asarray(lengths, dtype=np.float64),
              running_counts=np.asarray(counts, dtype=np.float64), admitted_age_s=now_s - drained.admitted_s,
              running_admitted_age_s=now_s - np.asarray(earliest))


def _run(*, joins_s: list[float], leaves_s: dict[int, float], until_s: float, seed: int,
         pool_rate_per_s: float = 100.0) -> list[tuple[float, float, int, int]]:
    """(time, μ̂_O, truncated, censored) of each refresh with a fit, every 0.5 s."""
    rng = np.random.default_rng(seed)
    law = GeometricLengths.from_mean(MEAN_TOKENS)
    stats = PoolStatistics("pool", CONFIG, replica_id="r0")
    engines = [ClosedLoopEngine(law, num_slots=SLOTS, rate_per_s=pool_rate_per_s / len(joins_s), rng=rng,
                                now_s=0.0) for _ in joins_s]
    fits = []
    for tick in range(1, round(until_s / BATCH_S) + 1):
        now_s = tick * BATCH_S
        for index, engine in enumerate(engines):
            if leaves_s.get(index, np.inf) <= now_s:
                if leaves_s.get(index, np.inf) > now_s - BATCH_S:
                    stats.forget_engine(f"e{index}")
                engine.advance(now_s)  # still running, no longer reporting
                engine.drain()
            elif joins_s[index] <= now_s:
                _feed(stats, f"e{index}", engine, now_s)
            else:
                engine.advance(now_s)  # serving before it reports
                engine.drain()
        if tick % 5 == 0:
            estimate = stats.refresh(now_s, calibration=None)
            if estimate.fit is not None:
                fits.append((now_s, estimate.fit.stats.mu_o_tokens, estimate.num_truncated, estimate.num_censored))
    return fits


@pytest.mark.parametrize("seed", range(3))
def test_engines_joining_one_second_apart_leave_the_mean_on_the_law(seed: int) -> None:
    fits = _run(joins_s=[0.0, 1.0, 2.0, 3.0], leaves_s={}, until_s=25.0, seed=seed)
    late = [(t, mu) for t, mu, _, _ in fits if t >= 6.0]
    assert len(late) >= 30
    worst = max(abs(mu / MEAN_TOKENS - 1.0) for _, mu in late)
    assert worst < 0.15, late
    # the window's opening holds every engine's requests, the late joiners' first reports included
    assert max(truncated for t, _, truncated, _ in fits if t >= 6.0) > 3 * SLOTS


@pytest.mark.parametrize("seed", range(3))
def test_an_engine_leaving_inside_the_window_is_censored_not_dropped(seed: int) -> None:
    fits = _run(joins_s=[0.0, 0.0, 0.0, 0.0], leaves_s={3: 8.0, 2: 12.0}, until_s=25.0, seed=seed)
    after = [mu for t, mu, _, _ in fits if t >= 9.0]
    assert len(after) >= 25
    assert max(abs(mu / MEAN_TOKENS - 1.0) for mu in after) < 0.15, after


def test_the_batch_that_carries_an_engines_first_report_adds_no_lengths() -> None:
    stats = PoolStatistics("pool", CONFIG, replica_id="r0")
    report = dict(prompts=np.array([300.0, 400.0]), outputs=np.array([50.0, 60.0]), steps=None, engine_id="e0",
                  running_lengths=np.array([10.0, 20.0]), running_counts=np.array([3.0, 4.0]))
    stats.add(0.05, **report)
    stats.add(0.15, **report)  # the engine's second report: its completions are observations
    stats.forget_engine("e0")
    closed, bucket_id = stats.close_due(1.05)
    assert bucket_id == 0
    assert closed.outputs.count == 2 and closed.prompt_count == 2
    assert closed.turnover is not None
    assert closed.turnover.entered.count == 7 and closed.turnover.left.count == 7
    assert closed.running is not None and closed.running.count == 0


def _same(a: LengthHistogram, b: LengthHistogram) -> bool:
    return np.array_equal(a.lengths, b.lengths) and np.array_equal(a.counts, b.counts)


def _turnover() -> Turnover:
    return Turnover(entered=LengthHistogram.from_counts([5, 9], [2, 1]), left=LengthHistogram.from_counts([3], [4]),
                    entered_admitted=AdmittedCounts.from_columns(np.array([7, 8]), np.array([5, 9]),
                                                                 np.array([2, 1])),
                    left_admitted=None)


def test_a_bucket_with_turnover_is_written_as_v5_and_one_without_as_v4() -> None:
    stats = BucketStats.empty()
    assert stats.to_bytes()[:4] == b"CPB4"
    stats.turnover = _turnover()
    payload = stats.to_bytes()
    assert payload[:4] == b"CPB5"
    read = BucketStats.from_bytes(payload).turnover
    assert read is not None and read.left_admitted is None
    assert _same(read.entered, stats.turnover.entered) and _same(read.left, stats.turnover.left)
    assert read.entered_admitted is not None and read.entered_admitted.count == 3
    for garbage in (payload[:-9], payload[:4] + b"\xff" * 60, payload[:20]):
        with pytest.raises(ValueError):
            BucketStats.from_bytes(garbage)
    with pytest.raises(ValueError):
        Turnover.from_bytes(_turnover().to_bytes()[:-1])


def test_pending_reports_summed_past_the_bound_keep_their_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(running_reports, "MAX_PENDING_REPORTS", 4)
    rng = np.random.default_rng(3)
    reports = RunningReports()
    lengths_all, counts_all, admitted_all = [], [], []
    for index in range(11):
        lengths = np.unique(rng.integers(1, 50, 6)).astype(np.float64)
        counts = rng.integers(1, 5, lengths.size).astype(np.float64)
        admitted = rng.integers(90, 100, lengths.size).astype(np.float64)
        assert reports.report(f"e{index}", (lengths, counts), admitted)
        assert not reports.report(f"e{index}", (lengths, counts), admitted)  # a second report is no entry
        lengths_all.append(lengths)
        counts_all.append(counts)
        admitted_all.append(admitted)
    _, _, turnover = reports.close(100)
    assert turnover is not None and turnover.left.count == 0
    lengths, counts = np.concatenate(lengths_all), np.concatenate(counts_all)
    assert _same(turnover.entered, LengthHistogram.from_counts(lengths, counts))
    expected = AdmittedCounts.from_columns(np.concatenate(admitted_all), lengths, counts)
    assert turnover.entered_admitted is not None
    for column in ("admitted", "lengths", "counts"):
        np.testing.assert_array_equal(getattr(turnover.entered_admitted, column), getattr(expected, column))
    assert reports.close(101)[2] is None  # taken by the close
