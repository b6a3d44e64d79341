"""EB/MB crossover ([EB] Prop. 3.4, [EB] eq. (8)) and the online EB+ mode selector.

LHS = β_MB^e(r̂) − β_EB^w, the marginal cost of co-locating prefill and decode tokens.
RHS = [(α_p + α_d·ζ·μ_O)/(θ0·N_obs) − α_MB·(1 + μ_O)/N_obs] / (μ_L + μ_O), MB's amortised fixed-cost
advantage, O(1/N_obs). MB wins when LHS < RHS + δ (δ > 0 favours TTFT/MB, δ < 0 throughput/EB).
All terms are in seconds per token. Pure: no I/O, time is passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.core.types import CostModel, Mode, Reason


@dataclass(frozen=True, slots=True)
class CrossoverTerms:
    """Both sides of the crossover rule and the quantities they are made of (s/token; r dimensionless)."""

    lhs_s_per_token: float
    rhs_s_per_token: float
    decode_ratio: float
    beta_eb_w_s_per_token: float
    beta_mb_e_s_per_token: float


def crossover_terms(
    *, costs: CostModel, theta0: float, mu_l_tokens: float, mu_o_tokens: float, n_obs: float
) -> CrossoverTerms | None:
    """Evaluate LHS and RHS of [EB] eq. (8) with k0* = θ0·N_obs.

    Args:
        costs: the cost model (seconds). theta0: CFR threshold in (0, 1). mu_l_tokens, mu_o_tokens: mean
        prompt and output lengths (> 0). n_obs: observed occupancy N_obs (≥ 1).
    Returns:
        The terms, or None when they cannot be evaluated (an input not finite or out of domain); the
        caller then keeps its mode and flags why.
    """
    isfinite = math.isfinite
    if not (isfinite(theta0) and isfinite(mu_l_tokens) and isfinite(mu_o_tokens) and isfinite(n_obs)):
        return None
    if not (0.0 < theta0 < 1.0 and mu_l_tokens > 0.0 and mu_o_tokens > 0.0 and n_obs >= 1.0):
        return None
    total_tokens = mu_l_tokens + mu_o_tokens
    decode_ratio = mu_o_tokens / total_tokens
    beta_eb_w = (costs.beta_p_s_per_token * mu_l_tokens + costs.beta_d_s_per_request * mu_o_tokens) / (
        total_tokens
    )
    beta_mb_e = costs.beta_mb_e(decode_ratio)
    zeta = -math.log1p(-theta0)
    eb_fixed_s = (costs.alpha_p_s + costs.alpha_d_s * zeta * mu_o_tokens) / (theta0 * n_obs)
    mb_fixed_s = costs.alpha_mb_s * (1.0 + mu_o_tokens) / n_obs
    rhs = (eb_fixed_s - mb_fixed_s) / total_tokens
    lhs = beta_mb_e - beta_eb_w
    if not (math.isfinite(lhs) and math.isfinite(rhs)):
        return None
    return CrossoverTerms(
        lhs_s_per_token=lhs,
        rhs_s_per_token=rhs,
        decode_ratio=decode_ratio,
        beta_eb_w_s_per_token=beta_eb_w,
        beta_mb_e_s_per_token=beta_mb_e,
    )


def instantaneous_mode(*, lhs_s_per_token: float, rhs_s_per_token: float, delta_s_per_token: float) -> Mode:
    """[EB] eq. (8) without memory: MB when LHS < RHS + δ, else EB."""
    return Mode.MB if lhs_s_per_token < rhs_s_per_token + delta_s_per_token else Mode.EB


@dataclass(frozen=True, slots=True)
class ModeChoice:
    """Outcome of the online selector: the mode to run and why; switched says it changed now."""

    mode: Mode
    reason: Reason
    switched: bool


# Every outcome select_mode can return, built once (they are immutable): (mode, reason, switched) → choice.
_CHOICES = {(mode, reason, switched): ModeChoice(mode=mode, reason=reason, switched=switched)
            for mode in (Mode.MB, Mode.EB) for switched in (False, True)
            for reason in (Reason.CROSSOVER_MB, Reason.CROSSOVER_EB, Reason.HYSTERESIS_HOLD, Reason.COOLDOWN_HOLD)}
_CROSSOVER_REASON = {Mode.MB: Reason.CROSSOVER_MB, Mode.EB: Reason.CROSSOVER_EB}


def select_mode(
    *,
    current: Mode,
    last_switch_s: float,
    now_s: float,
    lhs_s_per_token: float,
    rhs_s_per_token: float,
    delta_s_per_token: float,
    hysteresis_rel: float,
    hysteresis_abs_s_per_token: float,
    cooldown_s: float,
) -> ModeChoice:
    """EB+ online mode selection: [EB] eq. (8) with a hysteresis band and a cooldown.

    The margin m = (RHS + δ) − LHS favours MB when positive. Leaving the current mode needs the margin
    past the band b = hysteresis_rel·(|LHS| + |RHS|) + hysteresis_abs (m > b to go to MB, m < −b to go
    to EB), and at least cooldown_s since the last switch. Inside the band or the cooldown the current
    mode is kept with reason hysteresis_hold or cooldown_hold.

    Args:
        current: the mode in force (PASSTHROUGH is treated as MB). last_switch_s / now_s: controller
        clock, seconds. The rest in seconds per token, hysteresis_rel dimensionless.
    """
    current = Mode.EB if current == Mode.EB else Mode.MB
    margin = (rhs_s_per_token + delta_s_per_token) - lhs_s_per_token
    band = hysteresis_rel * (abs(lhs_s_per_token) + abs(rhs_s_per_token)) + hysteresis_abs_s_per_token
    target = Mode.MB if margin > 0.0 else Mode.EB
    if target == current:
        return _CHOICES[current, _CROSSOVER_REASON[current], False]
    if abs(margin) <= band:
        return _CHOICES[current, Reason.HYSTERESIS_HOLD, False]
    if now_s - last_switch_s < cooldown_s:
        return _CHOICES[current, Reason.COOLDOWN_HOLD, False]
    return _CHOICES[target, _CROSSOVER_REASON[target], True]
