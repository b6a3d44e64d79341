"""The log-normal continuation of a window's length curve (`core.lognormal_tail`, `hazard._lognormal_moments`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.lognormal_tail import (
    MAX_SHAPE,
    MIN_SHAPE,
    LogNormalLaw,
    LogNormalLikelihood,
    constant_log_likelihood,
    fit_lognormal,
    log_normal_cdf,
    lognormal_tail_moments,
)
from controlplane.core.survival import WindowObservations, km_survival, life_table
from testbench.cohorts import Draw, cohort, geometric, hist, lognormal, mixture


def _fit(done: np.ndarray, running: np.ndarray):
    fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1, prompt_sum_tokens=512.0,
                               censored=hist(running))
    assert fit is not None
    return fit


def test_the_fit_recovers_a_censored_law() -> None:
    """Every request followed up to 600 tokens (40% of them still running there): the law is recovered."""
    rng = np.random.default_rng(3)
    lengths = np.maximum(1, np.ceil(rng.lognormal(6.0, 0.7, size=20_000))).astype(np.int64)
    done = lengths[lengths <= 600]
    table = life_table(WindowObservations(completed=LengthHistogram.from_samples(done),
                                          censored=hist(np.full(lengths.size - done.size, 600))))
    found = fit_lognormal(table, span=table.events.size)
    assert found is not None
    law, log_likelihood = found
    assert log_likelihood > constant_log_likelihood(table, span=table.events.size)
    assert law.log_scale == pytest.approx(6.0, abs=0.03) and law.shape == pytest.approx(0.7, abs=0.03)


def _small_windows():
    """Windows of 3 to 60 completions and up to 30 running requests of random log-normal laws: the likelihood
    is flat and its maximum may sit on the shape's bound."""
    rng = np.random.default_rng(0)
    for _ in range(12):
        count = int(rng.integers(3, 60))
        done = np.ceil(rng.lognormal(rng.uniform(1.0, 7.0), rng.uniform(0.1, 2.5), count))
        running = np.ceil(rng.uniform(1.0, 2000.0, int(rng.integers(0, 30))))
        yield life_table(WindowObservations(completed=LengthHistogram.from_samples(done.astype(np.int64)),
                                            censored=hist(running.astype(np.int64))))


def test_the_fit_is_the_likelihoods_maximum() -> None:
    """No point 1e-3 away in (m, log s), within the shape's bounds, has a larger likelihood than the fit's
    (less the 1e-6 nats by which the approximated Φ's likelihood departs from the exact one's)."""
    for table in _small_windows():
        span = table.events.size
        likelihood = LogNormalLikelihood.of(table, span=span)
        found = fit_lognormal(table, span=span)
        assert likelihood is not None and found is not None
        law, best = found
        assert best == pytest.approx(likelihood.log_likelihood(law.log_scale, math.log(law.shape)), abs=1e-9)
        log_shape = math.log(law.shape)
        for step_m, step_u in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, -1), (1, -1), (-1, 1)):
            u = log_shape + 1e-3 * step_u
            if math.log(MIN_SHAPE) <= u <= math.log(MAX_SHAPE):
                assert likelihood.log_likelihood(law.log_scale + 1e-3 * step_m, u) <= best + 1e-6


def test_the_likelihoods_derivatives_match_its_differences() -> None:
    """The gradient and Hessian the fit steps by are those of the likelihood (central differences, 1e-4)."""
    done, running = cohort(2, cut_tokens=600, draw=lognormal(sigma=1.0, mean_tokens=434.0))
    table = life_table(WindowObservations(completed=LengthHistogram.from_samples(done), censored=hist(running)))
    likelihood = LogNormalLikelihood.of(table, span=table.events.size)
    assert likelihood is not None
    h = 1e-4
    for m, u in ((5.5, -0.5), (6.0, 0.0), (7.0, 0.7)):
        value, gradient, hessian = likelihood.log_likelihood_terms(m, u)
        assert value == likelihood.log_likelihood(m, u)
        difference = np.array([likelihood.log_likelihood(m + h, u) - likelihood.log_likelihood(m - h, u),
                               likelihood.log_likelihood(m, u + h) - likelihood.log_likelihood(m, u - h)]) / (2 * h)
        np.testing.assert_allclose(gradient, difference, rtol=1e-4, atol=1e-2)
        columns = [likelihood.log_likelihood_terms(m + h, u)[1] - likelihood.log_likelihood_terms(m - h, u)[1],
                   likelihood.log_likelihood_terms(m, u + h)[1] - likelihood.log_likelihood_terms(m, u - h)[1]]
        np.testing.assert_allclose(hessian, np.array(columns).T / (2 * h), rtol=1e-4, atol=1e-1)


def test_the_moments_past_the_curve_are_the_laws() -> None:
    """The law's own curve up to τ = 300, continued by the law: the moments of ⌈X⌉ (within 0.3%)."""
    law = LogNormalLaw(log_scale=5.8, shape=0.9)
    ages = np.arange(1, 301, dtype=np.float64)
    survival = stats.norm.sf((np.log(ages) - law.log_scale) / law.shape)
    mean, std = lognormal_tail_moments(survival, law)
    # ⌈X⌉'s moments by summation far into the tail: E = Σ_{t≥0} S(t), E[O²] = Σ (2t + 1)·S(t)
    t = np.arange(0, 2_000_000, dtype=np.float64)
    levels = stats.norm.sf((np.log(np.maximum(t, 1e-300)) - law.log_scale) / law.shape)
    true_mean = float(levels.sum())
    true_std = math.sqrt(float(((2.0 * t + 1.0) * levels).sum()) - true_mean * true_mean)
    assert mean == pytest.approx(true_mean, rel=3e-3) and std == pytest.approx(true_std, rel=3e-3)


def test_a_curve_that_ends_at_zero_needs_no_tail() -> None:
    done = np.array([3, 5, 5, 8, 13])
    survival = km_survival(life_table(WindowObservations(completed=LengthHistogram.from_samples(done))))
    mean, std = lognormal_tail_moments(survival, LogNormalLaw(log_scale=10.0, shape=2.0))
    assert mean == pytest.approx(done.mean()) and std == pytest.approx(done.std())


def test_the_constant_log_likelihood_by_hand() -> None:
    table = life_table(WindowObservations(completed=LengthHistogram.from_samples(np.array([1, 2, 2])),
                                          censored=hist([3])))
    # exposure: 4 at age 1, 3 at 2, 1 at 3; events 1, 2, 0: p = 3/8
    expected = 3 * math.log(3 / 8) + 5 * math.log(5 / 8)
    assert constant_log_likelihood(table, span=3) == pytest.approx(expected)
    assert constant_log_likelihood(table, span=0) == 0.0


# Laws whose hazard falls past the window's oldest ages. Continued at a constant hazard (the oldest ages'
# or all ages'), a cold window (512 slots, 20 seeds) had these medians / lowest values of μ̂_O / truth:
# log-normal σ 0.8 after 500 tokens 0.944 / 0.872, σ 1.0 after 300 0.883 / 0.693, σ 1.3 after 500 0.735 /
# 0.676, an even mixture of geometric laws of means 128 and 1,024 after 600 tokens 0.817 / 0.723. (σ 0.8
# after 300 tokens, where the fitted line often explains the window as well: 0.936 / 0.790, now 0.967 / 0.790.)
FALLING_PAST_THE_CURVE = [
    ("lognormal σ 0.8", lognormal(sigma=0.8, mean_tokens=434.0), 434.0, 500),
    ("lognormal σ 1.0", lognormal(sigma=1.0, mean_tokens=434.0), 434.0, 300),
    ("lognormal σ 1.3", lognormal(sigma=1.3, mean_tokens=434.0), 434.0, 500),
    ("geometric 128 / 1,024", mixture(geometric(128.0), geometric(1024.0), first_share=0.5), 576.0, 600),
]


@pytest.mark.parametrize(("law", "draw", "true_mean", "cut_tokens"), FALLING_PAST_THE_CURVE,
                         ids=[case[0] for case in FALLING_PAST_THE_CURVE])
def test_a_hazard_that_falls_past_the_curve_is_continued_by_the_lognormal_fit(
        law: str, draw: Draw, true_mean: float, cut_tokens: int) -> None:
    ratios, used = [], 0
    for seed in range(20):
        fit = _fit(*cohort(seed, cut_tokens=cut_tokens, draw=draw))
        used += fit.lognormal_tail
        ratios.append(fit.stats.mu_o_tokens / true_mean)
    assert float(np.median(ratios)) >= 0.97, (law, ratios)
    assert min(ratios) >= 0.85, (law, ratios)
    assert used >= 15, (law, used)


def test_a_constant_hazard_is_never_continued_by_the_lognormal_fit() -> None:
    """Geometric windows, where a log-normal fit continues the curve along a falling hazard to 2-5× the mean:
    the likelihood test keeps the constant hazard (none of 600 windows here; none of 1,200 with 200 seeds)."""
    for mean in (128.0, 1024.0):
        for cut_tokens in (int(0.4 * mean), int(mean), int(3 * mean)):
            for seed in range(100):
                fit = _fit(*cohort(seed, cut_tokens=cut_tokens, draw=geometric(mean)))
                assert not fit.lognormal_tail, (mean, cut_tokens, seed, fit.stats.mu_o_tokens)


def test_without_running_requests_the_fit_is_not_attempted() -> None:
    done = np.maximum(1, np.round(np.random.default_rng(1).lognormal(6.0, 1.2, size=4096))).astype(np.int64)
    fit = fit_hazard_histogram(LengthHistogram.from_samples(done), prompt_count=1, prompt_sum_tokens=512.0,
                               censored=hist([1]))
    assert fit is not None and not fit.lognormal_tail
    assert fit.stats.mu_o_tokens == pytest.approx(done.mean(), rel=1e-3)


def test_the_normal_cdf_matches_scipy_far_into_both_tails() -> None:
    """numpy-only ln Φ against scipy's: Φ within 1.2e-7 relative from −38 to 38, and the per-age hazard
    ln(S(t)/S(t − 1)) of a log-normal law within 1e-4 relative over its first 3,000 ages."""
    from scipy import special
    x = np.linspace(-38.0, 38.0, 20_001)
    assert float(np.abs(np.expm1(log_normal_cdf(x) - special.log_ndtr(x))).max()) < 1.2e-7
    z = (5.7 - np.log(np.arange(1.0, 3000.0))) / 0.8
    ours, theirs = np.diff(log_normal_cdf(z)), np.diff(special.log_ndtr(z))
    assert float(np.abs(ours / theirs - 1.0).max()) < 1e-4


def test_a_decision_from_a_lognormal_tail_is_flagged_and_reads_its_mean() -> None:
    """A pool's fit whose curve the log-normal law continues: the decision says so, and N̂* reads that μ_O."""
    from controlplane.core.policy import decide
    from controlplane.core.types import EngineLimits, Flag, Observations, PolicyConfig, PolicyState
    from controlplane.sim.profiles import H200_QWEN3_8B

    done, running = cohort(0, cut_tokens=500, draw=lognormal(sigma=1.3, mean_tokens=434.0))
    fit = _fit(done, running)
    assert fit.lognormal_tail and fit.stats.mu_o_tokens > done.mean()
    limits = EngineLimits(kv_capacity_tokens=2_000_000, max_num_seqs=4096, max_num_batched_tokens=16384,
                          max_model_len_tokens=32768)
    observations = Observations(costs=H200_QWEN3_8B, limits=limits, n_obs=512.0)
    config = PolicyConfig(min_samples=1, cooldown_s=0.0)
    decision, _ = decide(observations, PolicyState(), 0.0, config=config, fit=fit)
    assert Flag.HAZARD_LOGNORMAL_TAIL in decision.flags
    assert decision.diagnostics.mu_o_tokens == pytest.approx(fit.stats.mu_o_tokens)
    constant = replace(fit, lognormal_tail=False)
    decision, _ = decide(observations, PolicyState(), 0.0, config=config, fit=constant)
    assert Flag.HAZARD_LOGNORMAL_TAIL not in decision.flags
