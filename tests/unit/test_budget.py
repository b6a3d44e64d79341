"""P-PAS / P-PAS+ token budget: the per-step rule (truth table) and the endpoint selection (P-PAS §3, §7)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.budget import (
    DEFAULT_B_CAP_TOKENS,
    DEFAULT_B_MAX_TOKENS,
    SweepPoint,
    select_budget_policy,
    step_budget_tokens,
    under_pressure,
)
from controlplane.core.types import BudgetPolicy, SchedulerSnapshot
from controlplane.protocol import min_budget_tokens
from tests.unit.ppas_rule import NAMED_CASES, PARAMETERS, TRUTH_TABLE, paper_budget, paper_pressure

POLICY = BudgetPolicy(**PARAMETERS)


@pytest.mark.parametrize(("n_p", "n_d", "r_p"), TRUTH_TABLE)
def test_budget_truth_table(n_p: int, n_d: int, r_p: int) -> None:
    state = SchedulerSnapshot(num_running_prefills=n_p, num_running_decodes=n_d,
                              largest_remaining_prefill_tokens=r_p)
    assert under_pressure(state, POLICY) is paper_pressure(n_p, n_d, r_p)
    assert step_budget_tokens(state, POLICY) == paper_budget(n_p, n_d, r_p)


@pytest.mark.parametrize(("n_p", "n_d", "r_p", "expected"), NAMED_CASES)
def test_budget_named_cases(n_p: int, n_d: int, r_p: int, expected: int) -> None:
    state = SchedulerSnapshot(n_p, n_d, r_p)
    assert step_budget_tokens(state, POLICY) == expected


def test_t_large_zero_disables_p_pas_plus() -> None:
    plain = BudgetPolicy(b_max_tokens=16384, b_cap_tokens=2048, n_th=2, t_large_tokens=0, n_d_large=2)
    assert step_budget_tokens(SchedulerSnapshot(1, 10, 10**9), plain) == 16384
    assert step_budget_tokens(SchedulerSnapshot(2, 10, 0), plain) == 2048  # P_count still applies


@pytest.mark.parametrize("n_th", [1, 3])
def test_n_th_is_honoured(n_th: int) -> None:
    policy = BudgetPolicy(b_max_tokens=8192, b_cap_tokens=1024, n_th=n_th, t_large_tokens=0)
    for n_p in range(0, 5):
        state = SchedulerSnapshot(n_p, 1, 0)
        assert step_budget_tokens(state, policy) == (1024 if n_p >= n_th else 8192)


# --------------------------------------------------------------------------------- endpoint selection


def sweep(rows: list[tuple[int, float, float]]) -> list[SweepPoint]:
    return [SweepPoint(budget_tokens=b, low_pressure_latency_s=lo, high_pressure_latency_s=hi) for b, lo, hi in rows]


PAPER_LIKE_SWEEP = sweep([
    # budget, mean latency at low pressure, at high pressure (s): large budgets win at low pressure,
    # ~2k wins under pressure (P-PAS §2 / §3.1).
    (1024, 3.10, 9.2),
    (2048, 2.95, 8.1),
    (4096, 2.80, 8.6),
    (8192, 2.71, 9.4),
    (16384, 2.64, 10.9),
])


def test_endpoints_are_the_argmins_of_the_sweep() -> None:
    policy, clamped = select_budget_policy(max_num_batched_tokens=16384, sweep=PAPER_LIKE_SWEEP)
    assert (policy.b_max_tokens, policy.b_cap_tokens) == (16384, 2048)
    assert not clamped


def test_endpoint_ties_go_to_the_smaller_budget_and_bad_rows_are_ignored() -> None:
    rows = sweep([
        (4096, 2.0, 5.0),
        (8192, 2.0, 5.0),  # tie on both: the smaller budget wins
        (0, 0.1, 0.1),  # budget ≤ 0: ignored
        (-512, 0.1, 0.1),
        (2048, math.nan, math.inf),  # non-finite latencies: ignored for both
        (1024, math.inf, 7.0),
    ])
    policy, _ = select_budget_policy(max_num_batched_tokens=65536, sweep=rows)
    assert (policy.b_max_tokens, policy.b_cap_tokens) == (4096, 4096)


def test_no_usable_sweep_uses_the_paper_defaults() -> None:
    for rows in ([], sweep([(0, 1.0, 1.0), (4096, math.nan, math.nan)])):
        policy, clamped = select_budget_policy(max_num_batched_tokens=65536, sweep=rows)
        assert (policy.b_max_tokens, policy.b_cap_tokens) == (DEFAULT_B_MAX_TOKENS, DEFAULT_B_CAP_TOKENS)
        assert (DEFAULT_B_MAX_TOKENS, DEFAULT_B_CAP_TOKENS) == (16384, 2048)
        assert not clamped


@pytest.mark.parametrize(
    ("limit", "b_max", "b_cap", "clamped"),
    [
        (16384, 16384, 2048, False),
        (8192, 8192, 2048, True),  # B_max lowered to the engine's start-up budget
        (2048, 2048, 2048, True),
        (1000, 1000, 1000, True),  # both lowered, B_cap ≤ B_max kept
        (1, 1, 1, True),
        (0, 1, 1, True),  # a limit < 1 is treated as 1
    ],
)
def test_endpoints_are_clamped_to_max_num_batched_tokens(limit: int, b_max: int, b_cap: int, clamped: bool) -> None:
    policy, was_clamped = select_budget_policy(max_num_batched_tokens=limit)
    assert (policy.b_max_tokens, policy.b_cap_tokens, was_clamped) == (b_max, b_cap, clamped)


def test_b_cap_never_exceeds_b_max() -> None:
    # A sweep whose high-pressure optimum is the larger budget: no cap helps, B_cap = B_max.
    rows = sweep([(2048, 1.0, 9.0), (8192, 2.0, 3.0)])
    policy, _ = select_budget_policy(max_num_batched_tokens=16384, sweep=rows)
    assert (policy.b_max_tokens, policy.b_cap_tokens) == (2048, 2048)


@pytest.mark.parametrize(("max_model_len", "expected"), [(0, 0), (1, 0), (65536, 32768), (131072, 65536),
                                                         (40961, 20480)])
def test_t_large_defaults_to_half_of_max_model_len(max_model_len: int, expected: int) -> None:
    policy, _ = select_budget_policy(max_num_batched_tokens=16384, max_model_len_tokens=max_model_len)
    assert policy.t_large_tokens == expected == max_model_len // 2


def test_explicit_t_large_and_floors() -> None:
    policy, _ = select_budget_policy(max_num_batched_tokens=16384, max_model_len_tokens=65536,
                                     t_large_tokens=1000, n_th=0, n_d_large=-3)
    assert policy.t_large_tokens == 1000
    assert policy.n_th == 1
    assert policy.n_d_large == 1
    policy, _ = select_budget_policy(max_num_batched_tokens=16384, t_large_tokens=-5)
    assert policy.t_large_tokens == 0


sweep_rows = st.lists(
    st.builds(
        SweepPoint,
        budget_tokens=st.integers(min_value=-10, max_value=10**6),
        low_pressure_latency_s=st.floats(allow_nan=True, allow_infinity=True),
        high_pressure_latency_s=st.floats(allow_nan=True, allow_infinity=True),
    ),
    max_size=8,
)


def argmin_budget(rows: list[SweepPoint], latency: str, default: int) -> int:
    usable = [r for r in rows if r.budget_tokens > 0 and math.isfinite(getattr(r, latency))]
    if not usable:
        return default
    return min(usable, key=lambda r: (getattr(r, latency), r.budget_tokens)).budget_tokens


@settings(max_examples=300, deadline=None)
@given(rows=sweep_rows, limit=st.integers(min_value=1, max_value=10**6),
       max_model_len=st.integers(min_value=0, max_value=10**7))
def test_selected_policy_is_always_ordered_and_within_the_limit(rows, limit: int, max_model_len: int) -> None:
    policy, clamped = select_budget_policy(max_num_batched_tokens=limit, sweep=rows,
                                           max_model_len_tokens=max_model_len)
    assert 1 <= policy.b_cap_tokens <= policy.b_max_tokens <= limit
    assert policy.t_large_tokens == max_model_len // 2
    b_max = argmin_budget(rows, "low_pressure_latency_s", DEFAULT_B_MAX_TOKENS)
    b_cap = argmin_budget(rows, "high_pressure_latency_s", DEFAULT_B_CAP_TOKENS)
    floor = min_budget_tokens(limit)  # the smallest budget an agent accepts
    assert policy.b_max_tokens == max(min(b_max, limit), floor)
    assert policy.b_cap_tokens == max(min(b_cap, b_max, limit), floor)
    assert clamped == (b_max > limit or b_cap > limit or b_max < floor or b_cap < floor)
