"""Conversions between protobuf messages and core types (decisions, calibrations)."""

from __future__ import annotations

import math

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.types import CostModel, Decision
from controlplane.protocol import MODE_TO_PROTO


def decision_to_proto(decision: Decision, *, version: int, ttl_s: float, decided_at_s: float,
                      trace_id: str) -> common_pb2.Decision:
    d = decision.diagnostics
    b = decision.budget
    return common_pb2.Decision(
        version=version,
        mode=MODE_TO_PROTO[decision.mode],
        k=decision.k,
        n=decision.n,
        budget=common_pb2.BudgetPolicy(b_max_tokens=b.b_max_tokens, b_cap_tokens=b.b_cap_tokens, n_th=b.n_th,
                                       t_large_tokens=b.t_large_tokens, n_d_large=b.n_d_large),
        delta_s_per_token=decision.delta_s_per_token,
        delta_source=decision.delta_source.value,
        ttl_s=ttl_s,
        advisory=decision.advisory,
        reason=decision.reason.value,
        flags=[f.value for f in decision.flags],
        decided_at_s=decided_at_s,
        trace_id=trace_id,
        diagnostics=common_pb2.Diagnostics(
            p0=d.p0, eta=d.eta, mu_l_tokens=d.mu_l_tokens, mu_o_tokens=d.mu_o_tokens,
            sigma_o_tokens=d.sigma_o_tokens, t95_tokens=d.t95_tokens, theta0=d.theta0,
            delta_theta=d.delta_theta, theta_star=d.theta_star, n_star=d.n_star, k_star=d.k_star,
            lhs_s_per_token=d.lhs_s_per_token, rhs_s_per_token=d.rhs_s_per_token, n_obs=d.n_obs,
            num_samples=d.num_samples, num_rejected_samples=d.num_rejected_samples,
            mu_o_lower_tokens=d.mu_o_lower_tokens, cold_start_mu_l_tokens=d.cold_start_mu_l_tokens,
            cold_start_mu_o_tokens=d.cold_start_mu_o_tokens, cold_start_p0=d.cold_start_p0,
        ),
    )


def calibration_to_cost_model(calibration: operator_pb2.Calibration) -> CostModel:
    """Raises ValueError naming the field when a cost is not a positive finite number."""
    for name in ("alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request"):
        value = getattr(calibration, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"calibration.{name} must be a positive finite number, got {value}")
    if not (math.isfinite(calibration.alpha_mb_s) and calibration.alpha_mb_s >= 0):
        raise ValueError(f"calibration.alpha_mb_s must be ≥ 0 and finite, got {calibration.alpha_mb_s}")
    coeffs = tuple(calibration.mb_coeffs_s_per_token)
    if coeffs and (len(coeffs) != 3 or not all(math.isfinite(c) for c in coeffs)):
        raise ValueError("calibration.mb_coeffs_s_per_token must be three finite numbers (c0, c1, c2)")
    return CostModel(
        alpha_p_s=calibration.alpha_p_s,
        beta_p_s_per_token=calibration.beta_p_s_per_token,
        alpha_d_s=calibration.alpha_d_s,
        beta_d_s_per_request=calibration.beta_d_s_per_request,
        alpha_mb_s=calibration.alpha_mb_s or calibration.alpha_p_s,
        mb_coeffs_s_per_token=coeffs or (0.0, 0.0, 0.0),
    )


def cost_model_to_calibration(costs: CostModel, pool: common_pb2.Pool, *, source: str = "") -> operator_pb2.Calibration:
    """A pool's Calibration message carrying `costs` (the inverse of calibration_to_cost_model)."""
    return operator_pb2.Calibration(
        pool=pool, alpha_p_s=costs.alpha_p_s, beta_p_s_per_token=costs.beta_p_s_per_token,
        alpha_d_s=costs.alpha_d_s, beta_d_s_per_request=costs.beta_d_s_per_request, alpha_mb_s=costs.alpha_mb_s,
        mb_coeffs_s_per_token=list(costs.mb_coeffs_s_per_token), source=source,
    )
