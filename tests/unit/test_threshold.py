"""θ0 (Proposition 3.1), the IFR correction Δθ (Theorem 3.2) and the θ clip.

Expected values are computed independently in the tests: the residual of θ/(1−θ) + ln(1−θ) = γ is
evaluated exactly in decimal arithmetic, the small-γ asymptotics come from the series
Ψ(θ) = Σ_{n≥2} (1 − 1/n)·θⁿ = θ²/2 + 2θ³/3 + …, and Δθ is re-derived from the printed formula.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.core.batch_size import memory_safe_batch_size, threshold_k
from controlplane.core.policy import evaluate
from controlplane.core.threshold import (
    MAX_IFR_STRENGTH,
    bound_delta_theta,
    clip_theta,
    delta_theta_ifr,
    solve_theta0,
    theta0_residual,
)
from controlplane.core.types import CostModel, EngineLimits, Flag, PolicyConfig, WorkloadStats
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B

# The published calibrations (eb-vllm, Qwen3-8B; examples/calibrations/), shared with the twin.
H200 = H200_QWEN3_8B
RTX_PRO_6000 = RTX_PRO_6000_QWEN3_8B
LARGEST_BELOW_ONE = 1.0 - 2.0**-53


def exact_psi(theta: float) -> Decimal:
    """Ψ(θ) = θ/(1−θ) + ln(1−θ) of the double θ, in decimal arithmetic with enough digits.

    The two terms cancel to θ²/2 for small θ, so the precision grows with the number of leading zeros.
    """
    leading_zeros = max(0, -math.floor(math.log10(theta)))
    with localcontext() as ctx:
        ctx.prec = 50 + 2 * leading_zeros
        t = Decimal(theta)
        one = Decimal(1)
        return t / (one - t) + (one - t).ln()


def relative_residual(theta: float, gamma: float) -> float:
    with localcontext() as ctx:
        ctx.prec = 60
        return float(abs(exact_psi(theta) - Decimal(gamma)) / Decimal(gamma))


# ---------------------------------------------------------------------------------------------- θ0


@pytest.mark.parametrize("costs", [H200, RTX_PRO_6000], ids=["H200", "RTX_PRO_6000"])
@pytest.mark.parametrize("mu_o", [20.0, 128.0, 256.0, 512.0, 4000.0])
def test_theta0_solves_the_cfr_equation_for_published_costs(costs: CostModel, mu_o: float) -> None:
    gamma = (1.0 / mu_o) * costs.alpha_p_s / costs.alpha_d_s
    theta = solve_theta0(gamma)
    assert 0.0 < theta < 1.0
    # Exact residual: θ is the root to within rounding of θ itself (condition number ≈ 2 here).
    assert relative_residual(theta, gamma) < 2e-15
    # The same residual in plain double arithmetic and via the module: the two terms cancel, so the
    # bound is rounding relative to the size of θ/(1−θ), not of γ.
    plain = theta / (1.0 - theta) + math.log1p(-theta) - gamma  # ln(1−θ) without rounding 1−θ
    scale = theta / (1.0 - theta)
    assert abs(plain) <= 4e-16 * scale
    assert abs(theta0_residual(theta, gamma)) <= 4e-16 * scale


@pytest.mark.parametrize(
    ("theta", "gamma"),
    [
        (0.5, 1.0 - math.log(2.0)),  # 0.5/0.5 + ln 0.5
        (0.9, 9.0 - math.log(10.0)),  # 0.9/0.1 + ln 0.1
        (0.25, 1.0 / 3.0 + math.log(0.75)),
        (0.99, 99.0 - math.log(100.0)),
    ],
)
def test_theta0_hand_derived_roots(theta: float, gamma: float) -> None:
    # Near θ = 0.99 the root is 100× more sensitive to γ's rounding (dθ/dγ = (1−θ)²/θ).
    assert solve_theta0(gamma) == pytest.approx(theta, rel=1e-13)


@pytest.mark.parametrize("gamma", [1e-8, 1e-12, 1e-20, 1e-60, 1e-150, 1e-300])
def test_theta0_small_gamma_asymptotics(gamma: float) -> None:
    # γ = θ²/2 + 2θ³/3 + 3θ⁴/4 + … inverts to θ = s − 2s²/3 + 13s³/36 + …, s = √(2γ).
    s = math.sqrt(2.0 * gamma)
    theta = solve_theta0(gamma)
    assert abs(theta / s - 1.0) <= s + 4e-16
    assert abs(theta - (s - 2.0 * s * s / 3.0)) <= 0.5 * s**3 + 4e-16 * s


def test_theta0_large_gamma_approaches_one() -> None:
    # For large γ, θ/(1−θ) dominates: 1 − θ ≈ 1/(γ + ln γ + 1).
    gamma = 1e6
    theta = solve_theta0(gamma)
    assert 1.0 - theta == pytest.approx(1.0 / (gamma + math.log(gamma) + 1.0), rel=1e-6)
    assert relative_residual(theta, gamma) < 1e-9  # condition number ≈ γ


@pytest.mark.parametrize(
    ("gamma", "expected"),
    [(0.0, 0.0), (-1.0, 0.0), (-math.inf, 0.0), (math.nan, 0.0), (math.inf, LARGEST_BELOW_ONE)],
)
def test_theta0_fallbacks(gamma: float, expected: float) -> None:
    assert solve_theta0(gamma) == expected


ROOT_ULPS = 4
gammas = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)
log_gammas = st.floats(min_value=-300.0, max_value=300.0).map(lambda x: 10.0**x)


def _ulps_away(theta: float, direction: float, count: int) -> float:
    for _ in range(count):
        theta = math.nextafter(theta, direction)
    return theta


@settings(max_examples=300, deadline=None)
@given(gamma=st.one_of(gammas, log_gammas))
@example(gamma=0.0021009999845082073)  # the root is 3 ulps above the θ returned
def test_theta0_exists_unique_and_is_within_a_few_ulps_of_the_root(gamma: float) -> None:
    theta = solve_theta0(gamma)
    assert 0.0 < theta < 1.0
    # Ψ is strictly increasing (Lemma in App. B): the exact root lies between the doubles ROOT_ULPS
    # either side of θ, unless θ is already the largest double below 1. Newton's last step in u and the
    # conversion θ = 1 − e^(−u) each round, and Ψ in doubles cannot tell neighbouring θ apart (an ulp of θ
    # moves Ψ by one or two of its ulps, its own rounding error), so the root is not always the nearest
    # double: 1 case in about 6,000 random γ is 3 ulps off.
    below = _ulps_away(theta, 0.0, ROOT_ULPS)
    assert exact_psi(below) < Decimal(gamma)
    above = _ulps_away(theta, 1.0, ROOT_ULPS)
    if above < 1.0:
        assert exact_psi(above) > Decimal(gamma)
    else:
        assert gamma > 1e15  # θ0 reaches the last doubles below 1 only when 1 − θ0 ≈ 1/γ is that small
    if gamma <= 10.0:  # well conditioned: the residual itself is at rounding level
        assert relative_residual(theta, gamma) < 4e-15


@settings(max_examples=200, deadline=None)
@given(a=st.one_of(gammas, log_gammas), b=st.one_of(gammas, log_gammas))
def test_theta0_is_monotone_in_gamma(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert solve_theta0(low) <= solve_theta0(high)


def test_theta0_strictly_increasing_on_a_grid() -> None:
    values = [solve_theta0(10.0**e) for e in range(-12, 13)]
    assert all(x < y for x, y in itertools.pairwise(values))


# --------------------------------------------------------------- paper properties via evaluate()


def _evaluate(*, mu_l: float = 512.0, mu_o: float = 256.0, max_num_seqs: int = 1024, costs=H200):
    workload = WorkloadStats(p0=1.0 / mu_o, eta=0.0, mu_l_tokens=mu_l, mu_o_tokens=mu_o)
    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=16384, kv_capacity_tokens=2_000_000)
    return evaluate(workload, costs, limits)


def test_theta0_independent_of_n_mu_l_and_betas() -> None:
    """(P1) scale invariance in N, (P2) insensitivity to μ_L, and no dependence on β_p, β_d."""
    reference = _evaluate().theta0
    assert reference > 0.0
    for max_num_seqs in (1, 16, 256, 4096):
        assert _evaluate(max_num_seqs=max_num_seqs).theta0 == reference
    for mu_l in (1.0, 64.0, 8192.0, 131072.0):
        assert _evaluate(mu_l=mu_l).theta0 == reference
    other_betas = CostModel(
        alpha_p_s=H200.alpha_p_s, beta_p_s_per_token=1e-3, alpha_d_s=H200.alpha_d_s,
        beta_d_s_per_request=7e-3, alpha_mb_s=H200.alpha_mb_s,
    )
    assert _evaluate(costs=other_betas).theta0 == reference
    # ... while it is exactly the root for γ = p0·α_p/α_d.
    assert reference == solve_theta0((1.0 / 256.0) * H200.alpha_p_s / H200.alpha_d_s)


@pytest.mark.parametrize("costs", [H200, RTX_PRO_6000], ids=["H200", "RTX_PRO_6000"])
def test_theta0_decreases_as_mu_o_grows(costs: CostModel) -> None:
    """(P3) θ0 decreases monotonically in μ_O (p0 = 1/μ_O)."""
    mu_os = [8.0, 32.0, 128.0, 256.0, 1024.0, 4096.0, 32768.0]
    thetas = [_evaluate(mu_o=mu_o, costs=costs).theta0 for mu_o in mu_os]
    assert all(a > b for a, b in itertools.pairwise(thetas))


# ---------------------------------------------------------------------------------------------- Δθ


def test_delta_theta_hand_computed_case() -> None:
    theta0, p0, eta, rho = 0.2, 1.0 / 256.0, 2e-5, 1.5
    zeta = -math.log(1.0 - theta0)  # 0.22314355131420976
    bracket = zeta * (theta0 / (1.0 - theta0) - zeta / 2.0) + rho * (zeta - theta0)
    expected = eta * (1.0 - theta0) ** 2 / (p0**2 * theta0) * bracket
    value = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho)
    assert value == pytest.approx(expected, rel=1e-13)
    # The same value evaluated in 50-digit decimal arithmetic, written out.
    assert value == pytest.approx(0.27516602439511161155, rel=1e-14)


def test_delta_theta_with_published_costs_and_rho_from_n() -> None:
    p0, eta, n = 1.0 / 512.0, 2e-5, 700
    theta0 = solve_theta0(p0 * H200.alpha_p_s / H200.alpha_d_s)
    rho = H200.beta_d_s_per_request * n / H200.alpha_d_s
    zeta = -math.log1p(-theta0)
    expected = (
        eta * (1.0 - theta0) ** 2 / (p0 * p0 * theta0)
        * (zeta * (theta0 / (1.0 - theta0) - zeta / 2.0) + rho * (zeta - theta0))
    )
    assert delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho) == pytest.approx(expected, rel=1e-12)
    assert expected > 0.0


def test_delta_theta_scaling_in_eta_p0_and_rho() -> None:
    """Δθ is linear in η, scales as 1/p0², and grows with ρ (the IFR effect amplifies with N)."""
    base = delta_theta_ifr(theta0=0.1, p0=1e-3, eta=1e-6, rho=2.0)
    assert delta_theta_ifr(theta0=0.1, p0=1e-3, eta=2e-6, rho=2.0) == pytest.approx(2.0 * base, rel=1e-14)
    assert delta_theta_ifr(theta0=0.1, p0=5e-4, eta=1e-6, rho=2.0) == pytest.approx(4.0 * base, rel=1e-14)
    assert delta_theta_ifr(theta0=0.1, p0=1e-3, eta=1e-6, rho=20.0) > base
    # Both bracket terms are positive: even ρ = 0 leaves a positive correction.
    assert delta_theta_ifr(theta0=0.1, p0=1e-3, eta=1e-6, rho=0.0) > 0.0


@settings(max_examples=300, deadline=None)
@given(
    theta0=st.floats(min_value=1e-12, max_value=1.0 - 1e-12, exclude_max=True),
    p0=st.floats(min_value=1e-12, max_value=1.0),
    eta=st.floats(min_value=1e-300, max_value=1e3, exclude_min=False),
    rho=st.floats(min_value=0.0, max_value=1e6),
)
def test_delta_theta_is_non_negative_for_positive_eta(theta0: float, p0: float, eta: float, rho: float) -> None:
    value = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho)
    assert math.isfinite(value)
    assert value >= 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"theta0": 0.0, "p0": 1e-3, "eta": 1e-6, "rho": 1.0},
        {"theta0": 1.0, "p0": 1e-3, "eta": 1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": 0.0, "eta": 1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": -1e-3, "eta": 1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": 1e-3, "eta": 0.0, "rho": 1.0},
        {"theta0": 0.1, "p0": 1e-3, "eta": -1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": 1e-3, "eta": 1e-6, "rho": -1.0},
        {"theta0": math.nan, "p0": 1e-3, "eta": 1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": math.inf, "eta": 1e-6, "rho": 1.0},
        {"theta0": 0.1, "p0": 1e-3, "eta": math.inf, "rho": 1.0},
        {"theta0": 0.1, "p0": 1e-3, "eta": 1e-6, "rho": math.inf},
    ],
)
def test_delta_theta_fallback_is_zero(kwargs: dict[str, float]) -> None:
    assert delta_theta_ifr(**kwargs) == 0.0


def test_delta_theta_overflow_returns_one() -> None:
    assert delta_theta_ifr(theta0=0.5, p0=1e-150, eta=1e10, rho=1.0) == 1.0


def test_delta_theta_tiny_p0_does_not_raise() -> None:
    # p0²·θ0 underflows to 0 in double arithmetic, but the correction itself (≈ 9.3e98) is representable.
    theta0, p0, eta, rho = 0.1, 1e-200, 1e-300, 1.0
    value = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho)
    with localcontext() as ctx:
        ctx.prec = 50
        t, p, e, r = Decimal(theta0), Decimal(p0), Decimal(eta), Decimal(rho)
        z = -(1 - t).ln()
        exact = e * (1 - t) ** 2 / (p * p * t) * (z * (t / (1 - t) - z / 2) + r * (z - t))
    assert value == pytest.approx(float(exact), rel=1e-13)


# ---------------------------------------------------------------------------------------------- clip


@pytest.mark.parametrize(
    ("theta", "expected"),
    [
        (0.005, (0.01, -1)),
        (-3.0, (0.01, -1)),
        (math.nan, (0.01, -1)),
        (-math.inf, (0.01, -1)),
        (0.01, (0.01, 0)),
        (0.3, (0.3, 0)),
        (0.8, (0.8, 0)),
        (0.81, (0.8, 1)),
        (math.inf, (0.8, 1)),
    ],
)
def test_clip_theta(theta: float, expected: tuple[float, int]) -> None:
    assert clip_theta(theta, theta_min=0.01, theta_max=0.8) == expected


# ------------------------------------------------------------------------------------- the IFR bound


def test_bound_leaves_the_perturbative_regime_alone() -> None:
    # η/p0² ≤ 1: the correction is the paper's, however large ρ makes it (here Δθ ≈ 2.5·θ0).
    theta0, p0, eta = 0.057, 1.0 / 256.0, 3e-6
    raw = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=27.0)
    assert raw > 2.0 * theta0 and eta / p0**2 < MAX_IFR_STRENGTH
    assert bound_delta_theta(raw, theta0=theta0, p0=p0, eta=eta) == (raw, False)
    # η/p0² > 1 but Δθ ≤ θ0: the first-order term is still smaller than the term it corrects.
    small = delta_theta_ifr(theta0=theta0, p0=p0, eta=2e-5, rho=0.5)
    assert 2e-5 / p0**2 > 1.0 and small < theta0
    assert bound_delta_theta(small, theta0=theta0, p0=p0, eta=2e-5) == (small, False)


def test_bound_cuts_to_the_unit_strength_correction_or_theta0() -> None:
    theta0, p0, eta, rho = 0.0067, 1.6e-4, 2e-6, 4.3
    raw = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho)
    strength = eta / p0**2
    bounded, applied = bound_delta_theta(raw, theta0=theta0, p0=p0, eta=eta)
    assert applied
    # Δθ at η/p0² = 1 is Δθ/strength (Δθ is linear in η); θ0 is the floor of the cut.
    assert bounded == pytest.approx(max(theta0, raw / strength), rel=1e-15)
    assert bounded == pytest.approx(delta_theta_ifr(theta0=theta0, p0=p0, eta=p0 * p0, rho=rho), rel=1e-12)
    # The floor: a tiny unit-strength correction is not cut below θ0.
    assert bound_delta_theta(10.0 * theta0, theta0=theta0, p0=p0, eta=1000.0 * p0 * p0) == (theta0, True)


def test_bound_is_continuous_and_non_decreasing_in_eta() -> None:
    theta0, p0, rho = 0.05, 2e-3, 3.0
    etas = np.linspace(0.0, 20.0 * p0 * p0, 4001)
    values = [bound_delta_theta(delta_theta_ifr(theta0=theta0, p0=p0, eta=e, rho=rho), theta0=theta0, p0=p0,
                                eta=e)[0] for e in etas]
    steps = np.diff(values)
    assert np.all(steps >= -1e-15)
    assert np.max(steps) < 1e-3  # no jump where the bound starts (η/p0² = 1 and Δθ = θ0)


@pytest.mark.parametrize("inputs", [
    {"theta0": math.nan, "p0": 1e-3, "eta": 1e-5}, {"theta0": 0.0, "p0": 1e-3, "eta": 1e-5},
    {"theta0": 0.1, "p0": 0.0, "eta": 1e-5}, {"theta0": 0.1, "p0": 1e-3, "eta": 0.0},
    {"theta0": 0.1, "p0": 1e-3, "eta": math.inf},
])
def test_bound_passes_degenerate_inputs_through(inputs: dict[str, float]) -> None:
    assert bound_delta_theta(0.5, **inputs) == (0.5, False)
    assert bound_delta_theta(math.inf, theta0=0.1, p0=1e-3, eta=1e-5) == (math.inf, False)


@settings(max_examples=300, deadline=None)
@given(
    theta0=st.floats(1e-4, 0.99), p0=st.floats(1e-6, 0.5), eta=st.floats(1e-12, 1e-2), rho=st.floats(0.0, 100.0)
)
def test_bound_never_raises_the_correction(theta0: float, p0: float, eta: float, rho: float) -> None:
    raw = delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho)
    bounded, applied = bound_delta_theta(raw, theta0=theta0, p0=p0, eta=eta)
    assert 0.0 <= bounded <= raw
    assert applied == (bounded < raw)
    if applied:
        assert bounded >= theta0


def test_mid_shift_window_is_bounded_and_flagged() -> None:
    """The fit of a window mid-shift between two uniform workloads (the twin's 512 → 1,024 tokens of mean
    output): p̂0 ≈ 1.6e-4 and η̂ ≈ 2e-6. The θ clip alone let Δθ drive k to about 670 of N ≈ 845, against a
    steady k = 7 (uniform outputs of mean 1,024 fit as geometric: p0 = 1/1024, η = 0)."""
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=700_000)
    workload = WorkloadStats(p0=1.6e-4, eta=2e-6, mu_l_tokens=512.0, mu_o_tokens=774.0)
    config = PolicyConfig()
    result = evaluate(workload, H200, limits, n_prev=845, config=config)

    # What the unbounded correction gave: θ clipped to θ_max, k ≈ 670 of N ≈ 845.
    rho = H200.beta_d_s_per_request * 845 / H200.alpha_d_s
    raw = delta_theta_ifr(theta0=result.theta0, p0=1.6e-4, eta=2e-6, rho=rho)
    assert result.theta0 + raw > config.theta_max
    n_unbounded = memory_safe_batch_size(theta=config.theta_max, p0=1.0 / 774.0, mu_l_tokens=512.0,
                                         kv_capacity_tokens=700_000.0, oom_tolerance=config.oom_tolerance,
                                         max_num_seqs=1024).n
    k_unbounded = threshold_k(theta=config.theta_max, n=n_unbounded)
    assert 830 <= n_unbounded <= 860 and 660 <= k_unbounded <= 690

    steady = evaluate(WorkloadStats(p0=1 / 1024, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=1024.0), H200, limits,
                      n_prev=452, config=config)
    assert steady.k_star == 7

    assert Flag.IFR_CORRECTION_BOUNDED in result.flags
    assert Flag.THETA_CLIPPED_HIGH not in result.flags
    assert result.delta_theta == pytest.approx(raw / (2e-6 / 1.6e-4**2), rel=1e-12)
    assert result.theta_star == pytest.approx(result.theta0 + result.delta_theta, rel=1e-15)
    assert result.theta_star < 4.0 * result.theta0
    assert result.k_star <= 2 * steady.k_star + 1  # 13, against 7 steady and ≈ 676 unbounded
    print(f"mid-shift: unbounded k={k_unbounded} of N={n_unbounded}; bounded k={result.k_star} of "
          f"N={result.n_star} (Δθ {raw:.3f} → {result.delta_theta:.4f}, θ0 {result.theta0:.4f}); steady k="
          f"{steady.k_star} of N={steady.n_star}")
