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
the window's exposure, `survival.life_table`). Maximised over (m, log s) by damped Newton steps with the
likelihood's analytic gradient and Hessian, from the events' mean age as the median; s is kept within
[MIN_SHAPE, MAX_SHAPE]. (A Nelder–Mead search over the same likelihood, 3× slower, stopped on the shape's
bound up to 2.3 nats below the maximum on windows of a few dozen requests.)

numpy only: the decision loop does not load scipy (40 MiB of a controller's RSS). log Φ comes from a
Chebyshev-fitted approximation of erfc in log form (fractional error below 1.2e-7 everywhere, no underflow
in the far tail), the optimiser is a two-dimensional Newton method of our own.

The moments past τ: conditional on surviving τ, with the partial moments
E[X^k·1{X > τ}] = exp(k·m + k²s²/2)·Φ((m + k·s² − ln τ)/s), summed over integer ages by the trapezoid rule.

The law's hazard line: `law_life_table` gives the life table a window's requests would show under the law once
they had all ended, which the hazard fit's line is fitted to when the law continues the curve
(`hazard.fit_hazard_histogram`).

Pure: no I/O, no clock. Cost O(span) per likelihood evaluation, five to ten Newton steps of one to three
evaluations each (1–2 ms for a span of 1,000–2,000 ages); spans beyond MAX_SPAN_TOKENS are not fitted.
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
# Newton's budget, the step below which it stops (on m and log s), and the shortest fraction of a step tried.
MAX_ITERATIONS = 60
PARAMETER_TOLERANCE = 1e-7
MIN_STEP_SCALE = 1e-8


@dataclass(frozen=True, slots=True)
class LogNormalLaw:
    """X log-normal: ln X ~ Normal(log_scale, shape²); the output length is ⌈X⌉ tokens."""

    log_scale: float
    shape: float


@dataclass(frozen=True, eq=False, slots=True)
class LogNormalLikelihood:
    """log L(m, s) of a life table's ages 1..span (the module docstring), what `fit_lognormal` maximises.

    Holds the ages with anyone at risk (`index`, 1-based), their events and survivors n(t) − d(t), and ln t on
    the whole grid 1..span, so that ln S is evaluated once per age and read at t and t − 1. The shape enters
    as log s."""

    index: np.ndarray
    events: np.ndarray
    survivors: np.ndarray
    log_grid: np.ndarray
    mean_event_age: float

    @classmethod
    def of(cls, table: LifeTable, *, span: int) -> LogNormalLikelihood | None:
        """None when span is outside 1..MAX_SPAN_TOKENS or there is no event up to it."""
        span = min(span, table.events.size)
        if span < 1 or span > MAX_SPAN_TOKENS:
            return None
        kept = table.at_risk[:span] > 0.0
        events, at_risk = table.events[:span][kept], table.at_risk[:span][kept]
        if not events.sum() > 0.0:
            return None
        index = np.flatnonzero(kept) + 1
        return cls(index=index, events=events, survivors=at_risk - events,
                   log_grid=np.log(np.arange(1, span + 1, dtype=np.float64)),
                   mean_event_age=float(np.average(index.astype(np.float64), weights=events)))

    def _step(self, values: np.ndarray) -> np.ndarray:
        """f(t) − f(t − 1) at the kept ages, from f(1..span) on the grid and f(0) = 0."""
        grid = np.concatenate(([0.0], values))
        return grid[self.index] - grid[self.index - 1]

    def _log_stay(self, log_survival: np.ndarray) -> np.ndarray:
        """log(1 − h(t)) = ln S(t) − ln S(t − 1) < 0 at the kept ages, from ln S(1..span) (ln S(0) = 0)."""
        return np.minimum(self._step(log_survival), -1e-300)

    def _sum(self, log_stay: np.ndarray, expm1_stay: np.ndarray) -> float:
        """Σ d·ln h + (n − d)·ln(1 − h), from ln(1 − h) and its expm1 (= −h)."""
        return float((self.events * np.log(-expm1_stay) + self.survivors * log_stay).sum())

    def log_likelihood(self, log_scale: float, log_shape: float) -> float:
        """log L(m, s) of the module docstring, in nats (s = e^log_shape)."""
        z = (log_scale - self.log_grid) / math.exp(log_shape)
        log_stay = self._log_stay(log_normal_cdf(z))
        return self._sum(log_stay, np.expm1(log_stay))

    def log_likelihood_terms(self, log_scale: float, log_shape: float
                             ) -> tuple[float, np.ndarray, np.ndarray]:
        """log L with its gradient and Hessian in (m, log s).

        ln S(t) = ln Φ(z), z = (m − ln t)/s, has ∂/∂m = λ/s and ∂/∂log s = −z·λ, λ = φ(z)/Φ(z), and
        λ' = −λ·(z + λ). Per age, log L = d·ln(1 − e^ℓ) + r·ℓ with ℓ = ln S(t) − ln S(t − 1): dlog L/dℓ =
        r + d·e^ℓ/expm1(ℓ) and d²log L/dℓ² = −d·e^ℓ/expm1(ℓ)². (The gradient is that of the exact Φ; log L is
        that of the approximation, 1e-7 apart.)"""
        shape = math.exp(log_shape)
        z = (log_scale - self.log_grid) / shape
        log_cdf = log_normal_cdf(z)
        ratio = np.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_cdf)  # λ
        slope = -ratio * (z + ratio)  # λ'
        log_stay = self._log_stay(log_cdf)
        expm1_stay = np.expm1(log_stay)
        d_m, d_u = self._step(ratio) / shape, self._step(-z * ratio)
        d_mm = self._step(slope) / (shape * shape)
        d_mu = -self._step(z * slope + ratio) / shape
        d_uu = self._step(z * ratio + z * z * slope)
        away_from_zero = np.minimum(expm1_stay, -1e-150)
        odds = np.exp(log_stay) / away_from_zero
        first = self.survivors + self.events * odds
        second = -self.events * odds / away_from_zero
        gradient = np.array([(first * d_m).sum(), (first * d_u).sum()])
        cross = float((second * d_m * d_u + first * d_mu).sum())
        hessian = np.array([[(second * d_m * d_m + first * d_mm).sum(), cross],
                            [cross, (second * d_u * d_u + first * d_uu).sum()]])
        return self._sum(log_stay, expm1_stay), gradient, hessian


def fit_lognormal(table: LifeTable, *, span: int) -> tuple[LogNormalLaw, float] | None:
    """The log-normal law of largest likelihood for the table's ages 1..span (see the module docstring), and
    that log-likelihood in nats.

    None when there is no event up to span, span is beyond MAX_SPAN_TOKENS, or the fit is not finite.
    """
    likelihood = LogNormalLikelihood.of(table, span=span)
    if likelihood is None:
        return None
    start = (math.log(likelihood.mean_event_age), math.log(START_SHAPE))
    (m, log_s), best = _newton(likelihood, start)
    if not (math.isfinite(m) and math.isfinite(best)):
        return None
    return LogNormalLaw(log_scale=float(m), shape=math.exp(log_s)), best


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


def law_life_table(law: LogNormalLaw, *, requests: float) -> tuple[np.ndarray, np.ndarray]:
    """The life table `requests` requests of `law` would show if each were followed to its end: the events
    d(t) = R·(S(t − 1) − S(t)) and the at-risk counts n(t) = R·S(t − 1) at the ages t = 1..t95, t95 the law's
    95th percentile (at least 2 ages, at most MAX_SPAN_TOKENS). Expected counts, not a sample: a line fitted
    to them is the line a window of these requests would show once they had all ended."""
    log_t95 = min(law.log_scale + law.shape * _NORMAL_Z_95, math.log(MAX_SPAN_TOKENS))
    span = max(math.ceil(math.exp(log_t95)), 2)
    log_grid = np.log(np.arange(1, span + 1, dtype=np.float64))
    survival = np.exp(log_normal_cdf((law.log_scale - log_grid) / law.shape))
    before = np.concatenate(([1.0], survival[:-1]))
    return requests * np.maximum(before - survival, 0.0), requests * before


_NORMAL_Z_95 = 1.6448536269514722  # Φ⁻¹(0.95)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
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


def _ascent_step(gradient: np.ndarray, hessian: np.ndarray) -> np.ndarray | None:
    """The Levenberg–Marquardt step d = (μ·I − H)⁻¹·g with the least μ ≥ 0 (0, then doubling from 1e-6 of H's
    scale) that makes μ·I − H positive definite; None when H or g is not finite."""
    if not (np.all(np.isfinite(gradient)) and np.all(np.isfinite(hessian))):
        return None
    identity = np.eye(gradient.size)
    damping, floor = 0.0, 1e-6 * max(1.0, float(np.abs(np.diag(hessian)).max()))
    for _ in range(80):  # 2^80 · 1e-6 of H's scale outweighs any finite H
        system = damping * identity - hessian
        try:
            np.linalg.cholesky(system)
        except np.linalg.LinAlgError:
            damping = max(2.0 * damping, floor)
            continue
        return np.linalg.solve(system, gradient)
    return None


def _newton(likelihood: LogNormalLikelihood, start: tuple[float, float]) -> tuple[tuple[float, float], float]:
    """The maximum of log L over (m, log s), log s within [ln MIN_SHAPE, ln MAX_SHAPE], by damped Newton steps
    from `start` (log s clipped into the bounds): each step halved until log L does not fall; log s held while
    it sits on a bound its gradient pushes past. Stops when a step moves both by less than
    PARAMETER_TOLERANCE, when no step finds a log L as high, or after MAX_ITERATIONS: (the point, its log L)."""
    low, high = math.log(MIN_SHAPE), math.log(MAX_SHAPE)
    m, u = start[0], min(max(start[1], low), high)
    value, gradient, hessian = likelihood.log_likelihood_terms(m, u)
    for _ in range(MAX_ITERATIONS):
        free = np.array([True, not ((u <= low and gradient[1] < 0.0) or (u >= high and gradient[1] > 0.0))])
        step = _ascent_step(gradient[free], hessian[np.ix_(free, free)])
        if step is None:
            break
        direction = np.zeros(2)
        direction[free] = step
        scale = 1.0
        while scale >= MIN_STEP_SCALE:
            m_next = m + scale * float(direction[0])
            u_next = min(max(u + scale * float(direction[1]), low), high)
            value_next = likelihood.log_likelihood(m_next, u_next)
            if value_next >= value:
                break
            scale *= 0.5
        else:
            break
        moved = max(abs(m_next - m), abs(u_next - u))
        m, u = m_next, u_next
        value, gradient, hessian = likelihood.log_likelihood_terms(m, u)
        if moved < PARAMETER_TOLERANCE:
            break
    return (m, u), value
