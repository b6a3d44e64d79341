"""agents.enforcement.budget: the P-PAS(+) per-step rule (truth table, and agreement with the core's twin)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.enforcement.budget import BudgetRule, step_budget_tokens, under_pressure
from controlplane.core import budget as core_budget
from controlplane.core.types import BudgetPolicy, SchedulerSnapshot

RULE = BudgetRule(b_max_tokens=16384, b_cap_tokens=2048, n_th=2, t_large_tokens=32768, n_d_large=2)


def paper_rule(n_p: int, n_d: int, r_p: int, *, n_th: int, n_d_large: int, t_large: int) -> bool:
    """P_count ∨ P_large, written out from the P-PAS paper (§3 and §7; T_large = 0 turns P-PAS+ off)."""
    p_count = n_p >= n_th and n_d > 0
    p_large = t_large > 0 and n_p == 1 and n_d >= n_d_large and r_p >= t_large
    return p_count or p_large


@pytest.mark.parametrize(
    ("n_p", "n_d", "r_p"),
    list(itertools.product([0, 1, 2, 3, 17], [0, 1, 2, 3, 100], [0, 32767, 32768, 131072])),
)
def test_truth_table(n_p: int, n_d: int, r_p: int) -> None:
    pressure = paper_rule(n_p, n_d, r_p, n_th=2, n_d_large=2, t_large=32768)
    assert under_pressure(RULE, n_p, n_d, r_p) is pressure
    assert step_budget_tokens(RULE, n_p, n_d, r_p) == (2048 if pressure else 16384)


@pytest.mark.parametrize(
    ("n_p", "n_d", "r_p", "expected"),
    [
        (2, 1, 0, 2048),  # two prefills compete with one decode: P_count
        (2, 0, 0, 16384),  # no decode to protect
        (1, 5, 0, 16384),  # one small prefill
        (1, 2, 32768, 2048),  # one large residual prefill with two decodes: P_large
        (1, 1, 32768, 16384),  # P_large needs n_d_large decodes
        (0, 9, 99999, 16384),  # no prefill at all
    ],
)
def test_named_cases(n_p: int, n_d: int, r_p: int, expected: int) -> None:
    assert step_budget_tokens(RULE, n_p, n_d, r_p) == expected


def test_t_large_zero_disables_p_pas_plus() -> None:
    rule = BudgetRule(b_max_tokens=8192, b_cap_tokens=512, n_th=2, t_large_tokens=0, n_d_large=1)
    assert step_budget_tokens(rule, 1, 100, 10**9) == 8192
    assert step_budget_tokens(rule, 2, 1, 0) == 512


counts = st.integers(0, 300)


@given(n_p=counts, n_d=counts, r_p=st.integers(0, 1 << 20), n_th=st.integers(0, 8), n_d_large=st.integers(0, 8),
       t_large=st.integers(0, 1 << 20), b_max=st.integers(1, 1 << 16), b_cap_fraction=st.floats(0.0, 1.0))
def test_agrees_with_the_core_twin_and_stays_within_b_max(n_p, n_d, r_p, n_th, n_d_large, t_large, b_max,
                                                          b_cap_fraction) -> None:
    b_cap = max(1, round(b_cap_fraction * b_max))
    rule = BudgetRule(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=n_th, t_large_tokens=t_large, n_d_large=n_d_large)
    core_policy = BudgetPolicy(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=n_th, t_large_tokens=t_large,
                               n_d_large=n_d_large)
    snapshot = SchedulerSnapshot(num_running_prefills=n_p, num_running_decodes=n_d,
                                 largest_remaining_prefill_tokens=r_p)
    budget = step_budget_tokens(rule, n_p, n_d, r_p)
    assert budget == core_budget.step_budget_tokens(snapshot, core_policy)
    assert under_pressure(rule, n_p, n_d, r_p) is core_budget.under_pressure(snapshot, core_policy)
    assert budget in (b_cap, b_max)
    assert 1 <= budget <= b_max
