"""Value types of the decision core.

Every type here is a frozen dataclass (or an enum) with units in its field names. Adapters convert
protobuf messages, Redis hashes and CLI flags into these types at the edge; nothing outside the core's
own modules is imported here. No I/O, no clock reads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from controlplane.protocol import KvRole, Mode  # the one vocabularies of roles and modes, shared with the agent

OTHER_MODE = {Mode.MB: Mode.EB, Mode.EB: Mode.MB}  # each batching mode to the other


class Reason(enum.StrEnum):
    """Primary reason code of a decision (one per decision)."""

    INSUFFICIENT_DATA = "insufficient_data"
    NO_COST_MODEL = "no_cost_model"
    CROSSOVER_EB = "crossover_eb"
    CROSSOVER_MB = "crossover_mb"
    # Cold start, and [EB] eq. (8) picks EB at every length the engine serves (controlplane.core.cold_start).
    COLD_START_EB = "cold_start_eb"
    HYSTERESIS_HOLD = "hysteresis_hold"
    COOLDOWN_HOLD = "cooldown_hold"
    OPERATOR_PIN = "operator_pin"
    # The pool's guarded rollout holds the engine on its established mode (a change under test on a canary, or
    # rolled back recently) while the model asks for another (controlplane.loop.rollout).
    ROLLOUT_HOLD = "rollout_hold"
    # A disaggregated engine's role decides its mode (controlplane.core.kv_role): a decode instance runs MB with
    # the admission cap N its lengths allow; a prefill instance runs MB with the budget B_max in every step.
    KV_CONSUMER = "kv_consumer"
    KV_PRODUCER = "kv_producer"


class Flag(enum.StrEnum):
    """Secondary codes: a degenerate input was rejected, clipped or replaced by a fallback."""

    NONFINITE_INPUT = "nonfinite_input"
    HAZARD_INTERCEPT_NONPOSITIVE = "hazard_intercept_nonpositive"
    HAZARD_INTERCEPT_CLIPPED = "hazard_intercept_clipped"  # p0 above 1 per token, clipped to 1
    GAMMA_NONFINITE = "gamma_nonfinite"  # p0·α_p/α_d overflowed: θ0 taken at its limit (just below 1)
    CROSSOVER_NOT_EVALUATED = "crossover_not_evaluated"  # LHS/RHS not computable: the rule reads MB (stock)
    HAZARD_DFR_CLIPPED = "hazard_dfr_clipped"
    ALPHA_D_NONPOSITIVE = "alpha_d_nonpositive"
    COST_NONPOSITIVE = "cost_nonpositive"
    THETA_CLIPPED_LOW = "theta_clipped_low"
    THETA_CLIPPED_HIGH = "theta_clipped_high"
    IFR_CORRECTION_BOUNDED = "ifr_correction_bounded"  # Δθ cut: η/p0² > 1 and Δθ > θ0 (threshold.py)
    # The window was re-based at a detected shift and still holds the requests in flight then: η = 0 and
    # μ_O = 1/p0 (hazard.fit_hazard_histogram(shift_transient=True)).
    HAZARD_SHIFT_TRANSIENT = "hazard_shift_transient"
    # μ_O and σ_O continue the window's Kaplan–Meier curve past its last supported age by a fitted log-normal
    # law instead of a constant hazard, and p0, η are that law's hazard line (hazard.fit_hazard_histogram).
    HAZARD_LOGNORMAL_TAIL = "hazard_lognormal_tail"
    # A significant hazard slope the window ending a bucket earlier did not show: not kept (η = 0) until two
    # windows in a row show it (hazard.fit_hazard_histogram(slope_sign_before=), loop.estimate.Window.fit).
    HAZARD_SLOPE_UNCONFIRMED = "hazard_slope_unconfirmed"
    KV_BELOW_ONE_REQUEST = "kv_below_one_request"
    N_CAPPED_BY_MAX_NUM_SEQS = "n_capped_by_max_num_seqs"
    MEMORY_RATE_FROM_MEAN = "memory_rate_from_mean"
    # [EB] Prop. 3.3's reserve takes over 10% of C and σ_O ≤ μ_O: N̂* lifted towards the moment bound (policy.py).
    MEMORY_BOUND_FROM_OCCUPANCY = "memory_bound_from_occupancy"
    N_OBS_INVALID = "n_obs_invalid"
    DELTA_OUT_OF_RANGE = "delta_out_of_range"
    SAMPLES_REJECTED = "samples_rejected"
    PIN_INVALID = "pin_invalid"
    BUDGET_CLAMPED = "budget_clamped"
    MEMORY_GUARD = "memory_guard"
    # EB's phase switch does nothing on this engine's KV-transfer role (a decode or a prefill instance): the
    # crossover rule's verdict and k are not acted on (controlplane.core.kv_role).
    EB_MOOT = "eb_moot"
    # B_cap is the policy's scaled by a latency objective's loop (loop.objective), within its budget bounds.
    BUDGET_CAP_FROM_OBJECTIVE = "budget_cap_from_objective"
    BUDGET_MAX_FROM_OBJECTIVE = "budget_max_from_objective"


class DeltaSource(enum.StrEnum):
    """Where the margin δ in force came from (most specific scope wins)."""

    DEFAULT = "default"
    FLEET = "fleet"
    POOL = "pool"
    ENGINE = "engine"
    OBJECTIVE = "objective"  # set by a pool's latency-objective loop (an explicit override wins over it)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Iteration-time model of one (model, accelerator) pair, in seconds.

    Prefill step:  alpha_p_s + beta_p_s_per_token · prompt tokens.
    Decode step:   alpha_d_s + beta_d_s_per_request · decoding requests.
    Mixed step:    alpha_mb_s + beta_mb_e(r) · tokens, beta_mb_e(r) = c0 + c1·r + c2·r² (s/token),
                   r = decode tokens / all tokens of the step.
    """

    alpha_p_s: float
    beta_p_s_per_token: float
    alpha_d_s: float
    beta_d_s_per_request: float
    alpha_mb_s: float
    mb_coeffs_s_per_token: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def beta_mb_e(self, decode_ratio: float) -> float:
        """Effective marginal cost of a mixed step at decode ratio r, in seconds per token."""
        c0, c1, c2 = self.mb_coeffs_s_per_token
        return c0 + c1 * decode_ratio + c2 * decode_ratio * decode_ratio


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """Start-up limits of an engine (or the most conservative ones of a pool).

    kv_capacity_tokens: KV-cache blocks × block size. max_model_len_tokens: 0 when unknown.
    kv_role: the engine's role in disaggregated prefill/decode (NONE: no KV connector), which decides what its
      decisions may steer (`controlplane.core.kv_role`).
    """

    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    max_model_len_tokens: int = 0
    kv_role: KvRole = KvRole.NONE

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(
                f"engine limits need max_num_seqs ≥ 1 and max_num_batched_tokens ≥ 1, got "
                f"{self.max_num_seqs} and {self.max_num_batched_tokens}"
            )
        if self.kv_capacity_tokens < 0 or self.max_model_len_tokens < 0:
            raise ValueError(
                f"kv_capacity_tokens and max_model_len_tokens must be ≥ 0, got "
                f"{self.kv_capacity_tokens} and {self.max_model_len_tokens}"
            )


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    """Workload parameters the formulas need: hazard fit h(t) = p0 + η·t and length moments (tokens)."""

    p0: float
    eta: float
    mu_l_tokens: float
    mu_o_tokens: float
    sigma_o_tokens: float = 0.0
    t95_tokens: float = 0.0
    num_samples: int = 0


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    """P-PAS(+) token-budget policy the agent evaluates every engine step.

    budget = b_cap_tokens if (N_p ≥ n_th ∧ N_d > 0) ∨ (one running prefill ∧ N_d ≥ n_d_large
    ∧ remaining prefill ≥ t_large_tokens), else b_max_tokens. t_large_tokens = 0 disables P-PAS+.
    """

    b_max_tokens: int
    b_cap_tokens: int
    n_th: int = 2
    t_large_tokens: int = 0
    n_d_large: int = 2


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """Scheduler state of one engine step, as the P-PAS rule sees it."""

    num_running_prefills: int
    num_running_decodes: int
    largest_remaining_prefill_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ModePin:
    """An operator's pin. mode None = not pinned; k/n None = computed; advisory = decide, do not apply.
    reason None: an operator's pin (always applies, reason operator_pin); else a hold that applies only where
    the model asks for another mode, with that reason."""

    mode: Mode | None = None
    k: int | None = None
    n: int | None = None
    advisory: bool = False
    reason: Reason | None = None


@dataclass(frozen=True, slots=True)
class OperatorIntent:
    """Overrides in force for one engine, already resolved across scopes by the adapter."""

    delta_s_per_token: float | None = None
    delta_source: DeltaSource = DeltaSource.DEFAULT
    pin: ModePin = field(default_factory=ModePin)
    # A latency objective's second lever, P-PAS's budget pair: B_cap = the policy's × this, then clamped to
    # [max(budget_min_tokens, the agent's floor), min(budget_max_tokens or B_max, B_max)] (1.0: untouched); a
    # scale below 1 (TPOT) scales MB's B_max too, kept at least B_cap (`core.policy._scaled_max`).
    budget_cap_scale: float = 1.0
    budget_min_tokens: int = 0
    budget_max_tokens: int = 0


@dataclass(frozen=True, eq=False)
class Observations:
    """What the controller has observed of one engine (or a pool), at decision time.

    The request lengths are not here: the hazard fit of a pool's length histograms
    (`controlplane.core.hazard.fit_hazard_histogram`) is passed to decide() beside these observations.

    costs: the calibrated or fitted cost model; None when none is known yet.
    n_obs: EMA of observed running requests (N_obs); 0 when not observed.
    n_offered: EMA of the requests the engine holds, running or waiting, capped at max_num_seqs, counting the
      waiting ones only while its KV cache has room (the occupancy an EB batch of max_num_seqs reaches while
      the engine's own admission still ramps); 0 when not observed. Read by the cold-start verdict alone:
      the full rule uses N_obs.
    mu_o_lower_tokens: a lower confidence bound on μ_O known without a hazard fit (a pool's running requests
      before its first completion); the cold-start verdict reads it when decide() has no fit. 1: none.
    num_rejected_samples: samples the estimators rejected since the last decision (counted, not used).
    num_preemptions: requests the engine preempted since the last decision (KV cache exhausted); feeds the
      memory guard (`controlplane.core.memory_guard`).
    num_running: the engine's running requests as last reported (0: unknown, as for a merged pool); the
      memory guard holds while the engine runs more than the N in force.
    """

    costs: CostModel | None
    limits: EngineLimits
    n_obs: float = 0.0
    num_rejected_samples: int = 0
    num_preemptions: int = 0
    n_offered: float = 0.0
    mu_o_lower_tokens: float = 1.0
    num_running: int = 0


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Every term of the formulas for one set of inputs (what `controlplane plan` prints).

    mode_instant is the instantaneous crossover rule: MB when lhs < rhs + delta, else EB.
    Units: lhs/rhs/delta in seconds per token; n/k in requests; the θ values are fractions.
    """

    theta0: float
    delta_theta: float
    theta_star: float
    n_star: int
    k_star: int
    lhs_s_per_token: float
    rhs_s_per_token: float
    delta_s_per_token: float
    decode_ratio: float
    beta_eb_w_s_per_token: float
    beta_mb_e_s_per_token: float
    n_obs: float
    mode_instant: Mode
    flags: tuple[Flag, ...] = ()
    # The hazard terms and γ = p0·α_p/α_d as used (after clipping and fallbacks), per token / per token².
    p0: float = 0.0
    eta: float = 0.0
    gamma: float = 0.0


@dataclass(frozen=True, slots=True)
class Diagnostics:
    """The explain view of a decision: every input and term, all finite (0.0 when not computed)."""

    p0: float = 0.0
    eta: float = 0.0
    mu_l_tokens: float = 0.0
    mu_o_tokens: float = 0.0
    sigma_o_tokens: float = 0.0
    t95_tokens: float = 0.0
    theta0: float = 0.0
    delta_theta: float = 0.0
    theta_star: float = 0.0
    n_star: int = 0
    k_star: int = 0
    lhs_s_per_token: float = 0.0
    rhs_s_per_token: float = 0.0
    n_obs: float = 0.0
    num_samples: int = 0
    num_rejected_samples: int = 0
    # Lower confidence bound on μ_O that the completions and running requests prove (1.0: nothing proven;
    # 0.0: not computed).
    mu_o_lower_tokens: float = 0.0
    # The cold-start rule's least favourable workload (0.0 when the rule did not run): LHS and RHS above are
    # its terms of [EB] eq. (8).
    cold_start_mu_l_tokens: float = 0.0
    cold_start_mu_o_tokens: float = 0.0
    cold_start_p0: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What one engine (or pool) should do until the next decision.

    k: EB phase-switch threshold (requests), 1 ≤ k ≤ n. n: admission cap (requests),
    1 ≤ n ≤ max_num_seqs. advisory: compute and report, do not apply.
    """

    mode: Mode
    k: int
    n: int
    budget: BudgetPolicy
    delta_s_per_token: float
    delta_source: DeltaSource
    reason: Reason
    flags: tuple[Flag, ...]
    diagnostics: Diagnostics
    advisory: bool = False


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the online policy carries from one decision to the next.

    n_prev: the previous N̂* (0 before the first), used for ρ in the IFR correction.
    mode: the online mode EB+ is in; last_switch_s: when it last switched (controller clock, seconds).
    n_guard: the memory guard's cap on the EB batch size (0: none). n_eb_in_force: N of the last decision
    when it was an EB decision with a computed N (0 otherwise: preemptions then are not the guard's).
    """

    n_prev: int = 0
    mode: Mode = Mode.MB
    last_switch_s: float = float("-inf")
    n_guard: int = 0
    n_eb_in_force: int = 0


# Bounds of the operator margin δ, seconds per token. Published |LHS − RHS| values are ~1e-6..1e-4 s/token;
# a margin beyond ±1e-2 s/token (10 ms per token) would pin the mode and is refused as a mistake.
DELTA_LIMIT_S_PER_TOKEN = 1e-2


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Tunables of the online policy; validated on construction (bad values raise ValueError).

    min_samples: completions needed before leaving the cold-start MB mode. 400 makes the geometric
      estimate of p0 accurate to about 5% (relative standard error √((1−p0)/n)).
    theta_min / theta_max: clip range of θ̂*.
    oom_tolerance: ε of [EB] Prop. 3.3, the tolerated probability of exceeding the KV capacity.
    default_delta_s_per_token: δ when no operator override applies.
    hysteresis_rel / hysteresis_abs_s_per_token / cooldown_s: EB+ anti-flap band and minimum dwell time.
    cold_start_crossover: before min_samples completions, evaluate [EB] eq. (8) over every length the engine
      serves (`controlplane.core.cold_start`) and run EB when it wins at all of them (reason cold_start_eb);
      False: MB until min_samples, whatever the rule.
    memory_guard: cap the computed EB batch size when the engine preempts (`controlplane.core.memory_guard`);
      guard_decrease_factor in (0, 1) and guard_increase_fraction in (0, 1] are its AIMD steps.
    """

    min_samples: int = 400
    theta_min: float = 0.01
    theta_max: float = 0.8
    oom_tolerance: float = 0.01
    default_delta_s_per_token: float = 0.0
    hysteresis_rel: float = 0.05
    hysteresis_abs_s_per_token: float = 1e-7
    cooldown_s: float = 30.0
    cold_start_crossover: bool = True
    memory_guard: bool = True
    guard_decrease_factor: float = 0.85
    guard_increase_fraction: float = 0.02

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be ≥ 1, got {self.min_samples}")
        if not 0.0 < self.theta_min <= self.theta_max < 1.0:
            raise ValueError(
                f"need 0 < theta_min ≤ theta_max < 1, got theta_min={self.theta_min}, theta_max={self.theta_max}"
            )
        if not 0.0 < self.oom_tolerance < 1.0:
            raise ValueError(f"oom_tolerance must be in (0, 1), got {self.oom_tolerance}")
        if not abs(self.default_delta_s_per_token) <= DELTA_LIMIT_S_PER_TOKEN:
            raise ValueError(
                f"default_delta_s_per_token must be within ±{DELTA_LIMIT_S_PER_TOKEN}, "
                f"got {self.default_delta_s_per_token}"
            )
        if not (self.hysteresis_rel >= 0.0 and self.hysteresis_abs_s_per_token >= 0.0 and self.cooldown_s >= 0.0):
            raise ValueError("hysteresis_rel, hysteresis_abs_s_per_token and cooldown_s must be ≥ 0")
        if not (0.0 < self.guard_decrease_factor < 1.0 and 0.0 < self.guard_increase_fraction <= 1.0):
            raise ValueError(f"need 0 < guard_decrease_factor < 1 and 0 < guard_increase_fraction ≤ 1, got "
                             f"{self.guard_decrease_factor} and {self.guard_increase_fraction}")
