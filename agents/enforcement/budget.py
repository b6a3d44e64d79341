"""The P-PAS(+) per-step token budget rule, as the agent evaluates it every engine step.

    budget = b_cap  if (N_p ≥ n_th ∧ N_d > 0)                                    (P-PAS, count pressure)
                    ∨ (t_large > 0 ∧ N_p = 1 ∧ N_d ≥ n_d_large ∧ R_p ≥ t_large)   (P-PAS+, large residual)
             b_max  otherwise

N_p: prefills competing for the step's budget (requests), N_d: running decodes (requests), R_p: the largest
remaining prefill among them (tokens). t_large = 0 turns the P-PAS+ condition off.

The same rule lives in `controlplane.core.budget` (the controller's twin, which also chooses the endpoints);
`agents` may not import the core, so this module keeps its own minimal copy: keep the two in step
(tests/unit/test_budget.py and tests/unit/test_enforcement_budget.py check the same truth table).

Pure and allocation-free: no I/O, no clock. Runs inside vLLM's scheduler every step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetRule:
    """The P-PAS(+) parameters in force. Built once per decision, read every step (slot reads only).

    Attributes:
        b_max_tokens: budget without pressure, tokens (≥ 1, ≤ the engine's start-up budget).
        b_cap_tokens: budget under pressure, tokens (1 ≤ b_cap ≤ b_max).
        n_th: prefill count from which pressure starts, requests.
        t_large_tokens: P-PAS+ residual-prefill threshold, tokens; 0 disables P-PAS+.
        n_d_large: decodes needed for the P-PAS+ condition, requests.
    """

    b_max_tokens: int
    b_cap_tokens: int
    n_th: int
    t_large_tokens: int
    n_d_large: int


def under_pressure(rule: BudgetRule, num_prefills: int, num_decodes: int, largest_remaining_prefill_tokens: int,
                   /) -> bool:
    """True when the P-PAS(+) pressure condition holds (see the module docstring)."""
    if num_decodes > 0 and num_prefills >= rule.n_th:
        return True
    t_large = rule.t_large_tokens
    return (t_large > 0 and num_prefills == 1 and num_decodes >= rule.n_d_large
            and largest_remaining_prefill_tokens >= t_large)


def step_budget_tokens(rule: BudgetRule, num_prefills: int, num_decodes: int, largest_remaining_prefill_tokens: int,
                       /) -> int:
    """Token budget of one engine step: `rule.b_cap_tokens` under pressure, else `rule.b_max_tokens`.

    Args are positional-only (hot path). Never raises; negative counts read as no pressure.
    """
    if num_decodes > 0 and num_prefills >= rule.n_th:
        return rule.b_cap_tokens
    t_large = rule.t_large_tokens
    if (t_large > 0 and num_prefills == 1 and num_decodes >= rule.n_d_large
            and largest_remaining_prefill_tokens >= t_large):
        return rule.b_cap_tokens
    return rule.b_max_tokens
