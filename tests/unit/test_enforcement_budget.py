"""agents.enforcement.budget: the P-PAS(+) per-step rule (truth table, and agreement with the core's twin)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.enforcement.budget import BudgetRule, step_budget_tokens, under_pressure
from controlplane.core import budget as core_budget
from controlplane.core.types import BudgetPolicy, SchedulerSnapshot
from tests.unit.ppas_rule import NAMED_CASES, PARAMETERS, TRUTH_TABLE, paper_budget, paper_pressure

RULE = BudgetRule(**PARAMETERS)


@pytest.mark.parametrize(("n_p", "n_d", "r_p"), TRUTH_TABLE)
def test_truth_table(n_p: int, n_d: int, r_p: int) -> None:
    assert under_pressure(RULE, n_p, n_d, r_p) is paper_pressure(n_p, n_d, r_p)
    assert step_budget_tokens(RULE, n_p, n_d, r_p) == paper_budget(n_p, n_d, r_p)


@pytest.mark.parametrize(("n_p", "n_d", "r_p", "expected"), NAMED_CASES)
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
