"""Phase-switch threshold of exclusive batching: θ0 (CFR), the IFR correction Δθ, and θ̂*.

EB paper §3.2 (Proposition 3.1, Theorem 3.2). Pure functions, no I/O. Every function returns a finite
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
    """IFR correction of Theorem 3.2 for the linear hazard h(t) = p0 + η·t.

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
