"""The crossover rule before the lengths are known: EB at cold start only when no length can make MB win.

Why: a new pool has no completions for a while. At high load that while is long (the twin at c = 2,048 on
the RTX PRO 6000: 102 s of a 325 s run before 400 completions), and stock MB batching there costs EB+ 10%
of the whole run against EB. The rule ([EB] eq. (8)) itself needs the cost model, N_obs and the workload terms
(μ_L, μ_O and p0 through θ0); at cold start the first two are known (a calibration, the engine's
occupancy) and the workload is not. The rule's verdict often does not depend on it: on a
bandwidth-constrained accelerator EB wins at every length once N_obs is past about a hundred requests
(95 with the RTX PRO 6000's published calibration; 383 on the H200).

So the rule is evaluated over every workload the engine can serve: μ_L and μ_O on a log-spaced grid of
[1, max_model_len] (μ_L + μ_O ≤ max_model_len), p0 from the geometric rate 1/μ_O down to P0_SPAN times it
(outputs more regular than geometric put the hazard's intercept below the mean's rate; a lower p0 gives a
lower θ0 and favours MB), but never below 2 − μ_O: every request makes at least one token, and those that
go on at least two, so μ_O ≥ 2 − p0 (a law of mean 1.2 finishes 80% of its requests at the first token).
What the pool has already seen narrows the output axis: its completions and running requests give a
lower confidence bound on μ_O (`HazardFit.mu_o_lower_tokens`, the Kaplan–Meier restricted mean less three
standard errors; before the first completion, the running requests' ages alone:
`survival.running_mean_lower_bound`), and the grid keeps the μ_O values from the last one at or below that
floor. The worst points are tiny outputs (μ_O ≈ 2.5 with the H200's calibration, where EB wins by less
than the selector's hysteresis band); a pool whose requests have already run for a hundred tokens has ruled
them out. The
least favourable point for EB (the largest margin RHS + δ − LHS) stands for the rule: when EB wins
there, it wins everywhere on the grid. The caller feeds that point to the selector
(hysteresis and cooldown as usual), so the cold start leaves MB only on a verdict no length can overturn.

Pure: no I/O, no clock. The grid's terms depend on the cost model and max_model_len only (RHS scales as
1/N_obs), so they are computed once per pair (about 4 ms: θ0 is solved once per (μ_O, p0)) and each
engine's verdict costs one pass over the grid (about 11 µs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from controlplane.core.cost_model import cost_model_is_usable
from controlplane.core.crossover import crossover_terms
from controlplane.core.threshold import solve_theta0
from controlplane.core.types import CostModel

GRID_POINTS_PER_AXIS = 24
# p0 from 1/μ_O down to P0_SPAN/μ_O (three points, log-spaced).
P0_SPAN = 0.1
P0_POINTS = 3


@dataclass(frozen=True, slots=True)
class ColdStartPoint:
    """The grid point least favourable to EB for one N_obs: its terms of [EB] eq. (8), seconds per token."""

    lhs_s_per_token: float
    rhs_s_per_token: float
    mu_l_tokens: float
    mu_o_tokens: float
    p0: float


@dataclass(frozen=True, eq=False, slots=True)
class _Grid:
    lhs_s_per_token: np.ndarray
    rhs_at_one_s_per_token: np.ndarray  # RHS at N_obs = 1 (RHS = this / N_obs)
    mu_l_tokens: np.ndarray
    mu_o_tokens: np.ndarray
    p0: np.ndarray
    mu_o_axis_tokens: np.ndarray  # the grid's μ_O values, increasing


@lru_cache(maxsize=256)
def _grid(costs: CostModel, max_model_len_tokens: int) -> _Grid | None:
    """The rule's terms over the workloads an engine with this max_model_len serves; None when the rule
    cannot be evaluated at some point (the verdict would then rest on the points it could)."""
    top = float(max_model_len_tokens - 1)
    lengths = np.geomspace(1.0, top, GRID_POINTS_PER_AXIS)
    factors = np.geomspace(P0_SPAN, 1.0, P0_POINTS)
    columns: list[tuple[float, float, float, float, float]] = []
    for mu_o in lengths.tolist():
        # θ0 depends on p0 alone: solved once per (μ_O, p0), not per μ_L.
        rates = [min(1.0, max(factor / mu_o, 2.0 - mu_o)) for factor in factors.tolist()]
        thresholds = [(p0, solve_theta0(p0 * costs.alpha_p_s / costs.alpha_d_s)) for p0 in rates]
        for mu_l in lengths.tolist():
            if mu_l + mu_o > max_model_len_tokens:
                continue
            for p0, theta0 in thresholds:
                terms = crossover_terms(costs=costs, theta0=theta0, mu_l_tokens=mu_l, mu_o_tokens=mu_o, n_obs=1.0)
                if terms is None:
                    return None
                columns.append((terms.lhs_s_per_token, terms.rhs_s_per_token, mu_l, mu_o, p0))
    lhs, rhs, mu_l_column, mu_o_column, p0_column = np.array(columns, dtype=np.float64).T
    return _Grid(lhs_s_per_token=lhs, rhs_at_one_s_per_token=rhs, mu_l_tokens=mu_l_column,
                 mu_o_tokens=mu_o_column, p0=p0_column, mu_o_axis_tokens=lengths)


def least_favourable_to_eb(costs: CostModel, *, max_model_len_tokens: int, n_obs: float,
                           delta_s_per_token: float, mu_o_floor_tokens: float = 1.0) -> ColdStartPoint | None:
    """The grid point where EB's margin under [EB] eq. (8) is smallest, for an engine at occupancy n_obs.

    Args:
        costs: the pool's cost model (a calibration, or the online fit), seconds.
        max_model_len_tokens: the engine's longest prompt + output; the grid spans [1, this].
        n_obs: the engine's observed occupancy (requests running, EMA).
        delta_s_per_token: the operator margin δ in force (> 0 favours MB).
        mu_o_floor_tokens: a lower bound on the mean output length the data proves (1: none); the grid's
            μ_O values from the largest one ≤ the floor up are searched. A floor that is not a finite
            number ≥ 1 counts as 1.
    Returns:
        The point, or None when there is no verdict to give: an unusable cost model, max_model_len
        unknown (0) or below 2 tokens, N_obs below one request or not finite, or a grid point where the
        rule cannot be evaluated. The caller then keeps the cold start's MB.
    """
    if max_model_len_tokens < 2 or not (math.isfinite(n_obs) and n_obs >= 1.0):
        return None
    if not (math.isfinite(delta_s_per_token) and cost_model_is_usable(costs)):
        return None
    grid = _grid(costs, int(max_model_len_tokens))
    if grid is None:
        return None
    rhs = grid.rhs_at_one_s_per_token / n_obs
    margin = rhs + delta_s_per_token - grid.lhs_s_per_token
    floor = float(mu_o_floor_tokens) if math.isfinite(mu_o_floor_tokens) and mu_o_floor_tokens >= 1.0 else 1.0
    axis = grid.mu_o_axis_tokens
    level = axis[max(0, int(np.searchsorted(axis, floor, side="right")) - 1)]
    if level > axis[0]:
        margin = np.where(grid.mu_o_tokens >= level, margin, -np.inf)
    worst = int(np.argmax(margin))
    return ColdStartPoint(lhs_s_per_token=float(grid.lhs_s_per_token[worst]), rhs_s_per_token=float(rhs[worst]),
                          mu_l_tokens=float(grid.mu_l_tokens[worst]), mu_o_tokens=float(grid.mu_o_tokens[worst]),
                          p0=float(grid.p0[worst]))
