"""Censored and left-truncated hazard fits: the length-biased engine snapshot, Kaplan–Meier moments,
the window exposure in a stationary engine, the shift-transient fit, and the log-rank comparison of two
windows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.survival import (
    HazardComparison,
    WindowObservations,
    compare_hazards,
    dense_events_and_exposure,
    geometric_mean_length,
    km_percentile,
    km_survival,
    length_moments,
    life_table,
    oldest_band_hazard,
)
from testbench.cohorts import cohort, geometric, hist, increasing_hazard, lognormal, uniform


def engine_snapshot(seed: int, *, mean: float, slots: int, cut_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """A saturated engine whose `slots` start at once with geometric outputs, each refilled when its request
    finishes; at `cut_tokens` the finished requests and the running ones (their lengths so far).

    The classic length-biased sample: a request longer than the cut is never among the completions.
    """
    return cohort(seed, cut_tokens=cut_tokens, draw=geometric(mean), slots=slots)


@pytest.mark.parametrize("cut_tokens", [400, 1000, 2000])
def test_censored_fit_of_a_length_biased_snapshot_is_unbiased(cut_tokens: int) -> None:
    mean = 1024.0
    naive, censored = [], []
    for seed in range(40):
        done, running = engine_snapshot(seed, mean=mean, slots=512, cut_tokens=cut_tokens)
        completed = LengthHistogram.from_samples(done)
        plain = fit_hazard_histogram(completed, prompt_count=1, prompt_sum_tokens=512.0)
        fixed = fit_hazard_histogram(completed, prompt_count=1, prompt_sum_tokens=512.0, censored=hist(running))
        assert plain is not None and fixed is not None
        naive.append(plain.stats.p0 * mean)
        censored.append(fixed.stats.p0 * mean)
    print(f"cut {cut_tokens}: p0·μ over 40 seeds, median naive {np.median(naive):.3f}, "
          f"censored {np.median(censored):.3f} (mean {np.mean(censored):.3f})")
    # The completions alone see a hazard far too high (the long requests are missing); with the running
    # requests as censored observations it is within a few percent.
    assert np.median(naive) > 1.3
    assert abs(np.median(censored) - 1.0) < 0.04
    assert abs(np.mean(censored) - 1.0) < 0.04


def test_censored_mean_is_not_the_completed_mean() -> None:
    done, running = engine_snapshot(7, mean=1024.0, slots=512, cut_tokens=1000)
    fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1, prompt_sum_tokens=512.0,
                               censored=hist(running))
    assert fit is not None
    assert done.mean() < 500.0  # length-biased
    assert fit.stats.mu_o_tokens == pytest.approx(1024.0, rel=0.15)
    assert fit.stats.eta == 0.0  # a constant hazard: no spurious slope


def test_life_table_by_hand() -> None:
    # Completed 1, 3, 3; running at the close 2 and 4; running at the opening 1.
    window = WindowObservations(completed=hist([1, 3, 3]), censored=hist([2, 4]), truncated=hist([1]))
    table = life_table(window)
    # n(t) = #{O ≥ t} + #{c ≥ t} − #{c_open ≥ t}: t=1: 3+2−1, t=2: 2+2−0, t=3: 2+1, t=4: 0+1.
    assert table.at_risk.tolist() == [4.0, 4.0, 3.0, 1.0]
    assert table.events.tolist() == [1.0, 0.0, 2.0, 0.0]
    assert table.last_age == 4
    survival = km_survival(table)
    assert survival.tolist() == pytest.approx([0.75, 0.75, 0.25, 0.25])
    assert km_percentile(survival, 50.0) == 3
    assert km_percentile(survival, 95.0) is None
    events, at_risk = dense_events_and_exposure(window, t_max=3)
    assert events.tolist() == [1.0, 0.0, 2.0] and at_risk.tolist() == [4.0, 4.0, 3.0]


def test_exposure_never_below_events() -> None:
    # An inconsistent pair of snapshots (aborted requests): the at-risk count is kept ≥ the events.
    window = WindowObservations(completed=hist([2, 2]), censored=None, truncated=hist([5, 5, 5]))
    table = life_table(window)
    assert np.all(table.at_risk >= table.events)


def test_km_moments_without_censoring_are_the_sample_moments() -> None:
    samples = np.random.default_rng(3).integers(1, 900, size=777)
    table = life_table(WindowObservations(completed=LengthHistogram.from_samples(samples), censored=hist([])))
    survival = km_survival(table)
    mean, std = length_moments(survival, p0=0.01)
    assert mean == pytest.approx(samples.mean(), rel=1e-12)
    assert std == pytest.approx(samples.std(), rel=1e-9)
    assert geometric_mean_length(survival) == pytest.approx(samples.mean(), rel=1e-12)


def test_km_moments_with_a_constant_tail() -> None:
    # Two requests both still running at 10 tokens: S = 1 up to 10, then the geometric tail of p0.
    survival = km_survival(life_table(WindowObservations(completed=hist([]), censored=hist([10, 10]))))
    p0 = 0.05
    mean, std = length_moments(survival, p0=p0)
    # E[O] = 11 + (1 − p)/p; the same law as 10 + Geometric(p) counted from 1.
    assert mean == pytest.approx(10.0 + 1.0 / p0, rel=1e-12)
    assert std == pytest.approx(math.sqrt((1.0 - p0) / p0**2), rel=1e-9)
    assert geometric_mean_length(survival) is None  # no completion: no estimate
    assert all(math.isnan(x) for x in length_moments(survival, p0=0.0))


def saturated_engine(seed: int, *, mean_before: float, mean_after: float, shift_at: int, open_at: int,
                     close_at: int, slots: int = 256) -> tuple[LengthHistogram, LengthHistogram, LengthHistogram]:
    """A saturated engine with geometric outputs (every finished request is replaced at once), whose new
    requests switch from mean_before to mean_after at completion shift_at.

    Returns the completions between completion open_at and close_at, and the running requests' lengths at
    both ends (opening, closing).
    """
    rng = np.random.default_rng(seed)
    start = np.zeros(slots)
    length = rng.geometric(1 / mean_before, slots).astype(float)
    finish = length.copy()
    completed: list[int] = []
    opening = closing = LengthHistogram.empty()
    done = 0
    while done < close_at:
        i = int(np.argmin(finish))
        now = finish[i]
        done += 1
        if done > open_at:
            completed.append(int(length[i]))
        start[i] = now
        length[i] = float(rng.geometric(1 / (mean_after if done >= shift_at else mean_before)))
        finish[i] = now + length[i]
        if done == open_at:
            opening = hist((now - start).astype(np.int64))
    closing = hist((now - start).astype(np.int64))
    return LengthHistogram.from_samples(completed), opening, closing


@pytest.mark.parametrize("seed", range(4))
def test_window_exposure_in_a_stationary_engine_matches_the_plain_fit(seed: int) -> None:
    """In a stationary engine the window of the last completions is unbiased on its own; with the running
    requests at both ends it must stay so (censoring alone would double-count the in-flight requests)."""
    outputs, opening, closing = saturated_engine(seed, mean_before=300.0, mean_after=300.0, shift_at=0,
                                                 open_at=8000, close_at=12_000)
    plain = fit_hazard_histogram(outputs, prompt_count=1, prompt_sum_tokens=1.0)
    both = fit_hazard_histogram(outputs, prompt_count=1, prompt_sum_tokens=1.0, censored=closing, truncated=opening)
    only_censored = fit_hazard_histogram(outputs, prompt_count=1, prompt_sum_tokens=1.0, censored=closing)
    assert plain is not None and both is not None and only_censored is not None
    assert both.stats.p0 == pytest.approx(plain.stats.p0, rel=0.03)
    assert both.stats.mu_o_tokens == pytest.approx(plain.stats.mu_o_tokens, rel=0.03)
    # Censoring without the opening counts the 256 requests in flight at the opening twice: ~6% low here.
    assert only_censored.stats.p0 < 0.97 * both.stats.p0


def test_shift_transient_fit_keeps_the_intercept_and_drops_the_slope() -> None:
    # 200 completions into a 128 → 1,024 shift, the window opened at the shift: most completions are the old
    # short requests finishing at later ages, which a fitted line reads as an increasing hazard.
    for seed in range(6):
        outputs, opening, closing = saturated_engine(seed, mean_before=128.0, mean_after=1024.0, shift_at=5000,
                                                     open_at=5000, close_at=5200)
        kwargs = {"prompt_count": 10, "prompt_sum_tokens": 5120.0, "censored": closing, "truncated": opening}
        normal = fit_hazard_histogram(outputs, **kwargs)
        transient = fit_hazard_histogram(outputs, shift_transient=True, **kwargs)
        assert normal is not None and transient is not None
        assert normal.stats.eta > 1e-5  # the artefact
        assert transient.shift_transient and not normal.shift_transient
        assert transient.stats.eta == 0.0
        assert transient.stats.p0 == normal.stats.p0
        assert transient.stats.mu_o_tokens == pytest.approx(1.0 / transient.stats.p0, rel=1e-15)
        # The mixture's mean is the old requests' (≈190 tokens); the young requests' rate is nearer the new law.
        assert normal.stats.mu_o_tokens < 250.0
        assert 1.5 * normal.stats.mu_o_tokens < transient.stats.mu_o_tokens < 1024.0 * 1.5


def engine_window(seed: int, *, first: int, last: int, mean_before: float, mean_after: float = 0.0,
                  shift_at: int = 0, with_running: bool = True) -> WindowObservations:
    """The window of completions first..last of `saturated_engine` (one trajectory per seed), with the running
    requests at both ends or completions only."""
    outputs, opening, closing = saturated_engine(seed, mean_before=mean_before, mean_after=mean_after or mean_before,
                                                 shift_at=shift_at, open_at=first, close_at=last)
    return WindowObservations(outputs, censored=closing, truncated=opening) if with_running else WindowObservations(
        outputs)


def test_the_hazard_comparison_is_standard_normal_over_a_length_biased_stream_of_one_law() -> None:
    """An engine whose 256 requests all start at once: its first 300 completions are the short ones, the
    next 1,200 longer (a length-biased stream, as after a shift to longer outputs), of one law. Counting the
    running requests, the log-rank z is N(0, 1) (100 seeds: mean and spread, no |z| ≥ 3.3); on the
    completions alone it says "the law changed" every time."""
    with_running, completions_only = [], []
    for seed in range(100):
        windows = [engine_window(seed, first=a, last=b, mean_before=300.0, with_running=running)
                   for running in (True, False) for a, b in ((0, 300), (300, 1500))]
        with_running.append(compare_hazards(windows[0], windows[1]).z)
        completions_only.append(compare_hazards(windows[2], windows[3]).z)
    z = np.array(with_running)
    assert abs(z.mean()) < 0.3 and 0.8 < z.std() < 1.25 and np.abs(z).max() < 3.3, (z.mean(), z.std())
    assert max(completions_only) < -8.0  # the later completions look like a lower hazard


@pytest.mark.parametrize("seed", range(6))
def test_the_hazard_comparison_sees_a_change_of_law_with_the_requests_in_flight_still_finishing(seed: int) -> None:
    """Mean 150 → 300 tokens at completion 3,000: the next 400 completions are mostly of the 256 requests in
    flight then (old law), and still the log-rank z says "lower hazard after" past 3 (signed: `after` has the
    lower hazard); the same two windows of a stationary engine do not."""
    before = engine_window(seed, first=1000, last=3000, mean_before=150.0, mean_after=300.0, shift_at=3000)
    after = engine_window(seed, first=3000, last=3400, mean_before=150.0, mean_after=300.0, shift_at=3000)
    comparison = compare_hazards(before, after)
    assert comparison.z < -3.0 and comparison.events_after > 350.0
    swapped = compare_hazards(after, before)
    assert swapped.z == pytest.approx(-comparison.z, rel=0.05)
    steady = compare_hazards(engine_window(seed, first=1000, last=3000, mean_before=150.0),
                             engine_window(seed, first=3000, last=3400, mean_before=150.0))
    assert abs(steady.z) < 3.0


def test_the_hazard_comparison_of_windows_with_nothing_to_compare_or_equal_ones_is_zero() -> None:
    short = WindowObservations(hist([1, 2, 3]))
    assert compare_hazards(short, WindowObservations(LengthHistogram.empty())) == HazardComparison(0.0, 0.0)
    assert compare_hazards(short, short).z == 0.0 and compare_hazards(short, short).events_after == 3.0


def test_a_transient_fit_never_extrapolates_an_unmeasured_intercept() -> None:
    """Windows of 100 completions opened 200 and 300 completions after a 128 → 1,024 shift (40 seeds each):
    the mixture's line often has a steep slope whose intercept is not measured (within 2 standard errors of
    0); extrapolated to age 0 it fell to 4% of the new law's hazard. The young band's events over exposure
    stand in for it: p̂0 never below half of the new law's hazard."""
    rates = []
    for seed in range(40):
        for offset in (200, 300):
            outputs, opening, closing = saturated_engine(seed, mean_before=128.0, mean_after=1024.0, shift_at=5000,
                                                         open_at=5000 + offset, close_at=5100 + offset)
            fit = fit_hazard_histogram(outputs, prompt_count=10, prompt_sum_tokens=5120.0, censored=closing,
                                       truncated=opening, shift_transient=True)
            assert fit is not None and fit.stats.eta == 0.0
            rates.append(fit.stats.p0 * 1024.0)
    assert min(rates) > 0.5, min(rates)


@pytest.mark.parametrize("cut_tokens", [200, 300, 500])
def test_the_mean_of_an_increasing_hazard_is_continued_at_a_measured_rate(cut_tokens: int) -> None:
    """A cold engine's first window of an IFR law (h(t) = 2e-5 + 1e-5·t, mean 395): most requests are still
    running, and the fitted intercept is an extrapolation to age 0 that a steep slope takes towards 0. The
    curve past the last observed age continues at the window's events over exposure (no lower than the
    hazard there for an increasing hazard), so μ̂_O stays at or above the truth (conservative for memory)
    and bounded; continued at the intercept it reached 40,021 / 102,696 / 118,684 tokens on these seeds."""
    p0, eta, true_mean = 2e-5, 1e-5, 395.1
    means, sloped = [], 0
    for seed in range(40):
        done, running = cohort(seed, cut_tokens=cut_tokens, draw=increasing_hazard(p0=p0, eta=eta))
        fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1,
                                   prompt_sum_tokens=512.0, censored=hist(running))
        assert fit is not None
        sloped += fit.stats.eta > 0.0  # the others fall back to the geometric law (a non-positive intercept)
        means.append(fit.stats.mu_o_tokens)
    assert sloped >= 10
    assert min(means) >= 0.98 * true_mean
    assert max(means) <= 4.0 * true_mean


def test_the_mean_of_a_law_with_a_minimum_length_is_continued_at_its_oldest_ages_hazard() -> None:
    """A cohort of a uniform law 900 tokens after it started (the window re-based at a shift to longer
    outputs): no event before 512 tokens, so the events over exposure of all ages are a third of the hazard
    at the oldest ages. Continued at that average, μ̂_O was 1,879–2,400 for a law of mean 1,024 on these
    seeds; continued at the oldest ages' hazard it is 1,124–1,378 (still no shorter than the truth). In 3 of
    the 20 windows the curve has just fallen to 60% and a log-normal law explains it better than the constant
    hazard and the line (`hazard._lognormal_moments`): continued by it, the lowest μ̂_O is 988 (0.965×)."""
    means = []
    for seed in range(20):
        done, running = cohort(seed, cut_tokens=900, draw=uniform(512, 1536))
        table = life_table(WindowObservations(completed=LengthHistogram.from_samples(done), censored=hist(running)))
        oldest = oldest_band_hazard(table, span=table.events.size)
        assert oldest is not None and oldest > 2.0 * table.total_events / table.total_exposure
        fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1, prompt_sum_tokens=512.0,
                                   censored=hist(running))
        assert fit is not None
        means.append(fit.stats.mu_o_tokens)
    assert min(means) >= 0.95 * 1024.0
    assert float(np.median(means)) >= 1024.0
    assert float(np.median(means)) <= 1.3 * 1024.0
    assert max(means) <= 1.5 * 1024.0


def test_a_constant_hazard_keeps_the_rate_of_all_ages() -> None:
    """Geometric outputs (mean 1,024) seen as length-biased engine snapshots: the oldest ages' hazard does
    not differ measurably from the average, so the band is not used beyond the test's level (2.7 per 1,000
    at 3 standard errors; at most 1 of 200 windows here at each cut)."""
    for cut_tokens in (400, 1000, 2000):
        used = 0
        for seed in range(200):
            done, running = engine_snapshot(seed, mean=1024.0, slots=512, cut_tokens=cut_tokens)
            table = life_table(WindowObservations(completed=LengthHistogram.from_samples(done),
                                                  censored=hist(running)))
            used += oldest_band_hazard(table, span=table.events.size) is not None
        assert used <= 3, (cut_tokens, used)


def test_the_oldest_band_of_an_empty_table_is_none() -> None:
    table = life_table(WindowObservations(completed=LengthHistogram.from_samples(np.array([5])),
                                          censored=hist([10, 10])))
    assert oldest_band_hazard(table, span=0) is None
    assert oldest_band_hazard(table, span=3) is None  # no event up to age 3


@pytest.mark.parametrize(("sigma", "cut_tokens"), [(0.5, 300), (0.8, 150)])
def test_a_hazard_that_rises_then_falls_is_not_continued_rising(sigma: float, cut_tokens: int) -> None:
    """A log-normal law's hazard rises over the young ages and falls past its mode: a young window proves a
    rise that does not hold past the curve. Continued by the band's constant hazard, μ̂_O of a cold window
    (mean 434, 40 seeds) stays near or above the truth: σ 0.5 after 300 tokens 2 of 40 below it, the lowest
    0.952×; σ 0.8 after 150 tokens a median 1.08×. A tail rising at the window's proven rise (its slope less
    2.5 standard errors, from the band's rate less 2.5) put 9 of 40 below, the lowest at 0.902×, and the
    median at 0.917×."""
    true_mean = 434.0
    means = []
    for seed in range(40):
        done, running = cohort(seed, cut_tokens=cut_tokens, draw=lognormal(sigma=sigma, mean_tokens=true_mean))
        fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1, prompt_sum_tokens=512.0,
                                   censored=hist(running))
        assert fit is not None
        means.append(fit.stats.mu_o_tokens / true_mean)
    if sigma == 0.5:
        assert sum(mean < 1.0 for mean in means) <= 4
        assert min(means) >= 0.94
    else:
        assert float(np.median(means)) >= 1.0
