"""Online cost-model fit: recovery of α/β and the mixed-step polynomial, bounds, outlier resistance, validity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.cost_model import (
    MIN_ALPHA_S,
    MIN_FIT_SAMPLES,
    MIN_SLOPE,
    CostFit,
    CostModelEstimator,
    LinearFit,
    bounded_lstsq,
    cost_model_is_usable,
    robust_linear_fit,
)
from controlplane.core.cost_sums import CostSums, StepColumns
from controlplane.core.types import CostModel

# H200 / Qwen3-8B published calibration.
ALPHA_P, BETA_P = 0.0012785933415095027, 2.4852551825304505e-05
ALPHA_D, BETA_D = 0.008921181622454422, 4.586467522217373e-05
ALPHA_MB = 0.0015
C0, C1, C2 = 2.494e-05, 5.193e-05, 1.478e-05


def synthetic_steps(seed: int, n: int, noise_s: float) -> dict[str, np.ndarray]:
    """n prefill-only, n decode-only and n mixed steps of the H200 model, interleaved, with Gaussian noise."""
    rng = np.random.default_rng(seed)
    prefill_tokens = rng.integers(64, 8192, n).astype(float)
    decode_requests = rng.integers(1, 512, n).astype(float)
    mixed_tokens = rng.integers(256, 8192, n).astype(float)
    mixed_decode = np.round(mixed_tokens * rng.uniform(0.05, 0.95, n))
    ratio = mixed_decode / mixed_tokens
    zeros = np.zeros(n)
    columns = {
        "prefill_tokens": np.concatenate((prefill_tokens, zeros, mixed_tokens - mixed_decode)),
        "decode_tokens": np.concatenate((zeros, decode_requests, mixed_decode)),
        "decode_requests": np.concatenate((zeros, decode_requests, mixed_decode)),
        "duration_s": np.concatenate((
            ALPHA_P + BETA_P * prefill_tokens,
            ALPHA_D + BETA_D * decode_requests,
            ALPHA_MB + (C0 + C1 * ratio + C2 * ratio**2) * mixed_tokens,
        )) + rng.normal(0.0, noise_s, 3 * n),
    }
    order = rng.permutation(3 * n)
    return {k: v[order] for k, v in columns.items()}


def fitted(steps: dict[str, np.ndarray], *, window: int = 2048) -> tuple[CostFit, CostModelEstimator]:
    estimator = CostModelEstimator(window=window)
    assert estimator.add_steps(**steps) == 0
    return estimator.fit(), estimator


def test_noise_free_steps_are_recovered_exactly() -> None:
    fit, _ = fitted(synthetic_steps(0, 500, 0.0))
    assert fit.prefill is not None and fit.decode is not None and fit.mixed is not None
    assert fit.prefill.coefficients == pytest.approx((ALPHA_P, BETA_P), rel=1e-9)
    assert fit.decode.coefficients == pytest.approx((ALPHA_D, BETA_D), rel=1e-9)
    assert fit.mixed.coefficients == pytest.approx((ALPHA_MB, C0, C1, C2), rel=1e-9)
    for phase in (fit.prefill, fit.decode, fit.mixed):
        assert phase.r2 == pytest.approx(1.0, abs=1e-12)


def test_noisy_steps_are_recovered_within_tight_tolerance() -> None:
    fit, _ = fitted(synthetic_steps(1, 600, 2e-5))  # 20 µs jitter on steps of 1 ms ... 0.5 s
    assert fit.prefill is not None and fit.decode is not None and fit.mixed is not None
    assert fit.prefill.coefficients[0] == pytest.approx(ALPHA_P, rel=0.01)
    assert fit.prefill.coefficients[1] == pytest.approx(BETA_P, rel=1e-3)
    assert fit.decode.coefficients[0] == pytest.approx(ALPHA_D, rel=0.01)
    assert fit.decode.coefficients[1] == pytest.approx(BETA_D, rel=1e-3)
    assert fit.mixed.coefficients[0] == pytest.approx(ALPHA_MB, rel=0.01)
    assert fit.mixed.coefficients[1:] == pytest.approx((C0, C1, C2), rel=0.01)
    for phase in (fit.prefill, fit.decode, fit.mixed):
        assert phase.r2 > 0.9999
        assert phase.num_samples == 600
        assert phase.num_outliers == 0
    costs = fit.to_cost_model()
    assert costs is not None
    assert cost_model_is_usable(costs)
    assert costs.mb_coeffs_s_per_token == fit.mixed.coefficients[1:]
    assert costs.alpha_mb_s == fit.mixed.coefficients[0]


@pytest.mark.parametrize(
    ("phase", "absurd"),
    [
        ("prefill", {"prefill_tokens": 1000.0, "decode_tokens": 0.0, "decode_requests": 0.0}),
        ("decode", {"prefill_tokens": 0.0, "decode_tokens": 100.0, "decode_requests": 100.0}),
        ("mixed", {"prefill_tokens": 1000.0, "decode_tokens": 100.0, "decode_requests": 100.0}),
    ],
)
def test_one_absurd_sample_barely_moves_the_fit(phase: str, absurd: dict[str, float]) -> None:
    steps = synthetic_steps(2, 400, 2e-5)
    clean_fit, estimator = fitted(steps)
    assert estimator.add_steps(**{k: np.array([v]) for k, v in absurd.items()},
                               duration_s=np.array([1e6])) == 0  # valid, just absurd (11.6 days)
    dirty_fit = estimator.fit()
    clean, dirty = getattr(clean_fit, phase), getattr(dirty_fit, phase)
    assert clean is not None and dirty is not None
    for got, want in zip(dirty.coefficients, clean.coefficients, strict=True):
        assert got == pytest.approx(want, rel=0.01)
    assert dirty.num_outliers == clean.num_outliers + 1
    assert dirty.num_samples == clean.num_samples
    assert dirty.r2 > 0.9999
    if phase == "prefill":
        # The sample is absurd enough to matter: an unprotected least-squares fit is ruined by it.
        is_prefill = steps["decode_tokens"] == 0
        x = np.append(steps["prefill_tokens"][is_prefill], 1000.0)
        y = np.append(steps["duration_s"][is_prefill], 1e6)
        ols = np.linalg.lstsq(np.column_stack((np.ones(x.size), x)), y, rcond=None)[0]
        assert abs(ols[0] / ALPHA_P - 1.0) > 100.0


def test_invalid_steps_are_rejected_counted_and_ignored() -> None:
    steps = synthetic_steps(3, 200, 1e-5)
    clean_fit, _ = fitted(steps)
    estimator = CostModelEstimator()
    bad = {
        "prefill_tokens": np.array([math.nan, 100.0, 100.0, 100.0, -5.0, 0.0, 100.0, 100.0, math.inf]),
        "decode_tokens": np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0]),
        "decode_requests": np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, math.nan, 0.0]),
        "duration_s": np.array([0.01, math.nan, 0.0, -0.01, 0.01, 0.01, 0.01, 0.01, 0.01]),
    }
    # nan tokens, nan duration, zero duration, negative duration, negative tokens, empty step, negative
    # decode tokens, nan requests, inf tokens: nine invalid steps.
    half = {k: v[:300] for k, v in steps.items()}
    rest = {k: v[300:] for k, v in steps.items()}
    assert estimator.add_steps(**half) == 0
    assert estimator.add_steps(**bad) == 9
    assert estimator.add_steps(**rest) == 0
    assert estimator.num_rejected == 9
    assert estimator.fit() == clean_fit


def test_columns_of_different_lengths_are_rejected_whole() -> None:
    estimator = CostModelEstimator()
    rejected = estimator.add_steps(prefill_tokens=np.ones(3), decode_tokens=np.zeros(3),
                                   decode_requests=np.zeros(2), duration_s=np.ones(3))
    assert rejected == 3
    assert estimator.num_rejected == 3
    assert estimator.fit() == CostFit(prefill=None, decode=None, mixed=None)


def test_window_keeps_only_recent_steps() -> None:
    estimator = CostModelEstimator(window=16)
    tokens = np.arange(100.0, 132.0)
    zeros = np.zeros(tokens.size)
    # Old regime: α = 1 s, β = 1 s/token; new regime (last 16 steps): the H200 prefill line.
    estimator.add_steps(prefill_tokens=tokens, decode_tokens=zeros, decode_requests=zeros,
                        duration_s=1.0 + tokens)
    estimator.add_steps(prefill_tokens=tokens[:10], decode_tokens=zeros[:10], decode_requests=zeros[:10],
                        duration_s=ALPHA_P + BETA_P * tokens[:10])
    estimator.add_steps(prefill_tokens=tokens[10:16], decode_tokens=zeros[:6], decode_requests=zeros[:6],
                        duration_s=ALPHA_P + BETA_P * tokens[10:16])
    fit = estimator.fit()
    assert fit.prefill is not None
    assert fit.prefill.coefficients == pytest.approx((ALPHA_P, BETA_P), rel=1e-9)
    assert fit.prefill.num_samples + fit.prefill.num_outliers == 16
    # A single batch larger than the window keeps its last 16 rows.
    estimator.add_steps(prefill_tokens=tokens, decode_tokens=zeros, decode_requests=zeros,
                        duration_s=2.0 + 3.0 * tokens)
    assert estimator.fit().prefill.coefficients == pytest.approx((2.0, 3.0), rel=1e-9)


def test_window_smaller_than_a_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        CostModelEstimator(window=MIN_FIT_SAMPLES - 1)


def test_too_few_or_degenerate_samples_give_no_fit() -> None:
    estimator = CostModelEstimator()
    tokens = np.full(MIN_FIT_SAMPLES - 1, 512.0)
    estimator.add_steps(prefill_tokens=np.arange(1.0, MIN_FIT_SAMPLES), decode_tokens=np.zeros(tokens.size),
                        decode_requests=np.zeros(tokens.size), duration_s=np.full(tokens.size, 0.01))
    assert estimator.fit().prefill is None  # 7 < MIN_FIT_SAMPLES
    # Enough samples, but every step has the same size: the slope is not identifiable.
    assert robust_linear_fit(np.full((20, 1), 512.0), np.linspace(0.01, 0.02, 20)) is None
    assert robust_linear_fit(np.arange(7.0)[:, None], np.arange(7.0)) is None


def test_robust_linear_fit_r2_and_constant_target() -> None:
    x = np.arange(1.0, 21.0)
    exact = robust_linear_fit(x[:, None], 3.0 + 2.0 * x)
    assert exact is not None
    assert exact.coefficients == pytest.approx((3.0, 2.0), rel=1e-12)
    assert exact.r2 == pytest.approx(1.0, abs=1e-12)
    flat = robust_linear_fit(x[:, None], np.full(20, 0.5))
    assert flat is not None
    assert flat.coefficients == pytest.approx((0.5, 0.0), abs=1e-12)
    assert (flat.r2, flat.num_samples, flat.num_outliers) == (1.0, 20, 0)  # no variance to explain
    # R² by hand for a noisy line: 1 − SS_res/SS_tot on the inliers.
    rng = np.random.default_rng(4)
    y = 3.0 + 2.0 * x + rng.normal(0.0, 1.0, x.size)
    noisy = robust_linear_fit(x[:, None], y)
    b, a = np.polyfit(x, y, 1)
    residual = y - (a + b * x)
    assert noisy.num_outliers == 0
    assert noisy.r2 == pytest.approx(1.0 - (residual**2).sum() / ((y - y.mean()) ** 2).sum(), rel=1e-12)


# ------------------------------------------------------------------------------- merging into a model


def linear(*coefficients: float) -> LinearFit:
    return LinearFit(coefficients=coefficients, r2=1.0, num_samples=100, num_outliers=0)


FALLBACK = CostModel(alpha_p_s=0.002, beta_p_s_per_token=3e-5, alpha_d_s=0.01, beta_d_s_per_request=5e-5,
                     alpha_mb_s=0.003, mb_coeffs_s_per_token=(1e-5, 2e-5, 3e-5))


def test_to_cost_model_without_fallback_needs_prefill_and_decode() -> None:
    assert CostFit(prefill=linear(ALPHA_P, BETA_P), decode=None, mixed=None).to_cost_model() is None
    costs = CostFit(prefill=linear(ALPHA_P, BETA_P), decode=linear(ALPHA_D, BETA_D), mixed=None).to_cost_model()
    assert costs == CostModel(alpha_p_s=ALPHA_P, beta_p_s_per_token=BETA_P, alpha_d_s=ALPHA_D,
                              beta_d_s_per_request=BETA_D, alpha_mb_s=ALPHA_P,  # α_MB ≈ α_p
                              mb_coeffs_s_per_token=(0.0, 0.0, 0.0))


def test_to_cost_model_fitted_phases_override_the_fallback() -> None:
    fit = CostFit(prefill=None, decode=linear(ALPHA_D, BETA_D), mixed=linear(ALPHA_MB, C0, C1, -C2))
    costs = fit.to_cost_model(FALLBACK)
    assert costs == CostModel(alpha_p_s=0.002, beta_p_s_per_token=3e-5, alpha_d_s=ALPHA_D,
                              beta_d_s_per_request=BETA_D, alpha_mb_s=ALPHA_MB,
                              mb_coeffs_s_per_token=(C0, C1, -C2))


def test_to_cost_model_keeps_the_fallback_for_lines_outside_their_bounds() -> None:
    """Changed with the bounded fits (it used to floor a negative α here, after the fit, keeping the slope of
    the unconstrained line): the fits now bound α ≥ MIN_ALPHA_S and β ≥ MIN_SLOPE themselves (tests below),
    so a line below its bounds can only be hand-made and is refused, not rewritten; a slope at its floor is
    a slope the steps did not identify."""
    fit = CostFit(prefill=linear(-1e-3, BETA_P), decode=linear(ALPHA_D, MIN_SLOPE), mixed=linear(0.0, C0, C1, C2))
    model = fit.to_cost_model(FALLBACK)
    assert (model.alpha_p_s, model.beta_p_s_per_token) == (FALLBACK.alpha_p_s, FALLBACK.beta_p_s_per_token)
    assert (model.alpha_d_s, model.beta_d_s_per_request) == (FALLBACK.alpha_d_s, FALLBACK.beta_d_s_per_request)
    assert (model.alpha_mb_s, model.mb_coeffs_s_per_token) == (FALLBACK.alpha_mb_s, FALLBACK.mb_coeffs_s_per_token)
    assert fit.to_cost_model() is None
    # α at its floor is a fit (the bounded optimum); a zero slope is no fit at all.
    at_floor = CostFit(prefill=linear(MIN_ALPHA_S, BETA_P), decode=linear(ALPHA_D, 0.0), mixed=None)
    model = at_floor.to_cost_model(FALLBACK)
    assert (model.alpha_p_s, model.beta_p_s_per_token) == (MIN_ALPHA_S, BETA_P)
    assert (model.alpha_d_s, model.beta_d_s_per_request) == (FALLBACK.alpha_d_s, FALLBACK.beta_d_s_per_request)


def prefill_steps(tokens: np.ndarray, duration_s: np.ndarray) -> dict[str, np.ndarray]:
    zeros = np.zeros(tokens.size)
    return {"prefill_tokens": tokens, "decode_tokens": zeros, "decode_requests": zeros, "duration_s": duration_s}


def test_bounded_fit_puts_a_lost_fixed_cost_at_its_floor_and_fits_the_slope_for_it() -> None:
    """Prefill steps whose straight-line fit crosses zero below the smallest step (a fixed cost lost in the
    noise, as on small models): α comes out at MIN_ALPHA_S and β is the least-squares slope of a line through
    (0, MIN_ALPHA_S), not the slope of the unconstrained line; the normal-equation sums agree."""
    rng = np.random.default_rng(5)
    tokens = rng.integers(64, 4096, 400).astype(float)
    duration = BETA_P * tokens - 2e-4 + rng.normal(0.0, 5e-5, tokens.size)
    assert np.all(duration > 0.0)
    free = robust_linear_fit(tokens[:, None], duration)
    assert free is not None and free.coefficients[0] < 0.0  # the unconstrained line: a negative fixed cost
    estimator = CostModelEstimator(window=512)
    assert estimator.add_steps(**prefill_steps(tokens, duration)) == 0
    bounded = estimator.fit().prefill
    assert bounded is not None and bounded.num_outliers == 0
    through_floor = float((duration - MIN_ALPHA_S) @ tokens / (tokens @ tokens))  # closed form
    assert bounded.coefficients[0] == MIN_ALPHA_S
    assert bounded.coefficients[1] == pytest.approx(through_floor, rel=1e-9)
    assert abs(bounded.coefficients[1] / free.coefficients[1] - 1.0) > 1e-3

    def sse(alpha: float, beta: float) -> float:
        return float(((duration - alpha - beta * tokens) ** 2).sum())

    # The old clip (α floored, the free slope kept) fits worse than the bounded line.
    assert sse(MIN_ALPHA_S, bounded.coefficients[1]) < sse(MIN_ALPHA_S, free.coefficients[1])
    model = estimator.fit().to_cost_model(FALLBACK)
    assert (model.alpha_p_s, model.beta_p_s_per_token) == bounded.coefficients
    sums = CostSums()
    assert sums.add_steps(StepColumns(**prefill_steps(tokens, duration))) == 0
    from_sums = sums.fit().prefill
    assert from_sums is not None and from_sums.coefficients[0] == MIN_ALPHA_S
    assert from_sums.coefficients[1] == pytest.approx(through_floor, rel=1e-9)


def test_a_slope_the_steps_cannot_tell_from_zero_is_left_to_the_fallback() -> None:
    """Decode steps that get slightly faster with more requests (noise around a flat cost): β is bounded at
    MIN_SLOPE, α is the mean cost, and the decode costs stay the fallback's."""
    rng = np.random.default_rng(6)
    requests = rng.integers(1, 256, 300).astype(float)
    duration = 0.01 - 2e-7 * requests + rng.normal(0.0, 1e-5, requests.size)
    estimator = CostModelEstimator(window=512)
    assert estimator.add_steps(prefill_tokens=np.zeros(requests.size), decode_tokens=requests,
                               decode_requests=requests, duration_s=duration) == 0
    decode = estimator.fit().decode
    assert decode is not None and decode.coefficients[1] == MIN_SLOPE
    assert decode.coefficients[0] == pytest.approx(float(np.mean(duration - MIN_SLOPE * requests)), rel=1e-9)
    model = estimator.fit().to_cost_model(FALLBACK)
    assert (model.alpha_d_s, model.beta_d_s_per_request) == (FALLBACK.alpha_d_s, FALLBACK.beta_d_s_per_request)
    assert not estimator.fit().is_complete()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(1, 4), bounded=st.lists(st.booleans(), min_size=4,
                                                                                  max_size=4))
def test_bounded_lstsq_meets_the_optimality_conditions(seed: int, width: int, bounded: list[bool]) -> None:
    """KKT conditions of min ‖Xb − y‖² s.t. b ≥ l: b ≥ l; the gradient Xᵀ(Xb − y) is zero on the free
    coefficients and ≥ 0 on those at their bound."""
    rng = np.random.default_rng(seed)
    design = np.column_stack((np.ones(40), rng.uniform(0.0, 1000.0, (40, width - 1))))
    target = design @ rng.normal(0.0, 1.0, width) + rng.normal(0.0, 1.0, 40)
    lower = np.where(bounded[:width], rng.normal(0.0, 1.0, width), -np.inf)
    coef = bounded_lstsq(design, target, lower)
    assert np.all(coef >= lower)
    gradient = design.T @ (design @ coef - target)
    tolerance = 1e-7 * np.linalg.norm(design, axis=0) * (np.linalg.norm(target) + 1.0)
    finite_lower = np.where(np.isfinite(lower), lower, 0.0)
    at_bound = np.isfinite(lower) & (coef <= finite_lower + 1e-9 * np.maximum(1.0, np.abs(finite_lower)))
    assert np.all(np.abs(gradient[~at_bound]) <= tolerance[~at_bound])
    assert np.all(gradient[at_bound] >= -tolerance[at_bound])


def test_lower_bounds_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="lower_bounds needs 2 values"):
        robust_linear_fit(np.arange(20.0)[:, None], np.arange(20.0), lower_bounds=(0.0,))


@pytest.mark.parametrize(
    ("override", "usable"),
    [
        ({}, True),
        ({"mb_coeffs_s_per_token": (5.14672e-05, 1.73412e-04, -1.48754e-04)}, True),  # negative c is fine
        ({"alpha_p_s": 0.0}, False),
        ({"beta_p_s_per_token": -1e-5}, False),
        ({"alpha_d_s": math.nan}, False),
        ({"beta_d_s_per_request": math.inf}, False),
        ({"alpha_mb_s": 0.0}, False),
        ({"mb_coeffs_s_per_token": (0.0, math.nan, 0.0)}, False),
    ],
)
def test_cost_model_is_usable(override: dict, usable: bool) -> None:
    base = {"alpha_p_s": ALPHA_P, "beta_p_s_per_token": BETA_P, "alpha_d_s": ALPHA_D,
            "beta_d_s_per_request": BETA_D, "alpha_mb_s": ALPHA_P}
    assert cost_model_is_usable(CostModel(**(base | override))) is usable


def test_mixed_fit_stays_physical_when_the_decode_ratio_range_is_narrow() -> None:
    """Steps all near r ≈ 0.9 make T, T·r, T·r² nearly collinear; the fit must still give α_MB > 0 and the
    right cost inside the observed range (the additive fallback when the quadratic one goes negative)."""
    rng = np.random.default_rng(3)
    num = 600
    decode_tokens = rng.integers(60, 120, num).astype(float)
    prefill_tokens = np.round(decode_tokens * rng.uniform(0.05, 0.15, num))
    duration = 0.004 + 3e-5 * prefill_tokens + 1e-4 * decode_tokens + rng.normal(0, 4e-4, num)
    estimator = CostModelEstimator(window=1024)
    estimator.add_steps(prefill_tokens=prefill_tokens, decode_tokens=decode_tokens,
                        decode_requests=decode_tokens, duration_s=duration)
    mixed = estimator.fit().mixed
    assert mixed is not None and mixed.coefficients[0] > 0.0
    alpha, c0, c1, c2 = mixed.coefficients
    for tokens, ratio in ((100.0, 0.9), (80.0, 0.88)):
        truth = 0.004 + 3e-5 * tokens * (1 - ratio) + 1e-4 * tokens * ratio
        predicted = alpha + (c0 + c1 * ratio + c2 * ratio * ratio) * tokens
        assert predicted == pytest.approx(truth, rel=0.05)


def test_is_complete_means_no_fallback_is_consulted() -> None:
    complete = CostFit(prefill=linear(ALPHA_P, BETA_P), decode=linear(ALPHA_D, BETA_D),
                       mixed=linear(ALPHA_P, C0, C1, C2))
    assert complete.is_complete() and complete.to_cost_model(FALLBACK) == complete.to_cost_model()
    for partial in (CostFit(prefill=None, decode=linear(ALPHA_D, BETA_D), mixed=linear(ALPHA_P, C0, C1, C2)),
                    CostFit(prefill=linear(ALPHA_P, BETA_P), decode=linear(ALPHA_D, 0.0), mixed=linear(ALPHA_P, C0)),
                    CostFit(prefill=linear(ALPHA_P, BETA_P), decode=linear(ALPHA_D, BETA_D), mixed=linear(0.0, C0))):
        assert not partial.is_complete()


def test_bounded_sums_fit_is_the_exact_box_constrained_optimum() -> None:
    """`cost_sums` solves the bounded normal equations by faces of the box; scipy's BVLS on the same
    problem (through the Cholesky factor) finds the same optimum."""
    from scipy.optimize import lsq_linear

    from controlplane.core.cost_sums import _bounded_from_gram

    rng = np.random.default_rng(11)
    for trial in range(300):
        n = 2 + trial % 2
        design = rng.normal(size=(40, n))
        design[:, 0] = 1.0
        target = design @ rng.normal(size=n) + rng.normal(size=40)
        gram, xy = design.T @ design, design.T @ target
        lower = rng.normal(size=n)
        if trial % 3 == 0:
            lower[-1] = -np.inf
        mine = _bounded_from_gram(gram, xy, lower)
        factor = np.linalg.cholesky(gram)
        reference = lsq_linear(factor.T, np.linalg.solve(factor, xy), bounds=(lower, np.inf), method="bvls").x
        assert mine is not None and np.all(mine >= lower)
        mine_value, reference_value = (float(b @ gram @ b - 2.0 * b @ xy) for b in (mine, reference))
        assert mine_value <= reference_value + 1e-9 * max(1.0, abs(reference_value))
        assert np.allclose(mine, reference, atol=1e-6)
    assert _bounded_from_gram(np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones(2), np.zeros(2)) is None  # indefinite
