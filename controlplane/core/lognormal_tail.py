"""A censored log-normal fit of a window's life table, and the length moments it gives past the curve.

Why: the moments of a window's output length read the Kaplan–Meier curve up to its last supported age τ
and must assume a law beyond it (`survival.length_moments`). A constant hazard there (the hazard of the
curve's oldest ages, `survival.oldest_band_hazard`) is long for a law whose hazard keeps rising, and short
for one whose hazard falls past τ: a log-normal law past its hazard's mode, a mixture of a short and a long
workload. Measured on cold windows of 512 requests (`tests/unit/test_lognormal_tail.py`): the constant tail
put μ̂_O at a median 0.94× the truth for a log-normal law of σ 0.8 after 300 tokens, 0.74× for σ 1.3 after
500, and 0.64× for an even mixture of geometric laws of means 128 and 1,024 after 300. A log-normal law fitted
to the same life table continues the curve along a hazard that falls past its mode.

The fit: the discrete-time likelihood of the life table under O = ⌈X⌉, X log-normal with log-scale m and
shape s, i.e. the hazard h(t) = 1 − S(t)/S(t − 1), S(t) = P(X > t) = Φ((m − ln t)/s):

    log L(m, s) = Σ_t d(t)·log h(t) + (n(t) − d(t))·log(1 − h(t))

over the ages 1..span with anyone at risk. It holds for censored and left-truncated requests alike (n(t) is
the window's exposure, `survival.life_table`). Maximised by Nelder–Mead over (m, log s) from the events'
mean age; s is kept within [MIN_SHAPE, MAX_SHAPE].

numpy only: the decision loop does not load scipy (40 MiB of a controller's RSS). log Φ comes from a
Chebyshev-fitted approximation of erfc in log form (fractional error below 1.2e-7 everywhere, no underflow
in the far tail), the optimiser is a plain Nelder–Mead in two dimensions.

The moments past τ: conditional on surviving τ, with the partial moments
E[X^k·1{X > τ}] = exp(k·m + k²s²/2)·Φ((m + k·s² − ln τ)/s), summed over integer ages by the trapezoid rule.

Pure: no I/O, no clock. Cost O(span) per likelihood evaluation, one to three hundred evaluations (2–8 ms
for a span of 1,000–2,000 ages); spans beyond MAX_SPAN_TOKENS are not fitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.core.survival import LifeTable, restricted_sums

# The shape s is fitted within these bounds: below, the law is a spike (a length every request shares);
# above, the tail's second moment exp(2m + 2s²) overflows any memory it could be compared with.
MIN_SHAPE = 0.05
MAX_SHAPE = 3.0
# Longest life table fitted (the likelihood is evaluated at every age with anyone at risk).
MAX_SPAN_TOKENS = 1 << 16
# The fit starts from the events' mean age as the median and this shape.
START_SHAPE = 0.8
# Nelder–Mead's first steps, budget and tolerances (on m and log s, and on the log-likelihood).
START_STEP = 0.25
MAX_EVALUATIONS = 800
PARAMETER_TOLERANCE = 1e-4
LIKELIHOOD_TOLERANCE = 1e-4


@dataclass(frozen=True, slots=True)
class LogNormalLaw:
    """X log-normal: ln X ~ Normal(log_scale, shape²); the output length is ⌈X⌉ tokens."""

    log_scale: float
    shape: float


@dataclass(frozen=True, eq=False, slots=True)
class _Ages:
    """The ages 1..span of a life table with anyone at risk: events, survivors n(t) − d(t), ln t, ln(t − 1)."""

    events: np.ndarray
    survivors: np.ndarray
    log_ages: np.ndarray
    log_before: np.ndarray
    first: np.ndarray
    mean_event_age: float

    @classmethod
    def of(cls, table: LifeTable, *, span: int) -> _Ages | None:
        """None when span is outside 1..MAX_SPAN_TOKENS or there is no event up to it."""
        span = min(span, table.events.size)
        if span < 1 or span > MAX_SPAN_TOKENS:
            return None
        kept = table.at_risk[:span] > 0.0
        events, at_risk = table.events[:span][kept], table.at_risk[:span][kept]
        ages = np.arange(1, span + 1, dtype=np.float64)[kept]
        if not events.sum() > 0.0:
            return None
        return cls(events=events, survivors=at_risk - events, log_ages=np.log(ages),
                   log_before=np.log(np.maximum(ages - 1.0, 1.0)), first=ages <= 1.0,
                   mean_event_age=float(np.average(ages, weights=events)))

    def log_likelihood(self, log_scale: float, shape: float) -> float:
        """log L(m, s) of the module docstring, in nats."""
        log_survival = log_normal_cdf((log_scale - self.log_ages) / shape)
        log_survival_before = np.where(self.first, 0.0, log_normal_cdf((log_scale - self.log_before) / shape))
        log_stay = np.minimum(log_survival - log_survival_before, -1e-300)  # log(1 − h(t)) < 0
        return float((self.events * np.log(-np.expm1(log_stay)) + self.survivors * log_stay).sum())


def _shape(log_shape: float) -> float:
    return min(max(math.exp(log_shape), MIN_SHAPE), MAX_SHAPE)


def fit_lognormal(table: LifeTable, *, span: int) -> tuple[LogNormalLaw, float] | None:
    """The log-normal law of largest likelihood for the table's ages 1..span (see the module docstring), and
    that log-likelihood in nats.

    None when there is no event up to span, span is beyond MAX_SPAN_TOKENS, or the fit is not finite.
    """
    ages = _Ages.of(table, span=span)
    if ages is None:
        return None
    (m, log_s), best = _nelder_mead(lambda m, log_s: -ages.log_likelihood(m, _shape(log_s)),
                                    (math.log(ages.mean_event_age), math.log(START_SHAPE)))
    if not (math.isfinite(m) and math.isfinite(best)):
        return None
    return LogNormalLaw(log_scale=m, shape=_shape(log_s)), -best


def constant_log_likelihood(table: LifeTable, *, span: int) -> float:
    """log L of the constant hazard of largest likelihood over the same ages: D·ln p + (E − D)·ln(1 − p), with
    p = D/E the events over exposure (0 when there is no event, or when every request at risk ended)."""
    span = min(span, table.events.size)
    events, exposure = float(table.events[:span].sum()), float(table.at_risk[:span].sum())
    if not (0.0 < events < exposure):
        return 0.0
    p = events / exposure
    return events * math.log(p) + (exposure - events) * math.log1p(-p)


def lognormal_tail_moments(survival: np.ndarray, law: LogNormalLaw) -> tuple[float, float]:
    """(mean, standard deviation) of the output length, in tokens: Ŝ(t) for t = 1..τ (τ = survival.size),
    continued past τ by `law` conditioned on surviving τ. With Ŝ(τ) = 0 these are the curve's own moments.
    NaN when the law's conditional moments at τ are not finite."""
    first, second, s_tau = restricted_sums(survival)
    if s_tau > 0.0:
        tau = float(max(survival.size, 1))
        m, s = law.log_scale, law.shape
        log_tau = math.log(tau)
        log_beyond = float(log_normal_cdf((m - log_tau) / s))  # log P(X > τ)
        try:
            # E[X^k | X > τ] for k = 1, 2
            moment1 = math.exp(m + s * s / 2.0 + float(log_normal_cdf((m + s * s - log_tau) / s)) - log_beyond)
            moment2 = math.exp(2.0 * m + 2.0 * s * s + float(log_normal_cdf((m + 2.0 * s * s - log_tau) / s))
                               - log_beyond)
        except OverflowError:
            return math.nan, math.nan
        # ∫_τ^∞ P(X > u | X > τ) du and ∫_τ^∞ 2u·P(X > u | X > τ) du; integer ages past τ by the trapezoid rule
        area1 = max(moment1 - tau, 0.0)
        area2 = max(moment2 - tau * tau, 0.0)
        first += s_tau * max(area1 - 0.5, 0.0)
        second += s_tau * max(area2 + area1 - (tau + 0.5), 0.0)
    if not (math.isfinite(first) and math.isfinite(second)):
        return math.nan, math.nan
    return first, math.sqrt(max(second - first * first, 0.0))


# erfc(z) ≈ t·exp(−z² + P(t)), t = 1/(1 + z/2), z ≥ 0: the coefficients of P, constant term first.
_ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                      1.48851587, -0.82215223, 0.17087277)


def _log_erfc(z: np.ndarray | float) -> np.ndarray:
    """ln erfc(z) for z ≥ 0, elementwise (fractional error of erfc below 1.2e-7)."""
    z = np.asarray(z, dtype=np.float64)
    t = 1.0 / (1.0 + 0.5 * z)
    series = np.zeros_like(t)
    for coefficient in reversed(_ERFC_COEFFICIENTS):
        series = series * t + coefficient
    return np.log(t) - z * z + series


def log_normal_cdf(x: np.ndarray | float) -> np.ndarray:
    """ln Φ(x) of the standard normal distribution, elementwise (numpy only; see the module docstring).

    Φ(x) = erfc(−x/√2)/2: for x ≤ 0 the log form above, which holds far into the tail; for x > 0,
    ln(1 − erfc(x/√2)/2)."""
    x = np.asarray(x, dtype=np.float64)
    log_small = _log_erfc(np.abs(x) / math.sqrt(2.0)) - math.log(2.0)  # ln Φ(−|x|)
    return np.where(x <= 0.0, log_small, np.log1p(-np.exp(log_small)))


def _nelder_mead(objective, start: tuple[float, float]) -> tuple[tuple[float, float], float]:
    """The minimum of objective(a, b) by Nelder–Mead (reflection 1, expansion 2, contraction ½, shrink ½)
    from `start` with steps START_STEP, until the simplex spans less than PARAMETER_TOLERANCE and its values
    less than LIKELIHOOD_TOLERANCE, or MAX_EVALUATIONS: (the best point, its value)."""
    points = np.array([start, (start[0] + START_STEP, start[1]), (start[0], start[1] + START_STEP)])
    values = np.array([objective(*point) for point in points])
    evaluations = 3
    while evaluations < MAX_EVALUATIONS:
        order = np.argsort(values)
        points, values = points[order], values[order]
        if (float(np.abs(points[1:] - points[0]).max()) <= PARAMETER_TOLERANCE
                and float(values[-1] - values[0]) <= LIKELIHOOD_TOLERANCE):
            break
        centroid = points[:2].mean(axis=0)
        reflected = centroid + (centroid - points[2])
        value = objective(*reflected)
        evaluations += 1
        if value < values[0]:
            expanded = centroid + 2.0 * (centroid - points[2])
            expanded_value = objective(*expanded)
            evaluations += 1
            points[2], values[2] = (expanded, expanded_value) if expanded_value < value else (reflected, value)
        elif value < values[1]:
            points[2], values[2] = reflected, value
        else:
            inside = value >= values[2]
            contracted = centroid + 0.5 * ((points[2] if inside else reflected) - centroid)
            contracted_value = objective(*contracted)
            evaluations += 1
            if contracted_value < min(value, values[2]):
                points[2], values[2] = contracted, contracted_value
            else:  # shrink towards the best point
                points[1:] = points[0] + 0.5 * (points[1:] - points[0])
                values[1:] = [objective(*point) for point in points[1:]]
                evaluations += 2
    best = int(np.argmin(values))
    return (float(points[best, 0]), float(points[best, 1])), float(values[best])
