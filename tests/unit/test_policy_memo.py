"""evaluate()'s memo of a pool's terms (`policy._pool_terms`): an evaluation answered from the memo equals the
one computed afresh for every input it is keyed on (workload, costs, limits, the previous N̂*, the policy), so
engines of one pool share the terms and nothing else leaks between evaluations."""

from __future__ import annotations

import itertools

from controlplane.core import policy
from controlplane.core.types import EngineLimits, PolicyConfig, WorkloadStats
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B

WORKLOADS = (WorkloadStats(p0=1 / 256, eta=2e-6, mu_l_tokens=1000.0, mu_o_tokens=300.0, sigma_o_tokens=250.0),
             WorkloadStats(p0=1 / 2000, eta=0.0, mu_l_tokens=122.0, mu_o_tokens=2400.0, sigma_o_tokens=900.0))
COSTS = (RTX_PRO_6000_QWEN3_8B, H200_QWEN3_8B)
LIMITS = (EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=2_000_000),
          EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=217_000))
CONFIGS = (PolicyConfig(), PolicyConfig(theta_min=0.05, theta_max=0.3, oom_tolerance=0.001))
N_PREV = (0, 40, 900)


def _cases() -> list[tuple]:
    return list(itertools.product(WORKLOADS, COSTS, LIMITS, N_PREV, CONFIGS))


def test_memoised_evaluations_equal_fresh_ones_for_every_key() -> None:
    fresh = {}
    for workload, costs, limits, n_prev, config in _cases():
        policy._pool_terms.cache_clear()
        fresh[workload, costs, limits, n_prev, config] = policy.evaluate(
            workload, costs, limits, n_prev=n_prev, n_obs=500.0, config=config)
    policy._pool_terms.cache_clear()
    for _ in range(2):  # the second round is answered from the memo
        for workload, costs, limits, n_prev, config in _cases():
            memoised = policy.evaluate(workload, costs, limits, n_prev=n_prev, n_obs=500.0, config=config)
            assert memoised == fresh[workload, costs, limits, n_prev, config], (workload, costs, limits, n_prev, config)
    assert policy._pool_terms.cache_info().hits >= len(_cases())
    # Each input the memo is keyed on changes some evaluation on its own (so a memo that left one out would
    # answer a case from its neighbour, and fail above).
    for position in range(5):
        assert any(fresh[a] != fresh[b] for a in fresh for b in fresh
                   if a[position] != b[position] and a[:position] + a[position + 1:] == b[:position] + b[position + 1:])


def test_engines_of_a_pool_share_the_terms_and_keep_their_own_occupancy() -> None:
    workload, costs, limits = WORKLOADS[0], COSTS[0], LIMITS[0]
    policy._pool_terms.cache_clear()
    first = policy.evaluate(workload, costs, limits, n_prev=0, n_obs=200.0)
    second = policy.evaluate(workload, costs, limits, n_prev=0, n_obs=800.0, delta_s_per_token=1e-6)
    assert policy._pool_terms.cache_info().hits == 1
    assert (first.theta0, first.theta_star, first.n_star, first.k_star) == (
        second.theta0, second.theta_star, second.n_star, second.k_star)
    assert (first.n_obs, second.n_obs) == (200.0, 800.0)
    assert first.rhs_s_per_token > second.rhs_s_per_token  # RHS falls as 1/N_obs
    assert (first.delta_s_per_token, second.delta_s_per_token) == (0.0, 1e-6)
