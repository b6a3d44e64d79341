"""Memory-safe batch size N* (Proposition 3.3) and k = ⌊θ·N⌋, against hand-derived values."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.core.batch_size import memory_safe_batch_size, threshold_k, tokens_per_slot


def hand_n_star(*, theta: float, p0: float, mu_l: float, capacity: float, eps: float) -> float:
    """(C − ln(1/ε)/(p0²·μ_L)) / (μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ))), unfloored."""
    reserve = math.log(1.0 / eps) / (p0**2 * mu_l)
    per_slot = mu_l + (1.0 - theta) / (theta * p0) * math.log(1.0 / (1.0 - theta))
    return (capacity - reserve) / per_slot


def test_n_star_hand_computed_case() -> None:
    # θ = 0.1, p0 = 1/256, μ_L = 512, C = 2,000,000, ε = 0.01:
    #   reserve  = ln(100)·256²/512 = 128·ln 100            = 589.4617838...
    #   per slot = 512 + 0.9·2560·ln(1/0.9) = 512 + 2304·ln(10/9) = 754.7506280...
    #   N*       = ⌊(2,000,000 − 589.46...)/754.75...⌋ = ⌊2649.10...⌋ = 2649
    reserve = 128.0 * math.log(100.0)
    per_slot = 512.0 + 2304.0 * math.log(10.0 / 9.0)
    assert reserve == pytest.approx(589.4617838064758, rel=1e-14)
    assert per_slot == pytest.approx(754.7506280756319, rel=1e-14)
    result = memory_safe_batch_size(
        theta=0.1, p0=1.0 / 256.0, mu_l_tokens=512.0, kv_capacity_tokens=2_000_000.0,
        oom_tolerance=0.01, max_num_seqs=4096,
    )
    assert result.n == 2649 == math.floor((2_000_000 - reserve) / per_slot)
    assert result.n_unclipped == pytest.approx((2_000_000 - reserve) / per_slot, rel=1e-13)
    assert not result.below_one_request
    assert not result.capped


@pytest.mark.parametrize(
    ("theta", "p0", "mu_l", "capacity", "eps"),
    [
        (0.0335, 1.0 / 256.0, 512.0, 500_000.0, 0.01),
        (0.5, 1.0 / 128.0, 1024.0, 4_000_000.0, 1e-3),
        (0.8, 1.0 / 20.0, 30.0, 100_000.0, 0.2),
        (0.01, 1.0 / 4000.0, 64.0, 9e9, 1e-6),
    ],
)
def test_n_star_matches_formula(theta: float, p0: float, mu_l: float, capacity: float, eps: float) -> None:
    expected = hand_n_star(theta=theta, p0=p0, mu_l=mu_l, capacity=capacity, eps=eps)
    assert expected >= 1.0
    result = memory_safe_batch_size(
        theta=theta, p0=p0, mu_l_tokens=mu_l, kv_capacity_tokens=capacity, oom_tolerance=eps,
        max_num_seqs=10**12,
    )
    assert result.n == math.floor(expected)
    assert result.n_unclipped == pytest.approx(expected, rel=1e-12)


def test_tokens_per_slot_hand_value() -> None:
    # μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ)) with θ = 0.5, p0 = 0.01: 100 + 100·ln 2.
    assert tokens_per_slot(theta=0.5, p0=0.01, mu_l_tokens=100.0) == pytest.approx(
        100.0 + 100.0 * math.log(2.0), rel=1e-15
    )


def test_n_capped_by_max_num_seqs() -> None:
    result = memory_safe_batch_size(
        theta=0.1, p0=1.0 / 256.0, mu_l_tokens=512.0, kv_capacity_tokens=2_000_000.0,
        oom_tolerance=0.01, max_num_seqs=256,
    )
    assert result.n == 256
    assert result.capped
    assert result.n_unclipped == pytest.approx(2649.100860391516, rel=1e-12)


@pytest.mark.parametrize("capacity", [0.0, 500.0, 1200.0])
def test_capacity_below_one_request(capacity: float) -> None:
    # reserve = 589.46 tokens, one slot = 754.75 tokens: 1200 tokens cannot hold one request safely.
    result = memory_safe_batch_size(
        theta=0.1, p0=1.0 / 256.0, mu_l_tokens=512.0, kv_capacity_tokens=capacity,
        oom_tolerance=0.01, max_num_seqs=64,
    )
    assert result.n == 1
    assert result.below_one_request
    assert result.n_unclipped < 1.0


@pytest.mark.parametrize(
    "override",
    [
        {"theta": 0.0}, {"theta": 1.0}, {"theta": -0.5}, {"theta": math.nan},
        {"p0": 0.0}, {"p0": -0.1}, {"p0": math.inf},
        {"mu_l_tokens": 0.0}, {"mu_l_tokens": math.nan},
        {"kv_capacity_tokens": math.inf}, {"kv_capacity_tokens": math.nan},
        {"oom_tolerance": 0.0}, {"oom_tolerance": 1.0}, {"oom_tolerance": math.nan},
    ],
)
def test_out_of_domain_inputs_fall_back_to_max_num_seqs(override: dict[str, float]) -> None:
    kwargs = {"theta": 0.1, "p0": 1.0 / 256.0, "mu_l_tokens": 512.0, "kv_capacity_tokens": 2e6,
              "oom_tolerance": 0.01} | override
    result = memory_safe_batch_size(**kwargs, max_num_seqs=77)
    assert result.n == 77
    assert result.n_unclipped == 0.0
    assert not result.below_one_request
    assert not result.capped


@pytest.mark.parametrize("max_num_seqs", [0, -5])
def test_max_num_seqs_below_one_is_treated_as_one(max_num_seqs: int) -> None:
    result = memory_safe_batch_size(
        theta=0.1, p0=1.0 / 256.0, mu_l_tokens=512.0, kv_capacity_tokens=2e6, oom_tolerance=0.01,
        max_num_seqs=max_num_seqs,
    )
    assert result.n == 1


def test_tiny_p0_means_no_request_fits_and_does_not_raise() -> None:
    # p0 = 1e-200: outputs of ~1e200 tokens; p0²·μ_L underflows to 0 in double arithmetic, the OOM reserve
    # is effectively infinite, so not even one request fits (not "unknown, use max_num_seqs").
    result = memory_safe_batch_size(
        theta=0.1, p0=1e-200, mu_l_tokens=100.0, kv_capacity_tokens=1e12, oom_tolerance=0.01,
        max_num_seqs=512,
    )
    assert result.n == 1
    assert result.below_one_request


def test_n_star_shrinks_as_epsilon_shrinks() -> None:
    """A stricter OOM tolerance reserves more memory: N* is non-increasing as ε → 0, strictly here."""
    epsilons = [0.5, 0.2, 0.1, 0.05, 0.01, 1e-3, 1e-4, 1e-6, 1e-9, 1e-12]

    def n_for(eps: float, p0: float, mu_l: float) -> int:
        return memory_safe_batch_size(
            theta=0.05, p0=p0, mu_l_tokens=mu_l, kv_capacity_tokens=300_000.0, oom_tolerance=eps,
            max_num_seqs=100_000,
        ).n

    # Short outputs and prompts: the reserve is small, N* still non-increasing (may tie).
    relaxed = [n_for(eps, 1.0 / 64.0, 256.0) for eps in epsilons]
    assert all(a >= b for a, b in itertools.pairwise(relaxed))
    # Long outputs (p0 = 1/1024), short prompts: the reserve ln(1/ε)·1024²/64 dominates; strict decrease.
    strict = [n_for(eps, 1.0 / 1024.0, 64.0) for eps in epsilons[:6]]
    assert all(a > b for a, b in itertools.pairwise(strict))


@settings(max_examples=200, deadline=None)
@given(
    theta=st.floats(min_value=1e-6, max_value=0.999),
    p0=st.floats(min_value=1e-6, max_value=1.0),
    mu_l=st.floats(min_value=1.0, max_value=1e6),
    capacity=st.floats(min_value=0.0, max_value=1e12),
    eps_a=st.floats(min_value=1e-12, max_value=0.99),
    eps_b=st.floats(min_value=1e-12, max_value=0.99),
)
def test_n_star_monotone_in_epsilon(
    theta: float, p0: float, mu_l: float, capacity: float, eps_a: float, eps_b: float
) -> None:
    strict_eps, loose_eps = sorted((eps_a, eps_b))

    def n_for(eps: float) -> int:
        return memory_safe_batch_size(
            theta=theta, p0=p0, mu_l_tokens=mu_l, kv_capacity_tokens=capacity, oom_tolerance=eps,
            max_num_seqs=10**9,
        ).n

    assert 1 <= n_for(strict_eps) <= n_for(loose_eps) <= 10**9


# ---------------------------------------------------------------------------------------------- k


@pytest.mark.parametrize(
    ("theta", "n", "expected"),
    [
        (0.1, 2649, 264),  # ⌊264.9⌋
        (0.0335, 1024, 34),  # ⌊34.304⌋
        (0.5, 7, 3),
        (0.01, 50, 1),  # ⌊0.5⌋ = 0 → clamped up to 1
        (0.0, 10, 1),
        (-0.3, 10, 1),
        (1.0, 10, 10),
        (1.7, 10, 10),  # clamped down to N
        (math.nan, 10, 1),
        (math.inf, 10, 1),
        (0.5, 0, 1),  # N < 1 treated as 1
    ],
)
def test_threshold_k(theta: float, n: int, expected: int) -> None:
    assert threshold_k(theta=theta, n=n) == expected


@settings(max_examples=300, deadline=None)
@given(theta=st.floats(min_value=0.0, max_value=1.0), n=st.integers(min_value=1, max_value=10**7))
def test_threshold_k_is_floor_clamped(theta: float, n: int) -> None:
    k = threshold_k(theta=theta, n=n)
    assert 1 <= k <= n
    assert k == min(n, max(1, math.floor(theta * n)))


# ---- the moment bound used where Prop. 3.3's reserve takes more than half the KV cache ----


def _stationary_slot_tokens(rng, outputs_sampler, mu_l: float, size: tuple[int, int]):
    """KV tokens of slots refilled as their requests finish, in steady state: a prompt of μ_L plus the age of
    an output drawn length-biased (age uniform over the output), resampled from as many draws as slots (eight
    times as many gave the same shares within 0.0004: 0.0003 against 0.0004 beyond C at N̂*, 0.792 against 0.795
    at 1.25·N̂*, in a third of the time)."""
    import numpy as np

    draws = outputs_sampler(rng, size[0] * size[1])
    biased = rng.choice(draws, size=size, p=draws / draws.sum())
    return mu_l + rng.uniform(0.0, 1.0, size=size) * biased + np.zeros(size)


@pytest.mark.parametrize("capacity", [217_042.0, 447_720.0])
def test_occupancy_bound_holds_its_tolerance_where_prop_3_3_collapses(capacity: float) -> None:
    """Uniform 800–4,000 outputs after 122-token prompts (the NuminaMath shape): Prop. 3.3 at p = 1/μ_O
    leaves no room (or a third of what fits), the moment bound gives an N whose steady-state KV exceeds C
    in at most ε of draws, and an N a quarter larger would not."""
    import numpy as np

    from controlplane.core.batch_size import occupancy_batch_size, reserve_tokens

    mu_o, sigma_o, mu_l = 2400.0, 3200.0 / math.sqrt(12.0), 122.0
    assert reserve_tokens(p0=1.0 / mu_o, mu_l_tokens=mu_l, oom_tolerance=0.01) > 0.45 * capacity
    paper = memory_safe_batch_size(theta=0.02, p0=1.0 / mu_o, mu_l_tokens=mu_l, kv_capacity_tokens=capacity,
                                   oom_tolerance=0.01, max_num_seqs=1024)
    bound = occupancy_batch_size(mu_l_tokens=mu_l, mu_o_tokens=mu_o, sigma_o_tokens=sigma_o,
                                 kv_capacity_tokens=capacity, oom_tolerance=0.01, max_num_seqs=1024)
    assert bound.n > 2 * paper.n and not bound.below_one_request

    rng = np.random.default_rng(7)

    def uniform(generator, count):
        return generator.uniform(800.0, 4000.0, size=count)

    # 5,000 steady states a side: the shares measured are 0.0002-0.0008 beyond C at the bound and 0.79-0.996 at 1.25x
    # (the same as from 20,000, which took over ten times as long), far from either threshold.
    at_bound = _stationary_slot_tokens(rng, uniform, mu_l, (5_000, bound.n)).sum(axis=1)
    assert np.mean(at_bound > capacity) <= 0.01
    larger = int(bound.n * 1.25)
    beyond = _stationary_slot_tokens(rng, uniform, mu_l, (5_000, larger)).sum(axis=1)
    assert np.mean(beyond > capacity) > 0.5


def test_occupancy_bound_is_close_to_prop_3_3_for_geometric_outputs() -> None:
    """Where the paper's formula holds (geometric outputs, a small reserve) the two agree within 5%."""
    from controlplane.core.batch_size import occupancy_batch_size

    for mu_l, mu_o, capacity in ((512.0, 256.0, 447_720.0), (128.0, 1024.0, 700_000.0), (1024.0, 128.0, 700_000.0)):
        paper = memory_safe_batch_size(theta=0.03, p0=1.0 / mu_o, mu_l_tokens=mu_l, kv_capacity_tokens=capacity,
                                       oom_tolerance=0.01, max_num_seqs=1 << 20)
        bound = occupancy_batch_size(mu_l_tokens=mu_l, mu_o_tokens=mu_o, sigma_o_tokens=mu_o,
                                     kv_capacity_tokens=capacity, oom_tolerance=0.01, max_num_seqs=1 << 20)
        assert bound.n == pytest.approx(paper.n, rel=0.05)


@given(mu_l=st.floats(allow_nan=True, allow_infinity=True), mu_o=st.floats(allow_nan=True, allow_infinity=True),
       sigma=st.floats(allow_nan=True, allow_infinity=True), capacity=st.floats(allow_nan=True, allow_infinity=True),
       eps=st.floats(allow_nan=True, allow_infinity=True), cap=st.integers(-5, 1 << 20))
@example(mu_l=0.0, mu_o=4.923788161679799e-166, sigma=0.0, capacity=8.851460175768116e142, eps=0.5, cap=0)
@settings(max_examples=400, deadline=None)
def test_occupancy_bound_is_in_range_for_any_input(mu_l, mu_o, sigma, capacity, eps, cap) -> None:
    from controlplane.core.batch_size import occupancy_batch_size

    result = occupancy_batch_size(mu_l_tokens=mu_l, mu_o_tokens=mu_o, sigma_o_tokens=sigma,
                                  kv_capacity_tokens=capacity, oom_tolerance=eps, max_num_seqs=cap)
    assert 1 <= result.n <= max(1, cap) and math.isfinite(result.n_unclipped)
