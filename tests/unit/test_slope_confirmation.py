"""A hazard slope is kept only when the window a bucket earlier shows one of the same sign
(`fit_hazard_histogram(slope_sign_before=)`, `Window.fit`, `PoolStatistics._slope_sign_before`): a window drifting
as a new law mixes in shows a slope for one fit before its shift is confirmed, and that slope alone moved the
first decision after a shift 47% off the new steady k̂* (`benchmarks/shift_e2e.py`, 1,024 → 256 at 1,000
completions/s on four engines)."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.policy import decide
from controlplane.core.types import EngineLimits, Flag, Observations, OperatorIntent, PolicyConfig, PolicyState
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.sim.profiles import PROFILES

COSTS = PROFILES["h200-qwen3-8b"].costs
LIMITS = EngineLimits(kv_capacity_tokens=2_000_000, max_num_seqs=1024, max_num_batched_tokens=8192)
# No shift detection: the window always holds the newest completions, so a change of law drifts through it.
CONFIG = DecisionLoopConfig(output_window=1024, prompt_window=1024, shift_detection=False)
PER_SECOND = 200


def _fit(outputs: np.ndarray, slope_sign_before: int | None):
    histogram = LengthHistogram.from_samples(outputs)
    return fit_hazard_histogram(histogram, prompt_count=outputs.size, prompt_sum_tokens=512.0 * outputs.size,
                                slope_sign_before=slope_sign_before)


def _increasing(rng: np.random.Generator, size: int) -> np.ndarray:
    """Uniform lengths on [1, 400]: a hazard that rises with age."""
    return rng.integers(1, 401, size).astype(np.float64)


def _decreasing(rng: np.random.Generator, size: int) -> np.ndarray:
    """A mixture of short and long geometric lengths: a hazard that falls with age."""
    return np.concatenate((rng.geometric(1 / 20, size // 2), rng.geometric(1 / 600, size - size // 2))).astype(
        np.float64)


def test_a_slope_of_another_sign_than_the_previous_windows_is_not_kept_and_says_so() -> None:
    rng = np.random.default_rng(0)
    outputs = _increasing(rng, 3000)
    free, confirmed, unconfirmed = (_fit(outputs, sign) for sign in (None, 1, 0))
    assert free.stats.eta > 0 and free.slope_sign == 1 and not free.slope_unconfirmed
    assert confirmed == free
    assert unconfirmed.slope_sign == 1 and unconfirmed.slope_unconfirmed
    assert unconfirmed.stats.eta == 0.0 and not unconfirmed.slope_clipped
    # the flat line: the window's mean hazard, between the line's values at its two ends
    assert 1 / 400 < unconfirmed.stats.p0 < free.stats.p0 + free.stats.eta * free.stats.t95_tokens
    assert unconfirmed.stats.mu_o_tokens == free.stats.mu_o_tokens  # the moments are the window's either way
    # a decreasing hazard is clipped only once it is confirmed too
    falling = _decreasing(rng, 3000)
    clipped, flat = _fit(falling, -1), _fit(falling, 1)
    assert clipped.slope_clipped and clipped.slope_sign == -1 and not clipped.slope_unconfirmed
    assert flat.slope_unconfirmed and not flat.slope_clipped and flat.stats.p0 != clipped.stats.p0
    # a window with no significant slope has nothing to confirm
    steady = rng.geometric(1 / 128, 3000).astype(np.float64)
    assert _fit(steady, 1) == _fit(steady, None) and _fit(steady, None).slope_sign == 0


def test_a_decision_on_an_unconfirmed_slope_carries_the_flag() -> None:
    outputs = _increasing(np.random.default_rng(1), 3000)
    flags = {}
    for sign_before in (0, 1):
        decision, _ = decide(Observations(costs=COSTS, limits=LIMITS, n_obs=256.0), PolicyState(), 0.0,
                             intent=OperatorIntent(), config=PolicyConfig(), fit=_fit(outputs, sign_before))
        flags[sign_before] = decision.flags
    assert Flag.HAZARD_SLOPE_UNCONFIRMED in flags[0]
    assert Flag.HAZARD_SLOPE_UNCONFIRMED not in flags[1]


def _feed_second(pool: PoolStatistics, rng: np.random.Generator, second: int, increasing: bool) -> None:
    outputs = _increasing(rng, PER_SECOND) if increasing else rng.geometric(1 / 200, PER_SECOND).astype(np.float64)
    pool.add(second + 0.3, prompts=np.full(PER_SECOND, 512.0), outputs=outputs, steps=None)


def _run(pools: list[PoolStatistics], seconds: int, change_at_s: int, refresh_every: list[int]) -> list[dict]:
    """The same completions into each pool (geometric, then the rising hazard from change_at_s); pool i refreshes
    every refresh_every[i] seconds. Returns each pool's estimates by end bucket."""
    rngs = [np.random.default_rng(7) for _ in pools]
    estimates: list[dict] = [{} for _ in pools]
    for second in range(seconds):
        for index, pool in enumerate(pools):
            _feed_second(pool, rngs[index], second, second >= change_at_s)
            pool.close_due(second + 1.0)
            if second % refresh_every[index] == 0:
                estimate = pool.refresh(second + 1.6, calibration=COSTS)
                estimates[index][estimate.end_bucket] = estimate
    return estimates


def test_a_pool_keeps_a_slope_once_two_windows_in_a_row_show_it() -> None:
    [estimates] = _run([PoolStatistics("m|a", CONFIG, replica_id="a")], seconds=30, change_at_s=10,
                       refresh_every=[1])
    signs = [(bucket, e.fit.slope_sign, e.fit.slope_unconfirmed, e.fit.stats.eta) for bucket, e in
             sorted(estimates.items()) if e.fit is not None]
    first = next(index for index, (_, sign, _, _) in enumerate(signs) if sign == 1)
    assert signs[first][1:] == (1, True, 0.0)  # the first window with the slope: not kept
    assert signs[first + 1][1] == 1 and not signs[first + 1][2] and signs[first + 1][3] > 0  # the next: kept
    assert all(eta > 0 for _, _, _, eta in signs[first + 1:])  # the law stays: so does the slope
    assert sum(unconfirmed for _, _, unconfirmed, _ in signs) == 1


def test_the_first_fit_of_a_pool_keeps_its_slope() -> None:
    [estimates] = _run([PoolStatistics("m|a", CONFIG, replica_id="a")], seconds=8, change_at_s=0,
                       refresh_every=[1])
    fits = [e.fit for _, e in sorted(estimates.items()) if e.fit is not None]
    assert fits and all(fit.stats.eta > 0 and not fit.slope_unconfirmed for fit in fits)


@pytest.mark.parametrize("refresh_every", [2, 3])
def test_replicas_that_refresh_at_other_times_agree_on_every_shared_end_bucket(refresh_every: int) -> None:
    """The sign before a window is the previous window's, fitted again when this replica did not fit it: what a
    replica decides does not depend on which refreshes it made."""
    every, sparse = _run([PoolStatistics("m|a", CONFIG, replica_id="a"), PoolStatistics("m|a", CONFIG,
                                                                                        replica_id="a")],
                         seconds=30, change_at_s=10, refresh_every=[1, refresh_every])
    shared = sorted(set(every) & set(sparse))
    assert len(shared) >= 30 // refresh_every - 1
    assert any(every[bucket].fit.slope_unconfirmed for bucket in every if every[bucket].fit is not None)
    for bucket in shared:
        assert every[bucket].fit == sparse[bucket].fit, bucket
