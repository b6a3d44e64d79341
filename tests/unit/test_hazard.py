"""Output-length hazard estimation (EB paper §3.4): validity, WLS fit, estimator accuracy, over the histogram of
a window's completions (`fit_hazard_histogram`, fed sample arrays by `tests.unit.sample_fit.fit_from_samples`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.hazard import KM_MIN_AT_RISK, SLOPE_SIGNIFICANCE_Z, fit_hazard_histogram
from controlplane.core.length_histogram import MAX_LENGTH_TOKENS, LengthHistogram
from tests.unit.sample_fit import fit_from_samples

INVALID_LENGTHS = [math.nan, math.inf, -math.inf, 0.0, -3.0, 2.5, 1e-300, -0.0, 0.999999]


def geometric_outputs(rng: np.random.Generator, p0: float, n: int) -> np.ndarray:
    return rng.geometric(p0, size=n).astype(np.float64)


def linear_hazard_outputs(rng: np.random.Generator, p0: float, eta: float, n: int, t_max: int = 8000) -> np.ndarray:
    """Samples of O with hazard h(t) = p0 + η·t: pmf(t) = h(t)·Π_{s<t}(1 − h(s)), t = 1..t_max."""
    t = np.arange(1, t_max + 1)
    hazard = np.minimum(p0 + eta * t, 1.0)
    survival = np.concatenate(([1.0], np.cumprod(1.0 - hazard)[:-1]))
    pmf = hazard * survival
    assert pmf.sum() > 1.0 - 1e-12  # t_max covers the whole distribution
    return rng.choice(t, size=n, p=pmf / pmf.sum()).astype(np.float64)


def reference_fit(outputs: list[int]) -> tuple[float, float, float]:
    """(p0, η, t95) by direct counting and textbook weighted least squares, in plain Python."""
    ordered = sorted(outputs)
    t95 = ordered[math.ceil(0.95 * len(ordered)) - 1]  # inverted-CDF 95th percentile
    ts, hs, ws = [], [], []
    for t in range(1, t95 + 1):
        at_risk = sum(1 for o in outputs if o >= t)
        if at_risk:
            ts.append(t)
            hs.append(sum(1 for o in outputs if o == t) / at_risk)
            ws.append(at_risk)
    sw = sum(ws)
    t_bar = sum(w * t for w, t in zip(ws, ts, strict=True)) / sw
    h_bar = sum(w * h for w, h in zip(ws, hs, strict=True)) / sw
    s_tt = sum(w * (t - t_bar) ** 2 for w, t in zip(ws, ts, strict=True))
    s_th = sum(w * (t - t_bar) * (h - h_bar) for w, t, h in zip(ws, ts, hs, strict=True))
    slope = s_th / s_tt
    if abs(slope) < SLOPE_SIGNIFICANCE_Z * math.sqrt(h_bar * (1 - h_bar) / s_tt):
        return h_bar, 0.0, float(t95)
    return h_bar - slope * t_bar, slope, float(t95)


# ------------------------------------------------------------------------------------------ the fit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_matches_an_independent_weighted_least_squares(seed: int) -> None:
    rng = np.random.default_rng(seed)
    outputs = linear_hazard_outputs(rng, 0.02, 2e-3, 600)
    prompts = rng.integers(1, 2000, size=600).astype(np.float64)
    fit = fit_from_samples(outputs, prompts)
    assert fit is not None
    p0, eta, t95 = reference_fit([int(o) for o in outputs])
    assert eta > 0.0  # a clearly IFR sample: the slope is kept
    assert fit.stats.p0 == pytest.approx(p0, rel=1e-9)
    assert fit.stats.eta == pytest.approx(eta, rel=1e-9)
    assert fit.stats.t95_tokens == t95
    assert fit.stats.mu_o_tokens == pytest.approx(sum(outputs) / len(outputs), rel=1e-14)
    assert fit.stats.mu_l_tokens == pytest.approx(sum(prompts) / len(prompts), rel=1e-14)
    mean = sum(outputs) / len(outputs)
    assert fit.stats.sigma_o_tokens == pytest.approx(
        math.sqrt(sum((o - mean) ** 2 for o in outputs) / len(outputs)), rel=1e-12)
    assert fit.stats.num_samples == 600
    assert not fit.intercept_fallback
    assert not fit.slope_clipped


def test_fit_on_a_tiny_hand_counted_window() -> None:
    # 20 outputs: four 1s, six 2s, four 3s, six 4s. t95 = the ⌈0.95·20⌉ = 19th smallest = 4.
    outputs = np.array([1, 1, 2, 2, 2, 3, 3, 4, 4, 4] * 2, dtype=np.float64)
    fit = fit_from_samples(outputs, np.full(20, 7.0))
    assert fit is not None
    assert fit.stats.t95_tokens == 4.0
    # ĥ(1..4) = 4/20, 6/16, 4/10, 6/6 with at-risk weights 20, 16, 10, 6: t̄ = 106/52, h̄ = 20/52,
    # slope = Σn(t−t̄)(ĥ−h̄)/Σn(t−t̄)² > 0 and the intercept h̄ − slope·t̄ < 0 ...
    t = np.array([1.0, 2.0, 3.0, 4.0])
    n = np.array([20.0, 16.0, 10.0, 6.0])
    h = np.array([4 / 20, 6 / 16, 4 / 10, 6 / 6])
    t_bar, h_bar = 106.0 / 52.0, 20.0 / 52.0
    slope = float((n * (t - t_bar) * (h - h_bar)).sum() / (n * (t - t_bar) ** 2).sum())
    assert slope > 0.0
    assert h_bar - slope * t_bar < 0.0
    # ... so the fit falls back to the geometric MLE 1/μ_O, μ_O = 52/20.
    assert fit.intercept_fallback
    assert fit.stats.p0 == pytest.approx(20.0 / 52.0, rel=1e-15)
    assert fit.stats.eta == 0.0
    assert fit.stats.mu_o_tokens == 2.6
    assert fit.stats.mu_l_tokens == 7.0


def test_dfr_window_clips_the_slope() -> None:
    # A mixture of a short and a long geometric has a decreasing hazard.
    rng = np.random.default_rng(3)
    outputs = np.concatenate((geometric_outputs(rng, 0.3, 2000), geometric_outputs(rng, 0.003, 2000)))
    fit = fit_from_samples(outputs, np.full(outputs.size, 100.0))
    assert fit is not None
    assert fit.slope_clipped
    assert fit.stats.eta == 0.0
    assert fit.stats.p0 > 0.0


def test_nonpositive_intercept_falls_back_to_the_geometric_mle() -> None:
    # Every request outputs exactly 50 tokens: ĥ = 0 before 50, 1 at 50; the line's intercept is < 0.
    fit = fit_from_samples(np.full(300, 50.0), np.full(300, 10.0))
    assert fit is not None
    assert fit.intercept_fallback
    assert fit.stats.p0 == 1.0 / 50.0
    assert fit.stats.eta == 0.0


def test_single_point_window_falls_back() -> None:
    fit = fit_from_samples(np.ones(10), np.ones(10))
    assert fit is not None
    assert fit.intercept_fallback
    assert fit.stats.p0 == 1.0
    assert fit.stats.t95_tokens == 1.0


@pytest.mark.parametrize(
    ("outputs", "prompts"),
    [([], [1.0]), ([5.0], []), ([math.nan, 0.0, -1.0], [3.0]), ([4.0], [2.5, math.inf])],
)
def test_fit_without_valid_samples_is_none(outputs: list[float], prompts: list[float]) -> None:
    assert fit_from_samples(np.array(outputs), np.array(prompts)) is None


def test_fit_ignores_invalid_entries() -> None:
    rng = np.random.default_rng(5)
    outputs = geometric_outputs(rng, 1.0 / 64.0, 800)
    prompts = rng.integers(1, 500, size=800).astype(np.float64)
    clean = fit_from_samples(outputs, prompts)
    dirty = fit_from_samples(
        np.concatenate((INVALID_LENGTHS, outputs, INVALID_LENGTHS)),
        np.concatenate((prompts[:400], INVALID_LENGTHS, prompts[400:])),
    )
    assert dirty == clean


@pytest.mark.parametrize("huge", [1e7, 1e12, float(MAX_LENGTH_TOKENS), 2.0**63, 1e200, 1.7e308])
def test_absurdly_long_outputs_do_not_blow_up(huge: float) -> None:
    """Absurd lengths (integral floats up to 1e308) neither allocate O(length) nor raise: up to MAX_LENGTH_TOKENS
    (2⁵³) they are valid and fitted, beyond it the histogram drops them and there is nothing to fit."""
    fit = fit_from_samples(np.full(500, huge), np.full(500, 100.0))
    if huge > MAX_LENGTH_TOKENS:
        assert fit is None
        return
    assert fit is not None
    assert fit.intercept_fallback
    assert fit.stats.eta == 0.0
    assert 0.0 <= fit.stats.p0 <= 1.0 / huge * (1.0 + 1e-12)


def test_lengths_beyond_t95_only_count_as_at_risk() -> None:
    """A few huge lengths (the longest a histogram holds, 2⁵³) mixed in: the hazard line is that of any
    length > t95."""
    rng = np.random.default_rng(8)
    base = geometric_outputs(rng, 0.05, 1000)
    with_huge = base.copy()
    with_moderate = base.copy()
    with_huge[:20] = float(MAX_LENGTH_TOKENS)
    with_moderate[:20] = 10_000.0
    prompts = np.full(1000, 10.0)
    a, b = fit_from_samples(with_huge, prompts), fit_from_samples(with_moderate, prompts)
    assert a is not None and b is not None
    assert a.stats.t95_tokens == b.stats.t95_tokens < 10_000
    assert (a.stats.p0, a.stats.eta) == (b.stats.p0, b.stats.eta)


# ------------------------------------------------------------------------------ estimator accuracy


def test_geometric_p0_within_five_percent_fixed_seed() -> None:
    rng = np.random.default_rng(20240601)
    p0 = 1.0 / 256.0
    fit = fit_from_samples(geometric_outputs(rng, p0, 2000), rng.integers(1, 2048, size=2000).astype(np.float64))
    assert fit is not None
    assert fit.stats.p0 == pytest.approx(p0, rel=0.05)
    assert fit.stats.num_samples == 2000


def test_geometric_p0_within_five_percent_for_most_seeds() -> None:
    """Relative s.e. of p̂0 is √((1−p0)/n) ≈ 2.2% at n = 2000: ≥ 90% of seeds land within 5%."""
    p0 = 1.0 / 256.0
    errors = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        fit = fit_from_samples(geometric_outputs(rng, p0, 2000), np.full(2000, 128.0))
        assert fit is not None
        errors.append(abs(fit.stats.p0 / p0 - 1.0))
    within = sum(e <= 0.05 for e in errors)
    assert within >= 36, f"only {within}/40 seeds within 5%: {sorted(errors)}"
    assert np.median(errors) < 0.03


def test_linear_hazard_eta_within_twenty_percent_fixed_seed() -> None:
    p0, eta = 1.0 / 512.0, 2e-5
    rng = np.random.default_rng(7)
    fit = fit_from_samples(linear_hazard_outputs(rng, p0, eta, 4096), np.full(4096, 512.0))
    assert fit is not None
    assert not fit.slope_clipped
    assert fit.stats.eta == pytest.approx(eta, rel=0.2)
    assert fit.stats.p0 == pytest.approx(p0, rel=0.2)


def test_linear_hazard_eta_within_twenty_percent_for_most_seeds() -> None:
    p0, eta = 1.0 / 512.0, 2e-5
    hits = 0
    for seed in range(100, 120):
        rng = np.random.default_rng(seed)
        fit = fit_from_samples(linear_hazard_outputs(rng, p0, eta, 4096), np.full(4096, 512.0))
        assert fit is not None
        hits += abs(fit.stats.eta / eta - 1.0) <= 0.2
    assert hits >= 18


def test_the_mean_of_a_censored_window_does_not_collapse_when_its_oldest_request_completes() -> None:
    """Requests admitted one per token of age over 600 tokens, geometric outputs of mean 1,000: the window of
    the requests admitted since a shift. When the oldest one completes, alone at risk at its age, the
    Kaplan–Meier curve falls to 0 there; the moments read it only where KM_MIN_AT_RISK requests are at risk."""
    rng = np.random.default_rng(4)
    ages = np.arange(1, 601)
    lengths = rng.geometric(1.0 / 1000.0, ages.size)
    lengths[-1] = ages[-1]  # the oldest request completes now, at the oldest age seen
    done = lengths <= ages
    completed = LengthHistogram.from_samples(lengths[done].astype(np.float64))
    censored = LengthHistogram.from_samples(ages[~done].astype(np.float64))
    fit = fit_hazard_histogram(completed, prompt_count=int(done.sum()), prompt_sum_tokens=500.0 * done.sum(),
                               censored=censored, truncated=LengthHistogram.empty())
    assert fit is not None and fit.stats.mu_o_tokens == pytest.approx(1000.0, rel=0.3)
    assert KM_MIN_AT_RISK > 1
