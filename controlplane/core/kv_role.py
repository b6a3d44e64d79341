"""What an engine's role in disaggregated prefill/decode leaves of the policy, applied to `policy.decide`'s decision.

vLLM's disaggregated prefill/decode runs a request on two engines: a prefill instance (kv_producer) computes
its prompt and sends the prompt's KV through a KV connector; a decode instance (kv_consumer) receives that KV
and decodes. Each instance sees half of the workload the papers' rules were derived for, so each keeps only
the rules that still act on it (`role_decision`):

- CONSUMER (decode instance). Its requests arrive with their prompt's KV computed elsewhere; it recomputes
  locally only what the transfer does not cover (the prompt's last, partial block; a whole prompt when a load
  fails under vLLM's kv_load_failure_policy=recompute, or when the request was preempted).
  Moot: EB's phase switch. With no prefill phase worth separating from the decodes, the crossover rule
  ([EB] eq. (8)), θ̂* and k̂* act on nothing: the mode is MB, k = 1 (unused), flag eb_moot, and the EB terms
  are left out of the diagnostics.
  Still applies: the admission cap N. Decoding requests grow their KV, and a preempted request loses the KV
  it received and recomputes its whole prompt here, the very prefill the split was meant to avoid. Under MB
  each slot is refilled as its request finishes, which is the model of `batch_size.occupancy_batch_size`: N
  is that bound at ε = oom_tolerance on the pool's μ_L, μ_O and σ_O (no cost model needed) once the fit
  holds min_samples completions or is established (reason kv_consumer; diagnostics.n_star = N); before that
  N = max_num_seqs (reason insufficient_data). The P-PAS budget still applies, to the prefills recomputed
  locally: B_cap holds them back while decodes run (its [PPAS] purpose).
- PRODUCER (prefill instance). Its requests end at their first token (a proxy asks it for one) and their KV
  leaves with them, so it decodes next to nothing.
  Moot: EB's phase switch and k (there is no decode phase to switch from): MB, k = 1, flag eb_moot.
  What steers it is the budget under prefill pressure: every step is prefill work, and P-PAS's cap B_cap
  exists to protect running decodes, of which a prefill instance has none worth a smaller chunk: the budget
  is B_max in every step (B_cap = B_max), the tokens each prefill step computes. N = max_num_seqs: a
  request's KV does not grow after its prefill (the bound N is for), and vLLM admits a prompt only when its
  blocks are free (reason kv_producer).
- BOTH (kv_both) and NONE (no KV connector): whole requests run here; `decide`'s decision, unchanged.

An operator pin still wins: its mode, and its k and N where given (else the role's N and k = 1, θ̂* being moot);
the flag eb_moot still says what EB does here. The memory guard, which follows EB's N̂*, does not run for
these roles. Pure: no I/O, no clock; never raises for any decision `decide` returns.
"""

from __future__ import annotations

from dataclasses import replace

from controlplane.core.batch_size import occupancy_batch_size
from controlplane.core.hazard import HazardFit
from controlplane.core.types import (
    Decision,
    Diagnostics,
    EngineLimits,
    Flag,
    KvRole,
    Mode,
    ModePin,
    PolicyConfig,
    PolicyState,
    Reason,
)

# The roles whose decisions differ from `decide`'s.
ROLES_WITHOUT_EB = frozenset({KvRole.CONSUMER, KvRole.PRODUCER})
# Flags of EB's batch sizing, which does not size these roles' N (their own sizing sets its flags again).
_EB_SIZING_FLAGS = frozenset({Flag.KV_BELOW_ONE_REQUEST, Flag.N_CAPPED_BY_MAX_NUM_SEQS,
                              Flag.MEMORY_BOUND_FROM_OCCUPANCY, Flag.MEMORY_GUARD})
# The diagnostics of EB's rule, moot for these roles (0: not computed).
_NO_EB_TERMS = {"theta0": 0.0, "delta_theta": 0.0, "theta_star": 0.0, "n_star": 0, "k_star": 0,
                "lhs_s_per_token": 0.0, "rhs_s_per_token": 0.0, "cold_start_mu_l_tokens": 0.0,
                "cold_start_mu_o_tokens": 0.0, "cold_start_p0": 0.0}


def role_decision(decision: Decision, state: PolicyState, *, limits: EngineLimits, fit: HazardFit | None,
                  enough_data: bool, pin: ModePin, pinned_k: int | None, pinned_n: int | None,
                  config: PolicyConfig) -> tuple[Decision, PolicyState]:
    """`decide`'s decision and state as the engine's role (`limits.kv_role`) leaves them (module docstring).

    Args:
        decision, state: what `decide` computed for the engine.
        fit: the pool's hazard fit (None: no completion yet); enough_data: it holds min_samples completions or
            is established (as `decide` judged it).
        pin: the operator intent's pin; pinned_k / pinned_n: its k and N where valid for the engine (None
            otherwise, as `decide` validated them).
        config: the policy (oom_tolerance sizes a consumer's N).
    Returns:
        (decision, state): unchanged for roles BOTH and NONE; else MB (unless an operator pinned a mode), the
        role's N, k and budget, its reason and the flag eb_moot; the state's online mode MB (never EB), no EB
        N in force for the memory guard.
    """
    role = limits.kv_role
    if role not in ROLES_WITHOUT_EB:
        return decision, state
    flags = [f for f in decision.flags if f not in _EB_SIZING_FLAGS]
    diagnostics: Diagnostics = replace(decision.diagnostics, **_NO_EB_TERMS)
    budget, reason, n = decision.budget, Reason.KV_PRODUCER, limits.max_num_seqs
    if role is KvRole.CONSUMER:
        reason = Reason.INSUFFICIENT_DATA
        if enough_data and fit is not None:
            stats = fit.stats
            sizing = occupancy_batch_size(
                mu_l_tokens=stats.mu_l_tokens, mu_o_tokens=stats.mu_o_tokens, sigma_o_tokens=stats.sigma_o_tokens,
                kv_capacity_tokens=float(limits.kv_capacity_tokens), oom_tolerance=config.oom_tolerance,
                max_num_seqs=limits.max_num_seqs)
            n, reason = sizing.n, Reason.KV_CONSUMER
            diagnostics = replace(diagnostics, n_star=n)
            if sizing.below_one_request:
                flags.append(Flag.KV_BELOW_ONE_REQUEST)
            if sizing.capped:
                flags.append(Flag.N_CAPPED_BY_MAX_NUM_SEQS)
    else:
        budget = replace(budget, b_cap_tokens=budget.b_max_tokens)
    flags.append(Flag.EB_MOOT)
    operator_pinned = pin.mode is not None and pin.reason is None
    mode = decision.mode if operator_pinned else Mode.MB
    if operator_pinned:
        reason = decision.reason
    if pinned_n is not None:
        n = pinned_n
    k = min(pinned_k, n) if pinned_k is not None else 1
    role_state = replace(state, mode=Mode.MB, n_eb_in_force=0)
    return replace(decision, mode=mode, k=k, n=n, budget=budget, reason=reason, flags=tuple(flags),
                   diagnostics=diagnostics), role_state
