"""The P-PAS(+) per-step rule written out from the P-PAS paper ([PPAS] §3 and [PPAS] §7), and the cases both
of its implementations are checked against: `controlplane.core.budget` and its copy in the agent,
`agents.enforcement.budget`."""

from __future__ import annotations

import itertools

# The rule's parameters in the cases below (BudgetPolicy's and BudgetRule's field names).
PARAMETERS = {"b_max_tokens": 16384, "b_cap_tokens": 2048, "n_th": 2, "t_large_tokens": 32768, "n_d_large": 2}

# (n_p, n_d, r_p): running prefills, running decodes, the largest remaining prefill, tokens.
TRUTH_TABLE = list(itertools.product([0, 1, 2, 3, 17], [0, 1, 2, 3, 100], [0, 32767, 32768, 131072]))

# (n_p, n_d, r_p, the step's budget under PARAMETERS)
NAMED_CASES = [
    (2, 1, 0, 2048),  # two prefills compete with one decode: P_count
    (2, 0, 0, 16384),  # no decode to protect
    (1, 5, 0, 16384),  # one small prefill
    (1, 2, 32768, 2048),  # one large residual prefill with two decodes: P_large
    (1, 1, 32768, 16384),  # P_large needs n_d_large decodes
    (1, 1, 10**6, 16384),  # ... however large the residual prefill
    (0, 9, 99999, 16384),  # no running prefill at all
    (0, 50, 10**6, 16384),
    (2, 1, 10**6, 2048),
]


def paper_pressure(n_p: int, n_d: int, r_p: int) -> bool:
    """P_count ∨ P_large under PARAMETERS (T_large = 0 would turn P-PAS+ off)."""
    n_th, n_d_large, t_large = PARAMETERS["n_th"], PARAMETERS["n_d_large"], PARAMETERS["t_large_tokens"]
    p_count = n_p >= n_th and n_d > 0
    p_large = t_large > 0 and n_p == 1 and n_d >= n_d_large and r_p >= t_large
    return p_count or p_large


def paper_budget(n_p: int, n_d: int, r_p: int) -> int:
    """The step's token budget under PARAMETERS: B_cap under pressure, B_max otherwise."""
    return PARAMETERS["b_cap_tokens"] if paper_pressure(n_p, n_d, r_p) else PARAMETERS["b_max_tokens"]
