"""Output-length hazard estimation ([EB] §3.4, online estimation).

`fit_hazard_histogram` estimates ĥ(t) = #{O = t} / #{O ≥ t} over a `LengthHistogram` of the output lengths
of finished, non-aborted requests (what the decision loop keeps per pool and time bucket) and fits
ĥ(t) = p0 + η·t by weighted least squares over t ∈ [1, t95]; it is O(distinct lengths + t95), vectorised
with numpy.

Weights: the at-risk count n(t) = #{O ≥ t}. ĥ(t) is a binomial proportion with variance
h(1−h)/n(t); for the small hazards of LLM outputs (h ≪ 1) h(1−h) is nearly constant over t, so n(t) is
the inverse variance up to a constant. It also makes the fit consistent with the geometric maximum
likelihood estimate (Σd(t)/Σn(t)) when η = 0, and down-weights the noisy tail where few requests are
left at risk.

Slope significance: the slope is kept only when it is at least SLOPE_SIGNIFICANCE_Z standard errors
from zero; otherwise the window is treated as constant-hazard and p0 is the weighted mean Σd(t)/Σn(t)
(the geometric maximum-likelihood estimate over [1, t95]). A free slope inflates the intercept's
variance about threefold for geometric data (2,000 samples: 95th-percentile error 6.8% with the free
slope, about 4% with the test), and an insignificant slope would only feed noise into Δθ.

Beyond the completions, the fit takes the running requests at the window's ends as censored and truncated
observations (`controlplane.core.survival`), and fits a window re-based at a shift as a transient
(`controlplane.loop.pool_stats`).

No I/O, no clock. Invalid samples (NaN, inf, ≤ 0, non-integral) never reach the fit: `LengthHistogram`
drops them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.lognormal_tail import (
    LogNormalLaw,
    constant_log_likelihood,
    fit_lognormal,
    law_life_table,
    lognormal_tail_moments,
)
from controlplane.core.survival import (
    LifeTable,
    WindowObservations,
    dense_events_and_exposure,
    geometric_mean_length,
    km_percentile,
    km_survival,
    length_moments,
    life_table,
    mean_lower_bound,
    oldest_band_hazard,
    sample_mean_lower_bound,
)
from controlplane.core.types import WorkloadStats

# Fewer than this many distinct t points with someone at risk cannot support a two-parameter fit.
MIN_FIT_POINTS = 2
# A slope within this many standard errors of 0 is not kept (see the module docstring).
SLOPE_SIGNIFICANCE_Z = 2.0
# The same test for a window re-based at a shift (`loop.pool_stats`), a few hundred completions: at z = 2 one
# fit in twenty keeps a slope a geometric law does not have, and the IFR correction it drives moved k̂* by
# 50-130% (the twin, H200, c = 2,048, geometric 128 → 1,024: k̂* 11-18 against a steady 7.6 in runs of
# consecutive refreshes). At z = 3 the slope of a uniform law is still kept from its first completions.
SHIFT_SLOPE_Z = 3.0
# And while such a window holds fewer than YOUNG_WINDOW_SAMPLES completions: at z = 3 a window of about a
# hundred completions at 10 completions/s (geometric 1,024 → 256, one engine end to end) still kept a slope
# in one refresh of fourteen, and k̂* went from 34 to 103 for that decision (`shift_slope_z`).
YOUNG_SLOPE_Z = 4.5
YOUNG_WINDOW_SAMPLES = 500
# The fit allocates O(t95) memory; beyond this span (far longer than any real output) it is not attempted
# and the geometric MLE fallback is used instead.
MAX_FIT_SPAN_TOKENS = 1 << 20
# The young band of a shift-transient window (`_young_hazard`): the ages by which this share of its
# completions have happened.
YOUNG_BAND_SHARE = 0.25
# `_lognormal_moments`: the log-likelihood, in nats, by which a fitted log-normal law must beat a constant
# hazard and a fitted line over a window's ages before its tail is considered (1 for a parameter, 3 of
# margin), and the highest level of the curve at its end for which it is fitted at all.
LOGNORMAL_MIN_GAIN = 4.0
LOGNORMAL_MAX_SURVIVAL = 0.6
# HazardFit.mu_o_lower_tokens: a one-sided bound at z = 3 (the true mean is below it with probability ≈ 0.13%
# for a window of a stationary workload).
MEAN_LOWER_BOUND_Z = 3.0
# The Kaplan–Meier curve enters the length moments only at ages with at least this many requests at risk
# (`_supported`).
KM_MIN_AT_RISK = 10
KM_CUT_SURVIVAL = 0.05


@dataclass(frozen=True, slots=True)
class HazardFit:
    """Result of a hazard fit: the workload stats and whether the intercept/slope needed a fallback.

    intercept_fallback: the WLS intercept was ≤ 0 or not finite; p0 was replaced by the geometric MLE
    1/μ_O and η by 0. slope_clipped: the WLS slope was negative (a DFR window); η was clipped to 0.
    shift_transient: fitted as a window re-based at a shift that still holds the requests in flight then
    (`fit_hazard_histogram`): η = 0 and μ_O = 1/p0. mu_o_lower_tokens: a lower confidence bound on the mean
    output length (MEAN_LOWER_BOUND_Z standard errors below the restricted mean, `survival.mean_lower_bound`;
    ≥ 1): what the window's completions and running requests prove about μ_O, for the cold-start rule.
    lognormal_tail: μ_O and σ_O continue the Kaplan–Meier curve past its last supported age by a fitted
    log-normal law instead of a constant hazard (`fit_hazard_histogram`, `_lognormal_moments`); p0 and η are
    then that law's line (`lognormal_tail.law_life_table`), not the line of the ages the window has seen.
    slope_sign: the sign of the slope the test found significant (+1, −1; 0: none), before the confirmation
    below. slope_unconfirmed: that slope was not kept because the window before (ending a bucket earlier) had no
    slope of its sign (`fit_hazard_histogram(slope_sign_before=)`): η = 0 and p0 the line's mean hazard.
    """

    stats: WorkloadStats
    intercept_fallback: bool
    slope_clipped: bool
    shift_transient: bool = False
    mu_o_lower_tokens: float = 1.0
    lognormal_tail: bool = False
    slope_sign: int = 0
    slope_unconfirmed: bool = False


def fit_hazard_histogram(
    outputs: LengthHistogram,
    *,
    prompt_count: int,
    prompt_sum_tokens: float,
    censored: LengthHistogram | None = None,
    truncated: LengthHistogram | None = None,
    shift_transient: bool = False,
    slope_z: float = SLOPE_SIGNIFICANCE_Z,
    slope_sign_before: int | None = None,
) -> HazardFit | None:
    """The hazard fit over a histogram of completions, optionally with censored and left-truncated requests.

    Without `censored` and `truncated` (and `shift_transient` False): the at-risk counts n(t) = #{O ≥ t} of the
    completions feed the weighted least squares over t ∈ [1, t95], t95 their inverted-CDF 95th percentile; μ_O
    and σ_O are their mean and (population) standard deviation. Fallbacks (flagged on the result): an
    intercept ≤ 0 → p0 = 1/μ_O, η = 0; a negative slope → η = 0. Fewer than MIN_FIT_POINTS at-risk t values,
    or t95 > MAX_FIT_SPAN_TOKENS → the geometric MLE p0 = 1/μ_O, η = 0 (intercept_fallback set). Cost
    O(distinct lengths + t95).

    With them, the events and at-risk counts are the window's life table (`controlplane.core.survival`):
    n(t) = #{O ≥ t} + #{censored ≥ t} − #{truncated ≥ t}, a Kaplan–Meier style hazard d(t)/n(t). Then:
    - the fit range ends at the Kaplan–Meier 95th percentile (the largest completed length when the curve
      does not fall to 5%), reported as t95;
    - the fallback hazard (no fit, or an intercept ≤ 0) is 1/μ̂ for the Kaplan–Meier mean μ̂ with a geometric
      tail of the same mean (`survival.geometric_mean_length`; the log-normal tail when it is used, below),
      which is 1/μ_O without censoring (events over
      exposure Σd/Σn when the curve never drops);
    - μ_O and σ_O are the moments of the Kaplan–Meier curve up to the last observed length (a restricted
      mean), continued beyond it by a fitted log-normal law when that law explains the window measurably
      better than a constant hazard and the fitted line (`_lognormal_moments`, `HazardFit.lognormal_tail`),
      else by a constant hazard (`survival.length_moments`): the hazard of the
      curve's oldest ages when it differs measurably from that of all ages (`survival.oldest_band_hazard`;
      the fallback's Kaplan–Meier mean uses it too), else p̂0, or under a fitted increasing hazard the
      window's events over exposure when higher (`_tail_hazard`): the completed mean would be
      length-biased low after a shift to longer outputs, and the KM curve alone cannot say what happens
      past the oldest running request.
    - when the log-normal law continues the curve, the line (p0, η) is fitted to the life table the window's
      requests would show under that law once they had all ended (`lognormal_tail.law_life_table`), with the
      same slope test and confirmation. The law continues the curve because its hazard bends past the ages
      seen; the line of those ages alone would carry their slope over the whole law. A window of the requests
      admitted since a shift to a log-normal law (σ 1, mean 1,024 tokens) sees only the young ages' rising
      hazard: k̂* went 18 → 39 → 57 → 63 → 42 → 26 → 17 over 8 s at 1,000 completions/s against a steady 17.8
      (`benchmarks/shift_e2e.py`); with the law's line 18.5 → 18.5 → 18.0 → 18.3 → 18.2 → 18.1 → 17.3.

    shift_transient: the window was re-based at a detected shift and still holds completions of requests
    that were in flight then (`core.survival.is_shift_transient`): a mixture of two laws, whose fitted slope is an
    artefact (the old requests' completions at later ages look like an increasing or decreasing hazard) and
    whose mean is dominated by the old requests. The fit then keeps the hazard of young requests, which are
    the new workload's, and stands for the new workload by the geometric law of that rate p̂0: η = 0 and
    μ_O = σ_O = 1/p̂0 (flagged on the result). Measured in a saturated engine (H200 costs, 256 requests in
    flight, 128 → 1,024 tokens of mean output, 20 seeds): the decision 300 completions after the shift was
    off by a median 54% instead of 469%. The young requests' hazard is the fitted line's intercept when it is
    measured (at least SLOPE_SIGNIFICANCE_Z standard errors above 0), else the life table's events over
    exposure at the youngest ages that hold YOUNG_BAND_SHARE of the window's completions (`_young_hazard`).
    An intercept extrapolated to age 0 from a steep, noisy slope fell to 0.7-7% of the new law's hazard (the
    twin at c = 2,048 after a shift to 8× longer outputs: decisions with k̂*·N̂* at 0% of its steady value);
    with the band the lowest of 572 transient fits over 3 seeds was 45% of it, and in the saturated engine
    the median error 300 completions after the shift is 45% (62% with the intercept alone).

    Args:
        outputs: final output lengths of the completions in the window.
        prompt_count / prompt_sum_tokens: the number and the sum of the prompt lengths of the window.
        censored: output lengths so far of the requests running when the window closed.
        truncated: output lengths of the requests already running when the window opened.
        shift_transient: see above.
        slope_z: the standard errors from 0 a slope must reach to be kept (SLOPE_SIGNIFICANCE_Z by default;
            a window re-based at a shift asks for SHIFT_SLOPE_Z, see there).
        slope_sign_before: the `slope_sign` of the window before (the pool's window ending a bucket earlier); when
            given, a significant slope of another sign is not kept (the line is fitted flat and
            `slope_unconfirmed` set): a slope must show in two windows in a row. None: every significant slope
            is kept. A window drifting as a new law mixes in shows a slope for one fit before its shift is
            confirmed (1,024 → 256 tokens at 1,000
            completions/s on four engines: k̂* 17.9 against 15.7, the first moved decision 47% off the new
            steady value; 2% with the confirmation, `benchmarks/shift_e2e.py`).
    Returns:
        The fit, or None when there is no completion or no prompt. Fallbacks as above.
        num_samples is the number of completions in the window.
    Raises:
        ValueError: prompt_count < 0, or a prompt sum that is not finite or below prompt_count (every prompt
            has at least one token).
    """
    if prompt_count < 0 or not (math.isfinite(prompt_sum_tokens) and prompt_sum_tokens >= prompt_count):
        raise ValueError(f"prompt statistics must have count ≥ 0 and a finite sum ≥ count, got count="
                         f"{prompt_count} sum={prompt_sum_tokens!r}")
    if outputs.count == 0 or prompt_count == 0:
        return None
    mu_l = prompt_sum_tokens / prompt_count
    table = line = None
    fitted: tuple[float, float] | None = None  # the log-normal tail's moments, when it is used
    lognormal_tail = False
    if censored is None and truncated is None:
        t95 = outputs.percentile(95.0)
        fit, sign, unconfirmed = None, 0, False
        if t95 <= MAX_FIT_SPAN_TOKENS:
            sums = _line_sums(*dense_events_and_exposure(WindowObservations(completed=outputs), t_max=int(t95)))
            fit, sign, unconfirmed = _confirmed_line(sums, slope_z=slope_z, slope_sign_before=slope_sign_before)
        fallback_p0 = 1.0 / outputs.mean()
        mu_o, sigma_o = outputs.mean(), outputs.std()
        lower = sample_mean_lower_bound(mean=mu_o, std=sigma_o, count=outputs.count, z=MEAN_LOWER_BOUND_Z)
    else:
        table = life_table(WindowObservations(completed=outputs, censored=censored, truncated=truncated))
        survival = km_survival(table)
        reached = km_percentile(survival, 95.0)
        t95 = float(reached if reached is not None else min(outputs.max_length(), table.last_age))
        events, at_risk = table.events[: int(t95)], table.at_risk[: int(t95)]
        line = _line_sums(events, at_risk)  # read again by a transient fit's intercept check
        fit, sign, unconfirmed = _confirmed_line(line, slope_z=slope_z, slope_sign_before=slope_sign_before)
        # The Kaplan–Meier mean with a geometric tail at the oldest ages' hazard when it differs measurably
        # from the average (`survival.oldest_band_hazard`), else the geometric law of the curve's own mean
        # (1/μ_O of the completions when nothing is censored). Not in a shift transient: its oldest ages
        # are the old law's requests that were in flight at the shift, whose hazard is not the new law's
        # (a saturated engine, uniform 512 -> 1,024, 20 seeds: 28.5% off 300 completions after the shift
        # with the band, 11.7% without).
        supported = _supported(survival, table)
        oldest = None if shift_transient else oldest_band_hazard(table, span=supported.size)
        km_mean = geometric_mean_length(survival) if oldest is None else length_moments(supported, p0=oldest)[0]
        # Past the curve, a fitted log-normal law instead when it explains the window measurably better than
        # both a constant hazard and the fitted line (`_lognormal_moments`); not in a shift transient.
        found = None if shift_transient else _lognormal_moments(table, supported, line=fit)
        if found is not None:
            fitted, law = found
            km_mean = fitted[0]
            # The line is then the law's, not that of the ages seen (see the docstring).
            requests = outputs.count + (censored.count if censored is not None else 0)
            fit, sign, unconfirmed = _confirmed_line(_line_sums(*law_life_table(law, requests=requests)),
                                                     slope_z=slope_z, slope_sign_before=slope_sign_before)
        fallback_p0 = 1.0 / km_mean if km_mean is not None else table.total_events / max(table.total_exposure, 1.0)
        if not fallback_p0 > 0.0:  # no completion inside the table's span
            fallback_p0 = 1.0 / outputs.mean()
        mu_o = sigma_o = math.nan
        lower = mean_lower_bound(table, z=MEAN_LOWER_BOUND_Z, survival=survival)
    p0, eta, intercept_fallback, slope_clipped = _checked_line(fit, fallback_p0=fallback_p0)
    p0 = min(p0, 1.0)
    if shift_transient:
        # p0 is the line's intercept when the line has a slope; an unmeasured one gives way to the young band
        if (table is not None and (eta != 0.0 or slope_clipped)
                and p0 < SLOPE_SIGNIFICANCE_Z * _intercept_std_error(line)):
            p0 = _young_hazard(events, at_risk) or p0
        eta, slope_clipped = 0.0, False
        mu_o = sigma_o = 1.0 / p0
    elif censored is not None or truncated is not None:
        tail = oldest if oldest is not None else _tail_hazard(p0, eta, table)
        mu_o, sigma_o = length_moments(supported, p0=tail)
        if fitted is not None:
            mu_o, sigma_o = fitted
            lognormal_tail = True
        if not (math.isfinite(mu_o) and mu_o > 0.0):
            mu_o, sigma_o = outputs.mean(), outputs.std()
    stats = WorkloadStats(
        p0=p0, eta=eta, mu_l_tokens=mu_l, mu_o_tokens=mu_o, sigma_o_tokens=sigma_o, t95_tokens=t95,
        num_samples=outputs.count,
    )
    return HazardFit(stats=stats, intercept_fallback=intercept_fallback, slope_clipped=slope_clipped,
                     shift_transient=shift_transient, mu_o_lower_tokens=lower, lognormal_tail=lognormal_tail,
                     slope_sign=sign, slope_unconfirmed=unconfirmed)


def _supported(survival: np.ndarray, table: LifeTable) -> np.ndarray:
    """The Kaplan–Meier curve, cut after the last age with at least KM_MIN_AT_RISK requests at risk when it
    still stands at KM_CUT_SURVIVAL or more there: past that age one completion moves the curve by a tenth
    or more, and the moments continue it by the constant tail hazard instead (`survival.length_moments`).
    A window of the requests admitted since a shift (`loop.pool_stats`) holds its oldest requests alone at
    its oldest ages: when the oldest of them completed, the curve fell to 0 there and μ̂_O to the ages
    observed (the twin, H200, c = 2,048, 128 → 1,024 tokens: μ̂_O 400-694 for a law of mean 1,024, one
    refresh in five). A window whose curve has run down to the last few requests is left whole: cutting
    those too moved N̂* after a shift to shorter outputs (the same twin, 1,024 → 256, 20 seeds: the 5% line
    after 578 new-law completions instead of 361)."""
    supported = np.nonzero(table.at_risk >= KM_MIN_AT_RISK)[0]
    if not supported.size or survival[supported[-1]] < KM_CUT_SURVIVAL:
        return survival
    return survival[: supported[-1] + 1]


def _lognormal_moments(table: LifeTable, supported: np.ndarray, line: tuple[float, float] | None
                       ) -> tuple[tuple[float, float], LogNormalLaw] | None:
    """(μ_O, σ_O) of the curve `supported` continued past its end τ by the log-normal law fitted to the
    table's ages up to τ (`core.lognormal_tail`), or None (the constant tail stays). The law is used when:
    - the curve stands between KM_CUT_SURVIVAL and LOGNORMAL_MAX_SURVIVAL at τ. Above, a two-parameter fit
      to less than 40% of the law is a guess past τ (an IFR window 200 tokens in, Ŝ(τ) ≈ 0.83: μ̂_O up to
      4.9× the truth, against 3.0× for the constant tail; a uniform 512–1,536 cohort 700 tokens in: a median
      0.88×). Below, the curve has run down to its last few requests and the tail weighs little (a full
      window at steady state: no fit to pay for);
    - its log-likelihood over those ages beats, by LOGNORMAL_MIN_GAIN, both the constant hazard of largest
      likelihood and the window's fitted line `line` (p0, η) when it has a slope. A geometric law's window
      continued along a log-normal's falling hazard reaches 2–5× its mean (0 of 1,200 cold windows pass the
      test); under an IFR law the line is the law (the log-normal's tail cost 15% of μ̂_O 500 tokens into a
      cold window before the line was compared).
    Why: the constant tail is short wherever the hazard falls past τ, a log-normal law past its mode or a
    mixture of a short and a long workload (`benchmarks/lognormal_tail.py`: cold windows of σ 1.3 at a median
    0.65–0.81× the truth, of a geometric 128 / 1,024 mixture at 0.64–0.94×), and long under a hazard that
    keeps rising (a uniform law's cohort: 1.13–1.35×). The log-normal law follows both as far as the window
    shows them.
    """
    span = supported.size
    if not (span and KM_CUT_SURVIVAL <= supported[-1] <= LOGNORMAL_MAX_SURVIVAL):
        return None
    found = fit_lognormal(table, span=span)
    if found is None:
        return None
    law, fitted = found
    if fitted - constant_log_likelihood(table, span=span) < LOGNORMAL_MIN_GAIN:
        return None
    if line is not None and line[1] > 0.0:
        hazard = np.clip(line[0] + line[1] * np.arange(1, span + 1, dtype=np.float64), 1e-12, 1.0 - 1e-12)
        events, at_risk = table.events[:span], table.at_risk[:span]
        if fitted - float((events * np.log(hazard) + (at_risk - events) * np.log1p(-hazard)).sum()) \
                < LOGNORMAL_MIN_GAIN:
            return None
    moments = lognormal_tail_moments(supported, law)
    return (moments, law) if math.isfinite(moments[0]) and moments[0] > 0.0 else None


def _tail_hazard(p0: float, eta: float, table: LifeTable) -> float:
    """The constant hazard that continues the Kaplan–Meier curve past its last observed age.

    p̂0, except under a fitted increasing hazard (η̂ > 0), where the events over exposure of the whole table
    are used when higher: an increasing hazard past the last age is at least its exposure-weighted mean over
    the ages observed, so that rate still gives a mean no shorter than the truth (conservative for memory),
    while the intercept is an extrapolation to age 0 that a steep, noisy slope takes towards 0. Measured:
    at a cold start (WildChat turns on the RTX PRO 6000, c = 2,048) one refresh fitted p̂0 = 5.4e-5 under
    η̂ = 1.5e-5; the tail at p̂0 made μ̂_O 10,482 tokens for a law of mean 434, and N̂* 1."""
    if eta > 0.0 and table.total_exposure > 0.0:
        return max(p0, table.total_events / table.total_exposure)
    return p0


def _intercept_std_error(sums: _LineSums | None) -> float:
    """Standard error of the WLS line's intercept (`_wls_from_sums`) under the binomial model:
    √(h̄(1 − h̄)·(1/Σn + t̄²/S_tt)); inf when the line is under-determined (sums None)."""
    if sums is None:
        return math.inf
    return math.sqrt(sums.binomial_variance * (1.0 / sums.sum_w + sums.t_mean * sums.t_mean / sums.s_tt))


def _young_hazard(events: np.ndarray, at_risk: np.ndarray) -> float | None:
    """Events over exposure at the ages 1..a, a the smallest age by which YOUNG_BAND_SHARE of the events
    have happened (None when there is no event or no exposure there). Never an extrapolation."""
    cumulative = np.cumsum(events)
    if not cumulative.size or not cumulative[-1] > 0.0:
        return None
    band = int(np.searchsorted(cumulative, YOUNG_BAND_SHARE * cumulative[-1])) + 1
    exposure = float(at_risk[:band].sum())
    if not exposure > 0.0:
        return None
    return min(float(cumulative[band - 1]) / exposure, 1.0)


def _checked_line(fit: tuple[float, float] | None, *, fallback_p0: float) -> tuple[float, float, bool, bool]:
    """(p0, η, intercept_fallback, slope_clipped) after the fallbacks of `fit_hazard_histogram`."""
    if fit is None:
        return fallback_p0, 0.0, True, False
    p0, eta = fit
    if not (math.isfinite(p0) and p0 > 0.0 and math.isfinite(eta)):
        return fallback_p0, 0.0, True, False
    if eta < 0.0:
        return p0, 0.0, False, True
    return p0, eta, False, False


@dataclass(frozen=True, slots=True)
class _LineSums:
    """The weighted sums of the hazard line's least squares over the ages with someone at risk."""

    t: np.ndarray  # ages
    weights: np.ndarray  # n(t)
    hazard: np.ndarray  # d(t)/n(t)
    sum_w: float
    t_mean: float
    h_mean: float
    s_tt: float  # Σ n(t)·(t − t̄)²

    @property
    def binomial_variance(self) -> float:
        """h̄(1 − h̄), the variance of one at-risk token's outcome under the binomial model."""
        return max(self.h_mean * (1.0 - self.h_mean), 0.0)


def _line_sums(completions: np.ndarray, at_risk: np.ndarray) -> _LineSums | None:
    """The sums of the line d(t)/n(t) = p0 + η·t over t = 1..len, weights n(t); None when under-determined
    (fewer than MIN_FIT_POINTS ages at risk, or S_tt ≤ 0)."""
    t_max = completions.size
    t = np.arange(1, t_max + 1, dtype=np.float64)
    used = at_risk > 0
    if np.count_nonzero(used) < MIN_FIT_POINTS:
        return None
    t = t[used]
    weights = at_risk[used].astype(np.float64)
    hazard = completions[used] / weights
    sum_w = weights.sum()
    t_mean = float((weights * t).sum() / sum_w)
    h_mean = float((weights * hazard).sum() / sum_w)
    dt = t - t_mean
    s_tt = float((weights * dt * dt).sum())
    if s_tt <= 0.0:
        return None
    return _LineSums(t=t, weights=weights, hazard=hazard, sum_w=float(sum_w), t_mean=t_mean, h_mean=h_mean,
                     s_tt=s_tt)


def _wls_from_sums(sums: _LineSums | None, *, slope_z: float = SLOPE_SIGNIFICANCE_Z) -> tuple[float, float] | None:
    """Fit ĥ(t) = d(t)/n(t) = p0 + η·t from the weighted sums of `_line_sums` (None when under-determined):
    (p0, η); a slope under slope_z standard errors from 0 is not kept."""
    if sums is None:
        return None
    t_mean, h_mean = sums.t_mean, sums.h_mean
    dt = sums.t - t_mean
    eta = float((sums.weights * dt * (sums.hazard - h_mean)).sum() / sums.s_tt)
    # Var(η̂) = Σ n(t)·(t − t̄)²·h(1−h) / s_tt² ≈ h̄(1−h̄)/s_tt under the binomial model.
    eta_std_error = math.sqrt(sums.binomial_variance / sums.s_tt)
    if abs(eta) < slope_z * eta_std_error:
        return h_mean, 0.0
    return h_mean - eta * t_mean, eta


def _confirmed_line(sums: _LineSums | None, *, slope_z: float,
                    slope_sign_before: int | None) -> tuple[tuple[float, float] | None, int, bool]:
    """(the line of `_wls_from_sums`, the sign of its significant slope, whether that slope was dropped): a
    significant slope whose sign differs from slope_sign_before (when given) gives way to the flat line."""
    fit = _wls_from_sums(sums, slope_z=slope_z)
    sign = 0 if fit is None else (fit[1] > 0.0) - (fit[1] < 0.0)
    if sums is None or slope_sign_before is None or sign in (0, slope_sign_before):
        return fit, sign, False
    return (sums.h_mean, 0.0), sign, True


def shift_slope_z(num_completed: int) -> float:
    """The slope test of a window re-based at a shift holding num_completed completions: YOUNG_SLOPE_Z standard
    errors below YOUNG_WINDOW_SAMPLES, SHIFT_SLOPE_Z from there."""
    return YOUNG_SLOPE_Z if num_completed < YOUNG_WINDOW_SAMPLES else SHIFT_SLOPE_Z
