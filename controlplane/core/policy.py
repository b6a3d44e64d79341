"""The decision policy: composes hazard fit, threshold, batch size, crossover and budget.

`evaluate` computes every term of the papers' formulas for given workload parameters (the what-if
planner's view). `decide` is the online policy for one engine or a pool: from the pool's hazard fit it evaluates,
applies EB+ hysteresis and cooldown, operator pins and δ, and returns a Decision with a reason code,
flags for every degenerate input it met, and finite diagnostics. It never raises for any observation.

Pure: no I/O, no clock (now_s is passed in), no mutable module state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from controlplane.core.batch_size import (
    BatchSize,
    memory_safe_batch_size,
    occupancy_batch_size,
    reserve_tokens,
    threshold_k,
)
from controlplane.core.budget import SweepPoint, select_budget_policy
from controlplane.core.cold_start import least_favourable_to_eb
from controlplane.core.cost_model import cost_model_is_usable
from controlplane.core.crossover import crossover_terms, instantaneous_mode, select_mode
from controlplane.core.hazard import HazardFit
from controlplane.core.kv_role import ROLES_WITHOUT_EB, role_decision
from controlplane.core.memory_guard import update_memory_guard
from controlplane.core.threshold import bound_delta_theta, clip_theta, delta_theta_ifr, solve_theta0
from controlplane.core.types import (
    DELTA_LIMIT_S_PER_TOKEN,
    BudgetPolicy,
    CostModel,
    Decision,
    DeltaSource,
    Diagnostics,
    EngineLimits,
    Evaluation,
    Flag,
    Mode,
    Observations,
    OperatorIntent,
    PolicyConfig,
    PolicyState,
    Reason,
    WorkloadStats,
)
from controlplane.protocol import min_budget_tokens

# Pure functions of a pool's terms, memoised: every engine of a pool evaluates them with the same pool
# estimate (and mostly the same limits), so one decision per pool pays for them and the rest hit the cache.
_solve_theta0 = lru_cache(maxsize=4096)(solve_theta0)
_batch_size = lru_cache(maxsize=4096)(memory_safe_batch_size)
_occupancy_batch_size = lru_cache(maxsize=4096)(occupancy_batch_size)
# The share of the KV cache [EB] Prop. 3.3's reserve takes where the moment bound starts to count, and where it
# counts in full (see _pool_terms()).
_OCCUPANCY_FROM_SHARE = 0.10
_OCCUPANCY_FULL_SHARE = 0.40
_usable = lru_cache(maxsize=1024)(cost_model_is_usable)
_budget_policy = lru_cache(maxsize=1024)(select_budget_policy)


def _within_objective_bounds(tokens: int, budget: BudgetPolicy, intent: OperatorIntent, max_num_batched_tokens: int,
                             *, at_least: int = 0) -> int:
    """tokens × intent.budget_cap_scale, clamped to the objective's bounds within the engine's:
    [max(at_least, budget_min_tokens, the agent's floor), min(budget_max_tokens or B_max, B_max)], at least 1."""
    floor = min_budget_tokens(max(1, int(max_num_batched_tokens)))
    high = min(budget.b_max_tokens, intent.budget_max_tokens or budget.b_max_tokens)
    low = min(max(at_least, floor, intent.budget_min_tokens), high)
    return max(1, min(high, max(low, round(tokens * intent.budget_cap_scale))))


def _scaled_cap(budget: BudgetPolicy, intent: OperatorIntent, max_num_batched_tokens: int) -> BudgetPolicy:
    """budget with B_cap × intent.budget_cap_scale, clamped to the objective's bounds within
    [the agent's floor, B_max] (B_cap ≤ B_max always holds)."""
    return replace(budget, b_cap_tokens=_within_objective_bounds(budget.b_cap_tokens, budget, intent,
                                                                 max_num_batched_tokens))


def _scaled_max(budget: BudgetPolicy, intent: OperatorIntent, max_num_batched_tokens: int) -> BudgetPolicy:
    """budget with B_max × intent.budget_cap_scale too (a scale below 1: a TPOT target missed), clamped to
    [max(B_cap, budget_min_tokens, the agent's floor), min(budget_max_tokens or B_max, B_max)]. For MB's steps
    only: without prefill pressure B_max is the budget of a step that mixes one prompt's chunk with the running
    decodes, whose time every decode waits for; EB's prefill-only steps would only be cut into more steps."""
    return replace(budget, b_max_tokens=_within_objective_bounds(budget.b_max_tokens, budget, intent,
                                                                 max_num_batched_tokens, at_least=budget.b_cap_tokens))


_DEFAULT_CONFIG = PolicyConfig()

def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else 0.0


def resolve_delta(delta_s_per_token: float | None, *, default_s_per_token: float) -> tuple[float, bool]:
    """δ to use: the given one when finite and within ±DELTA_LIMIT_S_PER_TOKEN, else clipped.

    Returns:
        (δ, out_of_range). None → the default. NaN → the default, flagged. ±inf or beyond the limit →
        clipped to the limit, flagged.
    """
    if delta_s_per_token is None:
        return default_s_per_token, False
    if math.isnan(delta_s_per_token):
        return default_s_per_token, True
    if abs(delta_s_per_token) > DELTA_LIMIT_S_PER_TOKEN:
        return math.copysign(DELTA_LIMIT_S_PER_TOKEN, delta_s_per_token), True
    return float(delta_s_per_token), False


@dataclass(frozen=True, slots=True)
class _PoolTerms:
    """The terms of `evaluate` that do not depend on the engine's N_obs or δ: θ0 … k̂* (θ values fractions, N
    and k requests), the hazard terms and μ's as used (after clipping and fallbacks), γ, whether the crossover
    rule can be evaluated, and the flags of the fallbacks taken, in the order `evaluate` reports them."""

    theta0: float
    delta_theta: float
    theta_star: float
    n_star: int
    k_star: int
    p0: float
    eta: float
    gamma: float
    mu_l_tokens: float
    mu_o_tokens: float
    crossover_ok: bool
    flags: tuple[Flag, ...]


@lru_cache(maxsize=4096)
def _pool_terms(workload: WorkloadStats, costs: CostModel, limits: EngineLimits, n_prev: int,
                config: PolicyConfig) -> _PoolTerms:
    """`evaluate`'s terms up to k̂*: a pure function of a pool's estimate, the engine's limits, N̂* of the
    previous decision and the policy, memoised (the engines of a pool share them, so one decision per pool
    pays for them and the rest hit the cache; inputs that are not equal to themselves, NaN, only miss)."""
    flags: list[Flag] = []
    p0, eta, mu_l, mu_o = workload.p0, workload.eta, workload.mu_l_tokens, workload.mu_o_tokens
    if not (math.isfinite(p0) and math.isfinite(eta) and math.isfinite(mu_l) and math.isfinite(mu_o)):
        flags.append(Flag.NONFINITE_INPUT)
    mu_o = mu_o if math.isfinite(mu_o) and mu_o > 0.0 else 0.0
    mu_l = mu_l if math.isfinite(mu_l) and mu_l > 0.0 else 0.0
    if not (math.isfinite(p0) and p0 > 0.0):
        flags.append(Flag.HAZARD_INTERCEPT_NONPOSITIVE)
        p0 = 1.0 / mu_o if mu_o > 0.0 else 0.0
    if p0 > 1.0:
        flags.append(Flag.HAZARD_INTERCEPT_CLIPPED)
        p0 = 1.0
    if not math.isfinite(eta):
        eta = 0.0
    elif eta < 0.0:
        flags.append(Flag.HAZARD_DFR_CLIPPED)
        eta = 0.0
    usable = _usable(costs)
    if not usable:
        flags.append(Flag.ALPHA_D_NONPOSITIVE if not costs.alpha_d_s > 0.0 else Flag.COST_NONPOSITIVE)
    alpha_ok = math.isfinite(costs.alpha_d_s) and costs.alpha_d_s > 0.0 and math.isfinite(costs.alpha_p_s)
    gamma = p0 * costs.alpha_p_s / costs.alpha_d_s if alpha_ok else 0.0
    if math.isinf(gamma):
        flags.append(Flag.GAMMA_NONFINITE)
    theta0 = _solve_theta0(gamma)

    # [EB] Prop. 3.3 is derived for geometric outputs. A strongly IFR window (or a mixture after a
    # shift) fits a hazard intercept far below 1/μ_O, and the reserve ln(1/ε)/(p0²μ_L) then exceeds the
    # whole KV cache: N̂* collapses to 1 and, completions becoming rare, never recovers (measured in the
    # twin's distribution shift). The geometric law with the observed mean bounds the peak memory of IFR
    # outputs (the paper's own argument for using [EB] eq. (6) under IFR), so the memory formula uses
    # p_mem = max(p̂0, 1/μ̂_O); θ0 and Δθ keep p̂0.
    p_mem = max(p0, 1.0 / mu_o) if mu_o > 0.0 else p0
    if p_mem > p0 * 1.01:
        flags.append(Flag.MEMORY_RATE_FROM_MEAN)
    capacity = float(limits.kv_capacity_tokens)

    def batch(theta: float) -> BatchSize:
        return _batch_size(theta=theta, p0=p_mem, mu_l_tokens=mu_l, kv_capacity_tokens=capacity,
                           oom_tolerance=config.oom_tolerance, max_num_seqs=limits.max_num_seqs)

    if n_prev > 0:
        n_for_rho = n_prev
    else:
        n_for_rho = batch(clip_theta(theta0, theta_min=config.theta_min, theta_max=config.theta_max)[0]).n
    beta_d = costs.beta_d_s_per_request if math.isfinite(costs.beta_d_s_per_request) else 0.0
    rho = beta_d * n_for_rho / costs.alpha_d_s if alpha_ok else 0.0
    delta_theta, ifr_bounded = bound_delta_theta(
        delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=max(rho, 0.0)), theta0=theta0, p0=p0, eta=eta
    )
    if ifr_bounded:
        flags.append(Flag.IFR_CORRECTION_BOUNDED)
    theta_star, side = clip_theta(theta0 + delta_theta, theta_min=config.theta_min, theta_max=config.theta_max)
    if side < 0:
        flags.append(Flag.THETA_CLIPPED_LOW)
    elif side > 0:
        flags.append(Flag.THETA_CLIPPED_HIGH)
    sizing = batch(theta_star)
    # [EB] Prop. 3.3 is the geometric law's bound, conservative for IFR outputs, and by far when outputs are long
    # behind short prompts: its reserve ln(1/ε)/(p0²·μ_L) grows as μ_O²/μ_L, and at NuminaMath's shape
    # (122-token prompts, uniform 800–4,000 outputs) it is the whole KV cache (N̂* 1 on 217k tokens, EB −74%
    # against v1 in the twin) or half of it (N̂* 88 where 263 fit). Where the window's σ_O ≤ μ_O (the
    # coefficient of variation of an IFR law) the moment bound of `occupancy_batch_size` (same ε) holds too,
    # and it takes over as the reserve's share r of C grows: N̂* = P + w·(M − P) for M > P, w = 0 up to
    # r = 10% (the paper's formula in its own regime), 1 from r = 40%, linear between (no jump for N̂* to
    # flicker across). Flagged when it lifts N̂*.
    sigma_o = _finite(workload.sigma_o_tokens)
    if mu_o > 0.0 and 0.0 < sigma_o <= mu_o and capacity > 0.0 and p_mem > 0.0 and mu_l > 0.0:
        share = reserve_tokens(p0=p_mem, mu_l_tokens=mu_l, oom_tolerance=config.oom_tolerance) / capacity
        weight = min(1.0, max(0.0, (share - _OCCUPANCY_FROM_SHARE) / (_OCCUPANCY_FULL_SHARE - _OCCUPANCY_FROM_SHARE)))
        if weight > 0.0:
            occupancy = _occupancy_batch_size(
                mu_l_tokens=mu_l, mu_o_tokens=mu_o, sigma_o_tokens=sigma_o, kv_capacity_tokens=capacity,
                oom_tolerance=config.oom_tolerance, max_num_seqs=limits.max_num_seqs,
            )
            n_blend = sizing.n + math.floor(weight * (occupancy.n - sizing.n))
            if n_blend > sizing.n:
                sizing = replace(occupancy, n=n_blend, capped=occupancy.capped and n_blend == occupancy.n)
                flags.append(Flag.MEMORY_BOUND_FROM_OCCUPANCY)
    if sizing.below_one_request:
        flags.append(Flag.KV_BELOW_ONE_REQUEST)
    if sizing.capped:
        flags.append(Flag.N_CAPPED_BY_MAX_NUM_SEQS)
    return _PoolTerms(
        theta0=theta0, delta_theta=delta_theta, theta_star=theta_star, n_star=sizing.n,
        k_star=threshold_k(theta=theta_star, n=sizing.n), p0=p0, eta=eta, gamma=gamma, mu_l_tokens=mu_l,
        mu_o_tokens=mu_o, crossover_ok=usable and 0.0 < theta0 < 1.0, flags=tuple(flags),
    )


def evaluate(
    workload: WorkloadStats,
    costs: CostModel,
    limits: EngineLimits,
    *,
    n_prev: int = 0,
    n_obs: float = 0.0,
    delta_s_per_token: float = 0.0,
    config: PolicyConfig | None = None,
) -> Evaluation:
    """Evaluate θ0, Δθ, θ̂*, N̂*, k̂*, LHS, RHS and the instantaneous mode for given inputs.

    Args:
        workload: p0 (per token), η (per token²), μ_L and μ_O (tokens).
        costs: the cost model, seconds.
        limits: the engine's limits (C = kv_capacity_tokens).
        n_prev: the previous N̂* for ρ = β_d·N/α_d; ≤ 0 means none, and N* evaluated at θ0 is used.
        n_obs: N_obs for the RHS; < 1 or not finite means unobserved, and N̂* is used (flagged when it
          was given but invalid).
        delta_s_per_token: the operator margin δ (clipped to ±DELTA_LIMIT_S_PER_TOKEN, flagged).
    Returns:
        An Evaluation with finite fields and the flags of every fallback taken.
    """
    config = config or _DEFAULT_CONFIG
    pool = _pool_terms(workload, costs, limits, n_prev if n_prev > 0 else 0, config)
    flags = list(pool.flags)
    if not (math.isfinite(n_obs) and n_obs >= 1.0):
        if n_obs != 0.0:
            flags.append(Flag.N_OBS_INVALID)
        n_obs = float(pool.n_star)
    delta, out_of_range = resolve_delta(delta_s_per_token, default_s_per_token=config.default_delta_s_per_token)
    if out_of_range:
        flags.append(Flag.DELTA_OUT_OF_RANGE)
    terms = None
    if pool.crossover_ok:
        terms = crossover_terms(costs=costs, theta0=pool.theta0, mu_l_tokens=pool.mu_l_tokens,
                                mu_o_tokens=pool.mu_o_tokens, n_obs=n_obs)
    if terms is None:
        flags.append(Flag.CROSSOVER_NOT_EVALUATED)
    lhs = terms.lhs_s_per_token if terms else 0.0
    rhs = terms.rhs_s_per_token if terms else 0.0
    return Evaluation(
        theta0=_finite(pool.theta0),
        delta_theta=_finite(pool.delta_theta),
        theta_star=_finite(pool.theta_star),
        n_star=pool.n_star,
        k_star=pool.k_star,
        lhs_s_per_token=lhs,
        rhs_s_per_token=rhs,
        delta_s_per_token=delta,
        decode_ratio=terms.decode_ratio if terms else 0.0,
        beta_eb_w_s_per_token=terms.beta_eb_w_s_per_token if terms else 0.0,
        beta_mb_e_s_per_token=terms.beta_mb_e_s_per_token if terms else 0.0,
        n_obs=_finite(n_obs),
        # Without crossover terms there is no evidence against stock behaviour.
        mode_instant=instantaneous_mode(lhs_s_per_token=lhs, rhs_s_per_token=rhs, delta_s_per_token=delta)
        if terms
        else Mode.MB,
        flags=tuple(flags),
        p0=_finite(pool.p0),
        eta=_finite(pool.eta),
        gamma=_finite(pool.gamma),
    )


@dataclass(frozen=True, slots=True)
class _Pinned:
    k: int | None
    n: int | None
    invalid: bool


_NOT_PINNED = _Pinned(k=None, n=None, invalid=False)


def _validated_pin(intent: OperatorIntent, limits: EngineLimits) -> _Pinned:
    """Pinned k and N, each kept only when 1 ≤ N ≤ max_num_seqs and 1 ≤ k (≤ N when both are set)."""
    k, n, invalid = intent.pin.k, intent.pin.n, False
    if k is None and n is None:
        return _NOT_PINNED
    if n is not None and not 1 <= n <= limits.max_num_seqs:
        n, invalid = None, True
    if k is not None and (k < 1 or (n is not None and k > n)):
        k, invalid = None, True
    return _Pinned(k=k, n=n, invalid=invalid)


def decide(
    observations: Observations,
    state: PolicyState,
    now_s: float,
    *,
    intent: OperatorIntent | None = None,
    config: PolicyConfig | None = None,
    budget_sweep: Sequence[SweepPoint] = (),
    fit: HazardFit | None,
    established: bool = False,
) -> tuple[Decision, PolicyState]:
    """One decision for one engine or pool, and the policy state to carry to the next.

    `fit`: the hazard fit of the engine's pool, from its length histograms
    (`core.hazard.fit_hazard_histogram`); None when there is none (no completion yet): too little data, below.

    Cold start: until the fit holds config.min_samples completions, mode MB (stock
    behaviour) with reason insufficient_data, unless [EB] eq. (8) picks EB at every workload the engine can
    serve (`controlplane.core.cold_start`; the cost model and the occupancy are known, the lengths are not,
    but for the lower bound on μ_O the completions and running requests so far prove: the fit's, or without
    a fit `Observations.mu_o_lower_tokens`. The occupancy is N_obs or, when more, `Observations.n_offered`;
    diagnostics.n_obs shows the one used): then EB
    with reason cold_start_eb, k and N as an EB pin without data gets them (θ_min, max_num_seqs, the memory
    guard), and the least favourable point's LHS and RHS in the diagnostics. Hysteresis and cooldown apply
    as for the full rule. With enough data but no usable cost model, MB with reason no_cost_model.
    `established`: the workload is not new although the fit holds fewer than min_samples completions (a
    window re-based at a detected shift: the completions before the change point located it); the fit is
    then used whatever its size, and diagnostics.num_samples still counts the completions it holds.
    Otherwise EB+ chooses by [EB] eq. (8) with hysteresis and cooldown (reasons crossover_eb, crossover_mb,
    hysteresis_hold, cooldown_hold). An operator pin overrides the mode (reason operator_pin);
    PASSTHROUGH pins leave the engine untouched. A prefill or a decode instance of disaggregated prefill/decode
    (`limits.kv_role`) keeps only the rules its role leaves (`controlplane.core.kv_role`).

    Guarantees, for any observations: 1 ≤ k ≤ N ≤ max_num_seqs, B_cap ≤ B_max ≤ max_num_batched_tokens,
    finite diagnostics, no exception.
    """
    config = config or PolicyConfig()
    intent = intent or OperatorIntent()
    limits = observations.limits
    flags: list[Flag] = []
    if observations.num_rejected_samples > 0:
        flags.append(Flag.SAMPLES_REJECTED)
    budget, clamped = _budget_policy(
        max_num_batched_tokens=limits.max_num_batched_tokens,
        sweep=tuple(budget_sweep),
        max_model_len_tokens=limits.max_model_len_tokens,
    )
    if clamped:
        flags.append(Flag.BUDGET_CLAMPED)
    if intent.budget_cap_scale != 1.0 and math.isfinite(intent.budget_cap_scale) and intent.budget_cap_scale > 0:
        budget = _scaled_cap(budget, intent, limits.max_num_batched_tokens)
        flags.append(Flag.BUDGET_CAP_FROM_OBJECTIVE)
    delta, out_of_range = resolve_delta(
        intent.delta_s_per_token, default_s_per_token=config.default_delta_s_per_token
    )
    delta_source = intent.delta_source if intent.delta_s_per_token is not None else DeltaSource.DEFAULT
    if out_of_range:
        flags.append(Flag.DELTA_OUT_OF_RANGE)
    pinned = _validated_pin(intent, limits)
    if pinned.invalid:
        flags.append(Flag.PIN_INVALID)

    if fit is not None and not isinstance(fit, HazardFit):
        raise TypeError(f"fit must be a HazardFit or None, got {type(fit).__name__}")
    costs = observations.costs
    evaluation: Evaluation | None = None
    # The diagnostics' fields, gathered as they are known and built once at the end.
    diagnosed: dict[str, float] = {"num_rejected_samples": max(0, observations.num_rejected_samples)}
    online_mode, reason, last_switch_s = state.mode, Reason.INSUFFICIENT_DATA, state.last_switch_s
    n_prev = state.n_prev
    if fit is not None:
        if fit.intercept_fallback:
            flags.append(Flag.HAZARD_INTERCEPT_NONPOSITIVE)
        if fit.slope_clipped:
            flags.append(Flag.HAZARD_DFR_CLIPPED)
        if fit.shift_transient:
            flags.append(Flag.HAZARD_SHIFT_TRANSIENT)
        if fit.lognormal_tail:
            flags.append(Flag.HAZARD_LOGNORMAL_TAIL)
        if fit.slope_unconfirmed:
            flags.append(Flag.HAZARD_SLOPE_UNCONFIRMED)
    enough_data = fit is not None and (established or fit.stats.num_samples >= config.min_samples)
    cold = None
    if not enough_data:
        online_mode = Mode.MB
        floor = fit.mu_o_lower_tokens if fit is not None else observations.mu_o_lower_tokens
        occupancy = _cold_start_occupancy(observations)
        if config.cold_start_crossover and costs is not None:  # an unusable cost model gives no verdict
            cold = least_favourable_to_eb(costs, max_model_len_tokens=limits.max_model_len_tokens,
                                          n_obs=occupancy, delta_s_per_token=delta, mu_o_floor_tokens=floor)
        if cold is not None:
            choice = select_mode(
                current=state.mode, last_switch_s=state.last_switch_s, now_s=now_s,
                lhs_s_per_token=cold.lhs_s_per_token, rhs_s_per_token=cold.rhs_s_per_token,
                delta_s_per_token=delta, hysteresis_rel=config.hysteresis_rel,
                hysteresis_abs_s_per_token=config.hysteresis_abs_s_per_token, cooldown_s=config.cooldown_s,
            )
            online_mode = choice.mode
            if online_mode == Mode.EB:
                reason = Reason.COLD_START_EB
            if choice.switched:
                last_switch_s = now_s
    elif costs is None or not _usable(costs):
        online_mode, reason = Mode.MB, Reason.NO_COST_MODEL
        if costs is not None:
            flags.append(Flag.ALPHA_D_NONPOSITIVE if not costs.alpha_d_s > 0.0 else Flag.COST_NONPOSITIVE)
    else:
        evaluation = evaluate(
            fit.stats, costs, limits, n_prev=state.n_prev, n_obs=observations.n_obs,
            delta_s_per_token=delta, config=config,
        )
        flags.extend(f for f in evaluation.flags if f not in flags)
        choice = select_mode(
            current=state.mode, last_switch_s=state.last_switch_s, now_s=now_s,
            lhs_s_per_token=evaluation.lhs_s_per_token, rhs_s_per_token=evaluation.rhs_s_per_token,
            delta_s_per_token=delta, hysteresis_rel=config.hysteresis_rel,
            hysteresis_abs_s_per_token=config.hysteresis_abs_s_per_token, cooldown_s=config.cooldown_s,
        )
        online_mode, reason = choice.mode, choice.reason
        if choice.switched:
            last_switch_s = now_s
        n_prev = evaluation.n_star
    if fit is not None:
        stats = fit.stats
        diagnosed.update(
            p0=_finite(stats.p0), eta=_finite(stats.eta), mu_l_tokens=_finite(stats.mu_l_tokens),
            mu_o_tokens=_finite(stats.mu_o_tokens), sigma_o_tokens=_finite(stats.sigma_o_tokens),
            t95_tokens=_finite(stats.t95_tokens), num_samples=stats.num_samples,
            mu_o_lower_tokens=_finite(fit.mu_o_lower_tokens),
        )
    if evaluation is not None:
        diagnosed.update(
            theta0=evaluation.theta0, delta_theta=evaluation.delta_theta, theta_star=evaluation.theta_star,
            n_star=evaluation.n_star, k_star=evaluation.k_star, lhs_s_per_token=evaluation.lhs_s_per_token,
            rhs_s_per_token=evaluation.rhs_s_per_token, n_obs=evaluation.n_obs,
        )
    elif cold is not None:
        diagnosed.update(lhs_s_per_token=cold.lhs_s_per_token, rhs_s_per_token=cold.rhs_s_per_token,
                         n_obs=_finite(occupancy), mu_o_lower_tokens=max(1.0, _finite(floor)),
                         cold_start_mu_l_tokens=_finite(cold.mu_l_tokens),
                         cold_start_mu_o_tokens=_finite(cold.mu_o_tokens), cold_start_p0=_finite(cold.p0))
    diagnostics = Diagnostics(**diagnosed)

    mode = online_mode
    if intent.pin.mode is not None and (intent.pin.reason is None or intent.pin.mode != online_mode):
        mode, reason = intent.pin.mode, intent.pin.reason or Reason.OPERATOR_PIN
    if mode == Mode.MB and 0.0 < intent.budget_cap_scale < 1.0:
        budget = _scaled_max(budget, intent, limits.max_num_batched_tokens)
        flags.append(Flag.BUDGET_MAX_FROM_OBJECTIVE)
    n_computed = evaluation.n_star if evaluation is not None else limits.max_num_seqs
    n_guard = state.n_guard
    if config.memory_guard and state.n_eb_in_force > 0:
        n_guard = update_memory_guard(
            cap=n_guard, num_preemptions=observations.num_preemptions, n_in_force=state.n_eb_in_force,
            n_star=n_computed, num_running=observations.num_running, decrease_factor=config.guard_decrease_factor,
            increase_fraction=config.guard_increase_fraction,
        )
    n_eb_in_force = 0
    if pinned.n is not None:
        n = pinned.n
    elif mode == Mode.EB:
        n = n_computed
        if 0 < n_guard < n:
            n = n_guard
            flags.append(Flag.MEMORY_GUARD)
        n_eb_in_force = n
    else:
        n = limits.max_num_seqs
    theta = evaluation.theta_star if evaluation is not None else config.theta_min
    k = pinned.k if pinned.k is not None else threshold_k(theta=theta, n=n)
    k = min(max(1, k), n)
    decision = Decision(
        mode=mode, k=k, n=n, budget=budget, delta_s_per_token=delta, delta_source=delta_source,
        reason=reason, flags=tuple(flags), diagnostics=diagnostics, advisory=intent.pin.advisory,
    )
    new_state = PolicyState(n_prev=n_prev, mode=online_mode, last_switch_s=last_switch_s, n_guard=n_guard,
                            n_eb_in_force=n_eb_in_force)
    if limits.kv_role in ROLES_WITHOUT_EB:  # a prefill or a decode instance (controlplane.core.kv_role)
        return role_decision(decision, new_state, limits=limits, fit=fit, enough_data=enough_data, pin=intent.pin,
                             pinned_k=pinned.k, pinned_n=pinned.n, config=config)
    return decision, new_state


def _cold_start_occupancy(observations: Observations) -> float:
    """The occupancy the cold-start verdict is taken at: N_obs, or the requests the engine holds (running and,
    while its KV cache has room, waiting: `Observations.n_offered`) when more. Under stock batching a new
    engine admits a few prompts a step (its token budget), so its running count ramps for tens of seconds
    under a queue that an EB batch of max_num_seqs would admit in its first prefill phase; the N_obs EMA
    lags that ramp again. Non-finite or negative values count as 0."""
    values = [v for v in (observations.n_obs, observations.n_offered) if math.isfinite(v) and v > 0.0]
    return max(values, default=0.0)

