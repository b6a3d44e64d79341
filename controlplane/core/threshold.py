"""Phase-switch threshold of exclusive batching: θ0 (CFR), the IFR correction Δθ, and θ̂*.

[EB] §3.2 ([EB] Prop. 3.1, [EB] Theorem 3.2). Pure functions, no I/O. Every function returns a finite
value for every input; degenerate input is handled by the documented fallback, never by raising.
"""

from __future__ import annotations

import math

# Below this u the series of e^u − 1 − u is used: expm1(u) − u cancels catastrophically for small u.
_SERIES_CUTOFF_U = 0.5
_SERIES_TERMS = 24
_MAX_NEWTON_STEPS = 200


def _exp_excess(u: float) -> float:
    """e^u − 1 − u, accurate to machine precision for every u ≥ 0."""
    if u >= _SERIES_CUTOFF_U:
        return math.expm1(u) - u
    term = u * u / 2.0
    total = 0.0
    for n in range(3, _SERIES_TERMS + 3):
        total += term
        term *= u / n
    return total


def solve_theta0(gamma: float) -> float:
    """Solve θ/(1−θ) + ln(1−θ) = γ for θ in (0, 1).

    With u = −ln(1−θ) the left side is e^u − 1 − u, strictly increasing and convex on u > 0 from 0 to
    ∞, so the root is unique for every γ > 0. Newton's method starts from an upper bound of the root
    (u ≤ √(2γ) because e^u − 1 − u ≥ u²/2, and u = ln(1 + γ + u) ≤ ln(1 + γ + √(2γ))) and therefore
    decreases monotonically to it; iteration stops when a step no longer decreases u, i.e. at machine
    precision.

    Args:
        gamma: p0·α_p/α_d, dimensionless.
    Returns:
        θ0 in (0, 1). Fallback: γ ≤ 0 or NaN → 0.0 (the caller clips and flags); γ = +inf → 1 − 2⁻⁵³.
    """
    if not gamma > 0.0:
        return 0.0
    if math.isinf(gamma):
        return 1.0 - 2.0**-53
    root_bound = math.sqrt(2.0 * gamma)
    u = min(root_bound, math.log1p(gamma + root_bound))
    for _ in range(_MAX_NEWTON_STEPS):
        slope = math.expm1(u)
        if slope <= 0.0:
            break
        step = (_exp_excess(u) - gamma) / slope
        if not step > 0.0:
            break
        u_next = u - step
        if u_next >= u or u_next <= 0.0:
            break
        u = u_next
    theta = -math.expm1(-u)
    return min(theta, 1.0 - 2.0**-53)


def theta0_residual(theta: float, gamma: float) -> float:
    """θ/(1−θ) + ln(1−θ) − γ, for checking a solution (0 at θ0)."""
    return theta / (1.0 - theta) + math.log1p(-theta) - gamma


def delta_theta_ifr(*, theta0: float, p0: float, eta: float, rho: float) -> float:
    """IFR correction of [EB] Theorem 3.2 ([EB] eq. (5)) for the linear hazard h(t) = p0 + η·t.

    Δθ = η(1−θ0)²/(p0²θ0) · [ζ(θ0/(1−θ0) − ζ/2) + ρ(ζ − θ0)], ζ = −ln(1−θ0), ρ = β_d·N/α_d.

    Both bracket terms are non-negative for θ0 in (0, 1), so Δθ ≥ 0 whenever η ≥ 0 and ρ ≥ 0.

    Args:
        theta0: the CFR threshold in (0, 1). p0: hazard intercept (per token). eta: hazard slope (per
        token²). rho: β_d·N_prev/α_d, dimensionless.
    Returns:
        Δθ ≥ 0. Fallback: 0.0 when θ0 ∉ (0, 1), p0 ≤ 0, η ≤ 0, ρ < 0 or any input is not finite;
        1.0 when the product overflows (the caller's clip to θ_max then bounds θ̂*).
    """
    if not (0.0 < theta0 < 1.0 and p0 > 0.0 and eta > 0.0 and rho >= 0.0):
        return 0.0
    if not all(math.isfinite(x) for x in (theta0, p0, eta, rho)):
        return 0.0
    zeta = -math.log1p(-theta0)
    bracket = zeta * (theta0 / (1.0 - theta0) - zeta / 2.0) + rho * (zeta - theta0)
    # Divide step by step: the product p0²·θ0 can underflow to 0 for tiny finite inputs.
    value = (eta / p0 / p0) * (1.0 - theta0) ** 2 * (bracket / theta0)
    if math.isnan(value):
        return 0.0
    if math.isinf(value):
        return 1.0
    return max(value, 0.0)


# The IFR strength ε = η/p0² beyond which the first-order correction is no longer trusted on its own
# (see bound_delta_theta).
MAX_IFR_STRENGTH = 1.0


def bound_delta_theta(delta_theta: float, *, theta0: float, p0: float, eta: float) -> tuple[float, bool]:
    """The IFR correction of [EB] Theorem 3.2, bounded where its expansion is out of its range.

    [EB] Theorem 3.2 is the first-order term of an expansion of θ* in the IFR strength ε = η/p0² (in units of
    the mean lifetime 1/p0 the hazard reads h/p0 = 1 + ε·p0·t): Δθ = ε·G(θ0, ρ), θ* = θ0 + Δθ + O(ε²).
    It is trusted when either
    - ε ≤ MAX_IFR_STRENGTH (1): the hazard grows by at most p0 over one mean lifetime, the regime of the
      expansion, however large ρ = β_d·N/α_d makes the correction (the paper's large-batch amplification); or
    - Δθ ≤ θ0: the first-order term is smaller than the term it corrects.
    When both fail the neglected O(ε²) terms are of unknown sign and as large as Δθ itself, and the
    correction is cut to max(θ0, G): its value at ε = 1, or θ0 when that is smaller. The cut is continuous
    and non-decreasing in η (no flapping at it). For small θ0 (ζ ≈ θ0 + θ0²/2, γ ≈ θ0²/2) the formula reads
    Δθ/θ0 ≈ ε·(1 + ρ)/2.

    Measured: stationary fits of the published set-ups have ε ≈ 0.2–1.3; a window mid-shift between two
    uniform workloads had p̂0 ≈ 1.6e-4, η̂ ≈ 2e-6 (ε ≈ 78, Δθ ≈ 200·θ0), which the θ clip alone turned into
    k ≈ 670 of N ≈ 845 against a steady k = 7; bounded it gives θ̂* ≈ 3.7·θ0.

    Args:
        delta_theta: Δθ from `delta_theta_ifr`. theta0: the CFR threshold (unclipped). p0, eta: the hazard
        intercept (per token) and slope (per token²) Δθ was computed from.
    Returns:
        (Δθ to use, whether the bound applied). Unchanged when any input is not finite, θ0 ∉ (0, 1), p0 ≤ 0
        or η ≤ 0 (the caller's θ clip then decides).
    """
    if not all(math.isfinite(x) for x in (delta_theta, theta0, p0, eta)):
        return delta_theta, False
    if not (0.0 < theta0 < 1.0 and p0 > 0.0 and eta > 0.0):
        return delta_theta, False
    strength = eta / p0 / p0
    if strength <= MAX_IFR_STRENGTH or delta_theta <= theta0:
        return delta_theta, False
    at_unit_strength = delta_theta * (MAX_IFR_STRENGTH / strength)
    return max(theta0, at_unit_strength), True


def clip_theta(theta: float, *, theta_min: float, theta_max: float) -> tuple[float, int]:
    """Clip θ to [θ_min, θ_max].

    Returns:
        (clipped θ, side) with side −1 when clipped up to θ_min, +1 when clipped down to θ_max, 0 when
        untouched. NaN clips to θ_min.
    """
    if not theta >= theta_min:
        return theta_min, -1
    if theta > theta_max:
        return theta_max, 1
    return theta, 0
