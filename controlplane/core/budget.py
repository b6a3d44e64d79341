"""P-PAS and P-PAS+ token budget: the per-step rule and the choice of its two endpoints.

[PPAS] §3 (count-based pressure), [PPAS] §3.1 (endpoint selection) and [PPAS] §7 (the large-residual-prefill
condition of P-PAS+). Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.core.types import BudgetPolicy, SchedulerSnapshot
from controlplane.protocol import min_budget_tokens

DEFAULT_B_MAX_TOKENS = 16384
DEFAULT_B_CAP_TOKENS = 2048
DEFAULT_N_TH = 2
DEFAULT_N_D_LARGE = 2


def under_pressure(state: SchedulerSnapshot, policy: BudgetPolicy) -> bool:
    """(N_p ≥ N_th ∧ N_d > 0) ∨ (N_p = 1 ∧ N_d ≥ N_d,large ∧ R_p ≥ T_large); T_large = 0 disables P-PAS+."""
    count_pressure = state.num_running_prefills >= policy.n_th and state.num_running_decodes > 0
    large_prefill = (
        policy.t_large_tokens > 0
        and state.num_running_prefills == 1
        and state.num_running_decodes >= policy.n_d_large
        and state.largest_remaining_prefill_tokens >= policy.t_large_tokens
    )
    return count_pressure or large_prefill


def step_budget_tokens(state: SchedulerSnapshot, policy: BudgetPolicy) -> int:
    """Token budget of one engine step: B_cap under pressure, else B_max."""
    return policy.b_cap_tokens if under_pressure(state, policy) else policy.b_max_tokens


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One row of a static token-budget sweep: mean latency at low and at high scheduling pressure (s)."""

    budget_tokens: int
    low_pressure_latency_s: float
    high_pressure_latency_s: float


def _argmin_budget(points: Sequence[SweepPoint], key: str) -> int | None:
    valid = [p for p in points if p.budget_tokens > 0 and math.isfinite(getattr(p, key))]
    if not valid:
        return None
    return min(valid, key=lambda p: (getattr(p, key), p.budget_tokens)).budget_tokens


def select_budget_policy(
    *,
    max_num_batched_tokens: int,
    sweep: Sequence[SweepPoint] = (),
    max_model_len_tokens: int = 0,
    n_th: int = DEFAULT_N_TH,
    n_d_large: int = DEFAULT_N_D_LARGE,
    t_large_tokens: int | None = None,
) -> tuple[BudgetPolicy, bool]:
    """Choose the endpoints B_max and B_cap and build the policy.

    B_max = argmin of low-pressure latency and B_cap = argmin of high-pressure latency over the sweep
    (ties → the smaller budget; rows with a non-finite latency or a budget ≤ 0 are ignored); without a
    usable sweep, the paper's defaults 16384 / 2048. Both are clamped to [floor, max_num_batched_tokens]
    with floor = `controlplane.protocol.min_budget_tokens` (the smallest budget an agent accepts)
    (the agent can only lower the engine's start-up budget), and B_cap ≤ B_max is enforced (a sweep
    whose high-pressure optimum is the larger budget yields B_cap = B_max: no cap helps).
    T_large defaults to half of max_model_len, 0 (P-PAS+ off) when max_model_len is unknown: an adaptation of
    [PPAS] §7, which sets it to half the largest prompt length used in each experiment.

    Returns:
        (policy, clamped) where clamped says an endpoint was moved to fit the engine or the floor.
    """
    limit = max(1, int(max_num_batched_tokens))
    b_max = _argmin_budget(sweep, "low_pressure_latency_s") or DEFAULT_B_MAX_TOKENS
    b_cap = _argmin_budget(sweep, "high_pressure_latency_s") or DEFAULT_B_CAP_TOKENS
    clamped = b_max > limit or b_cap > limit
    # Never below the floor the agent enforces (`protocol.min_budget_tokens`): a sweep whose optimum is a
    # tiny budget would only be refused (budget_below_floor) by every engine.
    floor = min_budget_tokens(limit)
    clamped = clamped or b_max < floor or b_cap < floor
    b_max = max(min(b_max, limit), floor)
    b_cap = max(min(b_cap, b_max), floor)
    if t_large_tokens is None:
        t_large_tokens = max(0, int(max_model_len_tokens)) // 2
    policy = BudgetPolicy(
        b_max_tokens=b_max,
        b_cap_tokens=max(1, b_cap),
        n_th=max(1, int(n_th)),
        t_large_tokens=max(0, int(t_large_tokens)),
        n_d_large=max(1, int(n_d_large)),
    )
    return policy, clamped
