"""The decision policy: evaluate() against the hand-written pipeline, decide() reasons, pins, δ, budget,
the memory guard and the EMA. decide() gets the hazard fit of a window of sample lengths, fitted through the
histogram path production uses (`tests.unit.sample_fit.fit_from_samples`)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from controlplane.core.budget import SweepPoint
from controlplane.core.hazard import HazardFit
from controlplane.core.policy import decide, evaluate, resolve_delta
from controlplane.core.threshold import delta_theta_ifr, solve_theta0
from controlplane.core.types import (
    CostModel,
    DeltaSource,
    EngineLimits,
    Flag,
    Mode,
    ModePin,
    Observations,
    OperatorIntent,
    PolicyConfig,
    PolicyState,
    Reason,
    WorkloadStats,
)
from controlplane.loop.engine import ema_update
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B
from tests.unit.sample_fit import fit_from_samples

# The EB paper's published profiles (examples/calibrations/), as the twin ships them.
RTX_PRO_6000 = RTX_PRO_6000_QWEN3_8B
H200 = H200_QWEN3_8B
LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=2_000_000,
                      max_model_len_tokens=32768)
NO_COOLDOWN = PolicyConfig(cooldown_s=0.0)


def linear_hazard_outputs(seed: int, n: int, *, p0: float = 1.0 / 256.0, eta: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if eta == 0.0:
        return rng.geometric(p0, size=n).astype(np.float64)
    t = np.arange(1, 8001)
    hazard = np.minimum(p0 + eta * t, 1.0)
    pmf = hazard * np.concatenate(([1.0], np.cumprod(1.0 - hazard)[:-1]))
    return rng.choice(t, size=n, p=pmf / pmf.sum()).astype(np.float64)


@cache
def window_fit(*, n: int = 2000, seed: int = 0, eta: float = 0.0) -> HazardFit | None:
    """The fit of a window of n outputs (`linear_hazard_outputs`) behind 512-token prompts."""
    return fit_from_samples(linear_hazard_outputs(seed, n, eta=eta), np.full(n, 512.0))


def observations(*, n_obs: float = 512.0, costs: CostModel | None = RTX_PRO_6000, limits: EngineLimits = LIMITS,
                 rejected: int = 0) -> Observations:
    return Observations(
        costs=costs,
        limits=limits,
        n_obs=n_obs,
        num_rejected_samples=rejected,
    )


# ------------------------------------------------------------------------------------------- evaluate


@pytest.mark.parametrize("costs", [RTX_PRO_6000, H200], ids=["RTX_PRO_6000", "H200"])
def test_evaluate_matches_the_hand_written_pipeline(costs: CostModel) -> None:
    p0, eta, mu_l, mu_o = 1.0 / 256.0, 3e-6, 512.0, 256.0
    n_prev, n_obs, delta = 900, 300.0, 1e-6
    limits = EngineLimits(max_num_seqs=4096, max_num_batched_tokens=8192, kv_capacity_tokens=2_000_000)
    result = evaluate(WorkloadStats(p0=p0, eta=eta, mu_l_tokens=mu_l, mu_o_tokens=mu_o), costs, limits,
                      n_prev=n_prev, n_obs=n_obs, delta_s_per_token=delta)

    theta0 = solve_theta0(p0 * costs.alpha_p_s / costs.alpha_d_s)
    zeta = -math.log1p(-theta0)
    rho = costs.beta_d_s_per_request * n_prev / costs.alpha_d_s
    d_theta = eta * (1 - theta0) ** 2 / (p0**2 * theta0) * (zeta * (theta0 / (1 - theta0) - zeta / 2)
                                                            + rho * (zeta - theta0))
    theta_star = min(max(theta0 + d_theta, 0.01), 0.8)
    n_star = math.floor((2_000_000 - math.log(1 / 0.01) / (p0**2 * mu_l))
                        / (mu_l + (1 - theta_star) / (theta_star * p0) * math.log(1 / (1 - theta_star))))
    k_star = max(1, math.floor(theta_star * n_star))
    r = mu_o / (mu_l + mu_o)
    a, b, c = costs.mb_coeffs_s_per_token
    lhs = a + b * r + c * r * r - (costs.beta_p_s_per_token * mu_l + costs.beta_d_s_per_request * mu_o) / (mu_l + mu_o)
    rhs = ((costs.alpha_p_s + costs.alpha_d_s * zeta * mu_o) / (theta0 * n_obs)
           - costs.alpha_mb_s * (1 + mu_o) / n_obs) / (mu_l + mu_o)

    assert 0.0 < d_theta < 0.5
    assert 1 <= n_star < 4096
    assert result.theta0 == theta0
    assert result.delta_theta == pytest.approx(d_theta, rel=1e-12)
    assert result.theta_star == pytest.approx(theta_star, rel=1e-12)
    assert result.n_star == n_star
    assert result.k_star == k_star
    assert result.lhs_s_per_token == pytest.approx(lhs, rel=1e-12)
    assert result.rhs_s_per_token == pytest.approx(rhs, rel=1e-12)
    assert result.decode_ratio == pytest.approx(r, rel=1e-15)
    assert result.n_obs == n_obs
    assert result.delta_s_per_token == delta
    assert result.mode_instant == (Mode.MB if lhs < rhs + delta else Mode.EB)
    assert result.flags == ()


def test_evaluate_without_n_prev_uses_n_star_at_theta0_for_rho() -> None:
    p0, eta = 1.0 / 256.0, 3e-6
    workload = WorkloadStats(p0=p0, eta=eta, mu_l_tokens=512.0, mu_o_tokens=256.0)
    limits = EngineLimits(max_num_seqs=4096, max_num_batched_tokens=8192, kv_capacity_tokens=2_000_000)
    result = evaluate(workload, RTX_PRO_6000, limits)
    theta0 = solve_theta0(p0 * RTX_PRO_6000.alpha_p_s / RTX_PRO_6000.alpha_d_s)
    n_at_theta0 = evaluate(WorkloadStats(p0=p0, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0),
                           RTX_PRO_6000, limits).n_star  # η = 0: θ* = θ0, so this is N*(θ0)
    rho = RTX_PRO_6000.beta_d_s_per_request * n_at_theta0 / RTX_PRO_6000.alpha_d_s
    assert result.delta_theta == pytest.approx(delta_theta_ifr(theta0=theta0, p0=p0, eta=eta, rho=rho), rel=1e-14)
    # ... and with η = 0 there is no correction at all.
    assert evaluate(WorkloadStats(p0=p0, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0), RTX_PRO_6000,
                    limits).delta_theta == 0.0


@pytest.mark.parametrize(("n_obs", "flagged"), [(0.0, False), (0.5, True), (-3.0, True), (math.nan, True),
                                                (math.inf, True)])
def test_evaluate_unobserved_n_obs_uses_n_star(n_obs: float, flagged: bool) -> None:
    result = evaluate(WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0), H200, LIMITS,
                      n_obs=n_obs)
    assert result.n_obs == float(result.n_star)
    assert (Flag.N_OBS_INVALID in result.flags) is flagged


@pytest.mark.parametrize(("delta", "expected", "flagged"), [
    (5e-6, 5e-6, False), (-1e-2, -1e-2, False), (0.5, 1e-2, True), (-math.inf, -1e-2, True), (math.nan, 0.0, True),
])
def test_evaluate_clips_delta(delta: float, expected: float, flagged: bool) -> None:
    result = evaluate(WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0), H200, LIMITS,
                      delta_s_per_token=delta)
    assert result.delta_s_per_token == expected
    assert (Flag.DELTA_OUT_OF_RANGE in result.flags) is flagged


def test_evaluate_flags_theta_clipping() -> None:
    workload = WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0)
    slow_prefill = CostModel(alpha_p_s=50.0, beta_p_s_per_token=1e-5, alpha_d_s=0.01, beta_d_s_per_request=1e-5,
                             alpha_mb_s=0.01)
    high = evaluate(workload, slow_prefill, LIMITS)
    assert high.theta0 > 0.8
    assert high.theta_star == 0.8
    assert Flag.THETA_CLIPPED_HIGH in high.flags
    cheap_prefill = CostModel(alpha_p_s=1e-9, beta_p_s_per_token=1e-5, alpha_d_s=0.01, beta_d_s_per_request=1e-5,
                              alpha_mb_s=0.01)
    low = evaluate(workload, cheap_prefill, LIMITS)
    assert low.theta0 < 0.01
    assert low.theta_star == 0.01
    assert Flag.THETA_CLIPPED_LOW in low.flags


def test_evaluate_with_unusable_costs_keeps_stock_behaviour() -> None:
    broken = CostModel(alpha_p_s=1e-3, beta_p_s_per_token=1e-5, alpha_d_s=0.0, beta_d_s_per_request=1e-5,
                       alpha_mb_s=1e-3)
    result = evaluate(WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0), broken, LIMITS)
    assert Flag.ALPHA_D_NONPOSITIVE in result.flags
    assert (result.lhs_s_per_token, result.rhs_s_per_token) == (0.0, 0.0)
    assert result.mode_instant == Mode.MB
    assert 1 <= result.k_star <= result.n_star <= LIMITS.max_num_seqs


def test_evaluate_flags_kv_and_max_num_seqs() -> None:
    workload = WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0)
    tiny = EngineLimits(max_num_seqs=64, max_num_batched_tokens=8192, kv_capacity_tokens=1000)
    assert Flag.KV_BELOW_ONE_REQUEST in evaluate(workload, H200, tiny).flags
    assert evaluate(workload, H200, tiny).n_star == 1
    capped = EngineLimits(max_num_seqs=64, max_num_batched_tokens=8192, kv_capacity_tokens=10**9)
    assert Flag.N_CAPPED_BY_MAX_NUM_SEQS in evaluate(workload, H200, capped).flags
    assert evaluate(workload, H200, capped).n_star == 64


def test_evaluate_n_star_shrinks_as_epsilon_shrinks() -> None:
    workload = WorkloadStats(p0=1 / 1024, eta=1e-7, mu_l_tokens=128.0, mu_o_tokens=1024.0)
    limits = EngineLimits(max_num_seqs=100_000, max_num_batched_tokens=8192, kv_capacity_tokens=400_000)
    n_stars = [evaluate(workload, H200, limits, n_prev=300, config=PolicyConfig(oom_tolerance=eps)).n_star
               for eps in (0.5, 0.1, 0.01, 1e-3, 1e-4, 1e-6)]
    assert all(a > b for a, b in itertools.pairwise(n_stars))
    # θ0 and Δθ (with n_prev given) do not depend on ε: only the memory reserve changes.
    thetas = {evaluate(workload, H200, limits, n_prev=300, config=PolicyConfig(oom_tolerance=eps)).theta_star
              for eps in (0.5, 1e-6)}
    assert len(thetas) == 1


@pytest.mark.parametrize(("given", "expected"), [
    (None, (3e-6, False)), (2e-6, (2e-6, False)), (1e-2, (1e-2, False)), (0.011, (1e-2, True)),
    (-1.0, (-1e-2, True)), (math.inf, (1e-2, True)), (math.nan, (3e-6, True)),
])
def test_resolve_delta(given: float | None, expected: tuple[float, bool]) -> None:
    assert resolve_delta(given, default_s_per_token=3e-6) == expected


# --------------------------------------------------------------------------------------------- decide


def test_cold_start_is_mb_with_insufficient_data() -> None:
    # At 16 running requests some lengths make MB win (the cold-start rule: test_cold_start.py).
    config = PolicyConfig(min_samples=400)
    decision, state = decide(observations(n_obs=16.0), PolicyState(), 0.0, config=config, fit=window_fit(n=399))
    assert decision.mode == Mode.MB
    assert decision.reason == Reason.INSUFFICIENT_DATA
    assert decision.n == LIMITS.max_num_seqs
    assert 1 <= decision.k <= decision.n
    assert decision.diagnostics.num_samples == 399
    assert decision.diagnostics.theta0 == 0.0  # not computed
    assert state.mode == Mode.MB
    # One more completion leaves the cold start.
    decision, _ = decide(observations(n_obs=16.0), PolicyState(), 0.0, config=config, fit=window_fit(n=400))
    assert decision.reason != Reason.INSUFFICIENT_DATA
    assert decision.diagnostics.theta0 > 0.0


def test_cold_start_counts_only_valid_completions() -> None:
    padded = fit_from_samples(np.concatenate((linear_hazard_outputs(0, 399), [math.nan, 0.0, -1.0, 2.5])),
                              np.full(399, 512.0))
    decision, _ = decide(observations(n_obs=16.0), PolicyState(), 0.0, config=PolicyConfig(min_samples=400),
                         fit=padded)
    assert decision.reason == Reason.INSUFFICIENT_DATA


def test_no_cost_model_is_mb() -> None:
    decision, state = decide(observations(costs=None), PolicyState(mode=Mode.EB), 0.0, fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.MB, Reason.NO_COST_MODEL)
    assert decision.n == LIMITS.max_num_seqs
    assert state.mode == Mode.MB
    assert decision.diagnostics.p0 > 0.0  # the hazard fit is still reported


@pytest.mark.parametrize(("costs", "flag"), [
    (CostModel(alpha_p_s=1e-3, beta_p_s_per_token=1e-5, alpha_d_s=-1.0, beta_d_s_per_request=1e-5, alpha_mb_s=1e-3),
     Flag.ALPHA_D_NONPOSITIVE),
    (CostModel(alpha_p_s=1e-3, beta_p_s_per_token=math.nan, alpha_d_s=0.01, beta_d_s_per_request=1e-5,
               alpha_mb_s=1e-3), Flag.COST_NONPOSITIVE),
])
def test_unusable_cost_model_is_flagged(costs: CostModel, flag: Flag) -> None:
    decision, _ = decide(observations(costs=costs), PolicyState(), 0.0, fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.MB, Reason.NO_COST_MODEL)
    assert flag in decision.flags


def test_heavy_load_on_rtx_goes_eb_with_computed_k_and_n() -> None:
    decision, state = decide(observations(n_obs=512.0), PolicyState(), 100.0, config=NO_COOLDOWN, fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.EB, Reason.CROSSOVER_EB)
    diag = decision.diagnostics
    assert (decision.n, decision.k) == (diag.n_star, diag.k_star)
    assert 1 <= decision.k < decision.n <= LIMITS.max_num_seqs
    assert diag.lhs_s_per_token > diag.rhs_s_per_token
    # The diagnostics are evaluate() on the fitted workload.
    mu_o = float(linear_hazard_outputs(0, 2000).mean())
    assert diag.mu_o_tokens == pytest.approx(mu_o, rel=1e-14)
    assert diag.mu_l_tokens == 512.0
    reference = evaluate(WorkloadStats(p0=diag.p0, eta=diag.eta, mu_l_tokens=diag.mu_l_tokens,
                                       mu_o_tokens=diag.mu_o_tokens), RTX_PRO_6000, LIMITS, n_obs=512.0)
    assert (diag.theta0, diag.theta_star, diag.n_star, diag.k_star) == (
        reference.theta0, reference.theta_star, reference.n_star, reference.k_star)
    assert diag.rhs_s_per_token == reference.rhs_s_per_token
    assert state == PolicyState(n_prev=diag.n_star, mode=Mode.EB, last_switch_s=100.0, n_eb_in_force=diag.n_star)


def test_light_load_stays_mb_with_all_slots() -> None:
    decision, state = decide(observations(n_obs=4.0), PolicyState(), 100.0, config=NO_COOLDOWN, fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.MB, Reason.CROSSOVER_MB)
    assert decision.n == LIMITS.max_num_seqs
    assert decision.diagnostics.lhs_s_per_token < decision.diagnostics.rhs_s_per_token
    assert state.mode == Mode.MB
    assert state.last_switch_s == -math.inf  # nothing switched


def test_cooldown_holds_then_switches() -> None:
    config = PolicyConfig(cooldown_s=30.0)
    eb_favoured = observations(n_obs=512.0)
    state = PolicyState(n_prev=0, mode=Mode.MB, last_switch_s=1000.0)
    held, held_state = decide(eb_favoured, state, 1029.0, config=config, fit=window_fit())
    assert (held.mode, held.reason) == (Mode.MB, Reason.COOLDOWN_HOLD)
    assert held_state.last_switch_s == 1000.0
    assert held_state.mode == Mode.MB
    switched, switched_state = decide(eb_favoured, held_state, 1030.0, config=config, fit=window_fit())
    assert (switched.mode, switched.reason) == (Mode.EB, Reason.CROSSOVER_EB)
    assert switched_state.last_switch_s == 1030.0
    assert switched_state.mode == Mode.EB
    # Back to light load right away: the cooldown holds EB.
    back, _ = decide(observations(n_obs=4.0), switched_state, 1031.0, config=config, fit=window_fit())
    assert (back.mode, back.reason) == (Mode.EB, Reason.COOLDOWN_HOLD)


def test_hysteresis_band_holds_the_current_mode() -> None:
    wide = PolicyConfig(cooldown_s=0.0, hysteresis_rel=10.0)  # band = 10·(|LHS| + |RHS|)
    decision, state = decide(observations(n_obs=512.0), PolicyState(mode=Mode.MB), 5.0, config=wide,
                             fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.MB, Reason.HYSTERESIS_HOLD)
    assert state.mode == Mode.MB
    narrow = PolicyConfig(cooldown_s=0.0, hysteresis_rel=0.0, hysteresis_abs_s_per_token=0.0)
    assert decide(observations(n_obs=512.0), PolicyState(mode=Mode.MB), 5.0, config=narrow,
                  fit=window_fit())[0].mode == Mode.EB


def test_policy_state_carries_n_prev_into_the_ifr_correction() -> None:
    obs, fit = observations(), window_fit(eta=2e-5, n=4096, seed=3)
    first, state = decide(obs, PolicyState(), 0.0, config=NO_COOLDOWN, fit=fit)
    diag = first.diagnostics
    assert diag.eta > 0.0
    assert state.n_prev == diag.n_star
    second, _ = decide(obs, PolicyState(n_prev=50, mode=state.mode), 1.0, config=NO_COOLDOWN, fit=fit)
    rho = RTX_PRO_6000.beta_d_s_per_request * 50 / RTX_PRO_6000.alpha_d_s
    expected = delta_theta_ifr(theta0=second.diagnostics.theta0, p0=second.diagnostics.p0,
                               eta=second.diagnostics.eta, rho=rho)
    assert second.diagnostics.delta_theta == pytest.approx(expected, rel=1e-14)
    assert second.diagnostics.delta_theta != diag.delta_theta


def test_operator_pin_overrides_the_mode() -> None:
    pin_eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    decision, state = decide(observations(n_obs=4.0), PolicyState(), 0.0, intent=pin_eb, config=NO_COOLDOWN,
                             fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.EB, Reason.OPERATOR_PIN)
    assert decision.n == decision.diagnostics.n_star
    assert state.mode == Mode.MB  # the online selector's own choice is kept underneath
    # Pinned while still in cold start.
    cold, _ = decide(observations(), PolicyState(), 0.0, intent=pin_eb, fit=window_fit(n=10))
    assert (cold.mode, cold.reason) == (Mode.EB, Reason.OPERATOR_PIN)
    assert 1 <= cold.k <= cold.n <= LIMITS.max_num_seqs


def test_passthrough_pin_leaves_the_engine_stock() -> None:
    intent = OperatorIntent(pin=ModePin(mode=Mode.PASSTHROUGH, advisory=True))
    decision, _ = decide(observations(n_obs=512.0), PolicyState(), 0.0, intent=intent, config=NO_COOLDOWN,
                         fit=window_fit())
    assert (decision.mode, decision.reason) == (Mode.PASSTHROUGH, Reason.OPERATOR_PIN)
    assert decision.n == LIMITS.max_num_seqs
    assert decision.advisory


def test_pinned_k_and_n_are_honoured_when_valid() -> None:
    intent = OperatorIntent(pin=ModePin(mode=Mode.EB, k=3, n=7))
    decision, _ = decide(observations(), PolicyState(), 0.0, intent=intent, fit=window_fit())
    assert (decision.k, decision.n) == (3, 7)
    assert Flag.PIN_INVALID not in decision.flags
    only_n = decide(observations(), PolicyState(), 0.0, intent=OperatorIntent(pin=ModePin(n=100)),
                    fit=window_fit())[0]
    assert only_n.n == 100
    assert only_n.k == max(1, math.floor(only_n.diagnostics.theta_star * 100))


@pytest.mark.parametrize(("k", "n"), [(0, None), (-2, 10), (5, 4), (None, 0), (None, 1025), (3, -1)])
def test_invalid_pins_are_flagged_and_replaced(k: int | None, n: int | None) -> None:
    intent = OperatorIntent(pin=ModePin(mode=Mode.EB, k=k, n=n))
    decision, _ = decide(observations(), PolicyState(), 0.0, intent=intent, fit=window_fit())
    assert Flag.PIN_INVALID in decision.flags
    assert 1 <= decision.k <= decision.n <= LIMITS.max_num_seqs


def test_pinned_k_above_the_computed_n_is_clamped() -> None:
    intent = OperatorIntent(pin=ModePin(mode=Mode.EB, k=10**6))
    decision, _ = decide(observations(), PolicyState(), 0.0, intent=intent, fit=window_fit())
    assert decision.k == decision.n == decision.diagnostics.n_star
    assert Flag.PIN_INVALID not in decision.flags


def test_operator_delta_is_clipped_flagged_and_sourced() -> None:
    intent = OperatorIntent(delta_s_per_token=0.5, delta_source=DeltaSource.POOL)
    decision, _ = decide(observations(n_obs=512.0), PolicyState(), 0.0, intent=intent, config=NO_COOLDOWN,
                         fit=window_fit())
    assert decision.delta_s_per_token == 1e-2
    assert Flag.DELTA_OUT_OF_RANGE in decision.flags
    assert decision.delta_source == DeltaSource.POOL
    assert decision.mode == Mode.MB  # a 10 ms/token margin pins MB
    default, _ = decide(observations(), PolicyState(), 0.0,
                        intent=OperatorIntent(delta_source=DeltaSource.ENGINE),
                        config=PolicyConfig(default_delta_s_per_token=2e-6), fit=window_fit())
    assert default.delta_s_per_token == 2e-6
    assert default.delta_source == DeltaSource.DEFAULT
    assert Flag.DELTA_OUT_OF_RANGE not in default.flags


def test_delta_sign_moves_the_decision() -> None:
    light, heavy, fit = observations(n_obs=4.0), observations(n_obs=512.0), window_fit()
    to_eb = OperatorIntent(delta_s_per_token=-1e-3, delta_source=DeltaSource.FLEET)
    to_mb = OperatorIntent(delta_s_per_token=1e-3, delta_source=DeltaSource.FLEET)
    assert decide(light, PolicyState(), 0.0, config=NO_COOLDOWN, fit=fit)[0].mode == Mode.MB
    assert decide(light, PolicyState(), 0.0, intent=to_eb, config=NO_COOLDOWN, fit=fit)[0].mode == Mode.EB
    assert decide(heavy, PolicyState(), 0.0, config=NO_COOLDOWN, fit=fit)[0].mode == Mode.EB
    assert decide(heavy, PolicyState(), 0.0, intent=to_mb, config=NO_COOLDOWN, fit=fit)[0].mode == Mode.MB


def test_rejected_samples_are_reported() -> None:
    decision, _ = decide(observations(rejected=7), PolicyState(), 0.0, fit=window_fit())
    assert Flag.SAMPLES_REJECTED in decision.flags
    assert decision.diagnostics.num_rejected_samples == 7
    clean, _ = decide(observations(rejected=-4), PolicyState(), 0.0, fit=window_fit())
    assert Flag.SAMPLES_REJECTED not in clean.flags
    assert clean.diagnostics.num_rejected_samples == 0


def test_decide_budget_from_sweep_and_limits() -> None:
    sweep = [SweepPoint(1024, 3.1, 9.2), SweepPoint(2048, 2.9, 8.1), SweepPoint(4096, 2.7, 8.6)]
    decision, _ = decide(observations(), PolicyState(), 0.0, budget_sweep=sweep, fit=window_fit())
    assert (decision.budget.b_max_tokens, decision.budget.b_cap_tokens) == (4096, 2048)
    assert decision.budget.t_large_tokens == 16384  # max_model_len // 2
    assert Flag.BUDGET_CLAMPED not in decision.flags
    # Default endpoints 16384/2048 against an engine started with 8192 tokens: clamped, flagged.
    default, _ = decide(observations(), PolicyState(), 0.0, fit=window_fit())
    assert (default.budget.b_max_tokens, default.budget.b_cap_tokens) == (8192, 2048)
    assert Flag.BUDGET_CLAMPED in default.flags
    small = EngineLimits(max_num_seqs=8, max_num_batched_tokens=1000, kv_capacity_tokens=10**6)
    tiny, _ = decide(observations(limits=small), PolicyState(), 0.0, fit=window_fit())
    assert (tiny.budget.b_max_tokens, tiny.budget.b_cap_tokens) == (1000, 1000)
    assert tiny.budget.t_large_tokens == 0  # max_model_len unknown: P-PAS+ off


def test_decide_is_pure() -> None:
    obs = observations(n_obs=512.0)
    first = decide(obs, PolicyState(), 10.0, fit=window_fit())
    second = decide(obs, PolicyState(), 10.0, fit=window_fit())
    assert first == second


# ------------------------------------------------------------------------------------------------ EMA


def test_ema_update_hand_value() -> None:
    # weight on the new value: 1 − e^(−dt/τ) = 1 − e^(−0.5)
    assert ema_update(10.0, 20.0, dt_s=1.0, time_constant_s=2.0) == pytest.approx(
        10.0 + (1.0 - math.exp(-0.5)) * 10.0, rel=1e-15)
    value = 0.0
    for _ in range(200):
        value = ema_update(value, 64.0, dt_s=1.0, time_constant_s=5.0)
    assert value == pytest.approx(64.0, rel=1e-12)
    assert ema_update(3.0, 7.0, dt_s=1e9, time_constant_s=1.0) == 7.0


@pytest.mark.parametrize(("previous", "value", "dt", "tau", "expected"), [
    (5.0, math.nan, 1.0, 2.0, 5.0), (5.0, math.inf, 1.0, 2.0, 5.0), (5.0, -1.0, 1.0, 2.0, 5.0),
    (math.nan, 9.0, 1.0, 2.0, 9.0), (math.inf, 9.0, 1.0, 2.0, 9.0),
    (5.0, 9.0, 0.0, 2.0, 5.0), (5.0, 9.0, -1.0, 2.0, 5.0), (5.0, 9.0, math.nan, 2.0, 5.0),
    (5.0, 9.0, 1.0, 0.0, 5.0), (5.0, 9.0, 1.0, math.nan, 5.0),
])
def test_ema_update_degenerate_inputs(previous: float, value: float, dt: float, tau: float, expected: float) -> None:
    assert ema_update(previous, value, dt_s=dt, time_constant_s=tau) == expected


@pytest.mark.parametrize("kwargs", [
    {"min_samples": 0}, {"theta_min": 0.0}, {"theta_min": 0.5, "theta_max": 0.4}, {"theta_max": 1.0},
    {"oom_tolerance": 0.0}, {"oom_tolerance": 1.0}, {"oom_tolerance": math.nan},
    {"default_delta_s_per_token": 0.02}, {"default_delta_s_per_token": math.nan},
    {"hysteresis_rel": -0.1}, {"hysteresis_abs_s_per_token": -1e-9}, {"cooldown_s": -1.0}, {"cooldown_s": math.nan},
])
def test_policy_config_rejects_bad_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        PolicyConfig(**kwargs)


def test_batch_size_uses_the_geometric_rate_of_the_mean_when_the_intercept_is_lower() -> None:
    """A strongly IFR window (uniform 0.5–1.5× the mean) fits p0 ≪ 1/μ_O; N̂* must not collapse."""
    from controlplane.core.policy import evaluate
    from controlplane.core.types import CostModel, EngineLimits, Flag, WorkloadStats

    costs = CostModel(alpha_p_s=0.0047, beta_p_s_per_token=5e-5, alpha_d_s=0.0104, beta_d_s_per_request=1e-4,
                      alpha_mb_s=0.0047, mb_coeffs_s_per_token=(6.3e-5, 2e-4, 1e-5))
    limits = EngineLimits(max_num_seqs=4096, max_num_batched_tokens=8192, kv_capacity_tokens=700_000)
    ifr = evaluate(WorkloadStats(p0=1.5e-4, eta=2e-6, mu_l_tokens=512.0, mu_o_tokens=512.0), costs, limits)
    geometric = evaluate(WorkloadStats(p0=1 / 512, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=512.0), costs, limits)
    assert Flag.MEMORY_RATE_FROM_MEAN in ifr.flags and Flag.MEMORY_RATE_FROM_MEAN not in geometric.flags
    # Same mean lengths, so the same memory per slot: N̂* differs only through θ̂*.
    assert ifr.n_star >= 0.8 * geometric.n_star > 100
    # With p0 itself in the reserve term, ln(1/ε)/(p0²μ_L) ≈ 400k tokens would leave a fraction of that.
    reserve_tokens = math.log(100) / (1.5e-4**2 * 512)
    assert reserve_tokens > 0.5 * limits.kv_capacity_tokens


def _guard_observations(preemptions: int, num_running: int = 0, limits: EngineLimits = LIMITS) -> Observations:
    return Observations(costs=H200, limits=limits, num_preemptions=preemptions, num_running=num_running)


GUARD_FIT = window_fit(seed=3)


def test_memory_guard_cuts_n_on_preemption_and_releases_it_gradually() -> None:
    """Preemptions under an EB decision cut N to 0.85·N in force; clean intervals grow the cap by 2% until N̂*."""
    eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    first, state = decide(_guard_observations(0), PolicyState(), 0.0, intent=eb, config=NO_COOLDOWN, fit=GUARD_FIT)
    n_star = first.diagnostics.n_star
    assert first.n == n_star and state.n_eb_in_force == n_star and Flag.MEMORY_GUARD not in first.flags
    cut, state = decide(_guard_observations(7), state, 1.0, intent=eb, config=NO_COOLDOWN, fit=GUARD_FIT)
    assert cut.n == math.floor(0.85 * n_star) and Flag.MEMORY_GUARD in cut.flags
    assert cut.k == max(1, math.floor(cut.diagnostics.theta_star * cut.n))
    again, state = decide(_guard_observations(1), state, 2.0, intent=eb, config=NO_COOLDOWN, fit=GUARD_FIT)
    assert again.n == math.floor(0.85 * cut.n)  # the base is the N in force, not N̂*
    sizes = [again.n]
    for step in range(200):
        decision, state = decide(_guard_observations(0), state, 3.0 + step, intent=eb, config=NO_COOLDOWN,
                                 fit=GUARD_FIT)
        sizes.append(decision.n)
        if state.n_guard == 0:
            break
    assert sizes == sorted(sizes) and sizes[-1] == n_star and state.n_guard == 0
    growth = list(itertools.pairwise(sizes))[:-1]  # the last step is the release to N̂*
    assert all(b - a == max(1, math.ceil(0.02 * a)) for a, b in growth)


def test_memory_guard_holds_its_cap_while_the_engine_runs_more_than_it() -> None:
    """A cut below the running count admits nothing less: the preemptions that follow come from requests
    already running as they grow (vLLM preempts those itself). The cap holds until the running count falls
    to it, then cuts again; without the hold, long outputs took N from 1,024 to 6–34 in the twin."""
    eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    first, state = decide(_guard_observations(0), PolicyState(), 0.0, intent=eb, config=NO_COOLDOWN, fit=GUARD_FIT)
    cut, state = decide(_guard_observations(9, num_running=first.n), state, 1.0, intent=eb, config=NO_COOLDOWN,
                        fit=GUARD_FIT)
    assert cut.n == math.floor(0.85 * first.n)
    held, state = decide(_guard_observations(9, num_running=cut.n + 1), state, 2.0, intent=eb, config=NO_COOLDOWN,
                         fit=GUARD_FIT)
    assert held.n == cut.n and Flag.MEMORY_GUARD in held.flags
    again, state = decide(_guard_observations(9, num_running=cut.n), state, 3.0, intent=eb, config=NO_COOLDOWN,
                          fit=GUARD_FIT)
    assert again.n == math.floor(0.85 * cut.n)



def test_memory_guard_does_not_blame_a_lowered_n_for_requests_admitted_under_a_larger_one() -> None:
    """The rule lowered N (a cold start ran max_num_seqs; the first fit asks for less) while the engine still
    runs the requests admitted before: their preemptions say nothing about the new N, so no cap is set. Cut
    on them, the cap fell to 0.85·N̂* of a first, low estimate and took minutes to grow back (twin, RTX PRO
    6000, Qwen3-30B-A3B, ShareGPT: N 175–336 where N̂* was 632). Once the running count is down to N, a
    preemption cuts as before."""
    eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    limits = replace(LIMITS, kv_capacity_tokens=400_000)
    state = PolicyState(n_eb_in_force=limits.max_num_seqs)
    first, state = decide(_guard_observations(0, limits=limits), state, 0.0, intent=eb, config=NO_COOLDOWN,
                          fit=GUARD_FIT)
    n_star = first.diagnostics.n_star
    assert n_star < limits.max_num_seqs and first.n == n_star and state.n_eb_in_force == n_star
    held, state = decide(_guard_observations(40, num_running=n_star + 1, limits=limits), state, 1.0, intent=eb,
                         config=NO_COOLDOWN, fit=GUARD_FIT)
    assert held.n == n_star and state.n_guard == 0 and Flag.MEMORY_GUARD not in held.flags
    cut, state = decide(_guard_observations(3, num_running=n_star, limits=limits), state, 2.0, intent=eb,
                        config=NO_COOLDOWN, fit=GUARD_FIT)
    assert cut.n == math.floor(0.85 * n_star) and Flag.MEMORY_GUARD in cut.flags


def test_memory_guard_ignores_preemptions_outside_computed_eb_and_can_be_turned_off() -> None:
    mb, _ = decide(_guard_observations(50), PolicyState(n_eb_in_force=0), 0.0, config=NO_COOLDOWN,
                   intent=OperatorIntent(pin=ModePin(mode=Mode.MB)), fit=GUARD_FIT)
    assert mb.n == LIMITS.max_num_seqs and Flag.MEMORY_GUARD not in mb.flags  # MB preempts as stock vLLM does
    pinned, state = decide(_guard_observations(50), PolicyState(n_eb_in_force=600), 0.0, config=NO_COOLDOWN,
                           intent=OperatorIntent(pin=ModePin(mode=Mode.EB, n=700)), fit=GUARD_FIT)
    assert pinned.n == 700 and state.n_eb_in_force == 0  # an operator's N is not second-guessed
    off = PolicyConfig(cooldown_s=0.0, memory_guard=False)
    eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    free, _ = decide(_guard_observations(50), PolicyState(n_eb_in_force=600), 0.0, intent=eb, config=off, fit=GUARD_FIT)
    assert free.n == free.diagnostics.n_star and Flag.MEMORY_GUARD not in free.flags
    with pytest.raises(ValueError, match="guard_decrease_factor"):
        PolicyConfig(guard_decrease_factor=1.0)


def test_long_outputs_behind_short_prompts_do_not_collapse_n_star() -> None:
    """NuminaMath's shape (122-token prompts, uniform 800–4,000 outputs) on 217k KV tokens: Prop. 3.3's reserve
    ln(1/ε)·μ_O²/μ_L is the whole cache, and N̂* was 1 (EB −74% against v1 in the twin). The moment bound
    takes over, flagged; a short-output workload keeps the paper's formula, unflagged."""
    from controlplane.core.policy import evaluate
    from controlplane.core.types import CostModel, EngineLimits, Flag, WorkloadStats

    costs = CostModel(alpha_p_s=0.0047, beta_p_s_per_token=5e-5, alpha_d_s=0.0104, beta_d_s_per_request=1e-4,
                      alpha_mb_s=0.0047, mb_coeffs_s_per_token=(6.3e-5, 2e-4, 1e-5))
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=217_042)
    long = evaluate(WorkloadStats(p0=1e-5, eta=3e-7, mu_l_tokens=122.0, mu_o_tokens=2400.0, sigma_o_tokens=924.0),
                    costs, limits)
    assert Flag.MEMORY_BOUND_FROM_OCCUPANCY in long.flags and Flag.KV_BELOW_ONE_REQUEST not in long.flags
    # 217,042 tokens over ≈ 1,500 per slot (122 + E[O²]/(2μ_O) ≈ 1,377) is ≈ 145 on average; the ε margin
    # takes some of it.
    assert 100 <= long.n_star <= 145
    short = evaluate(WorkloadStats(p0=1 / 256, eta=0.0, mu_l_tokens=512.0, mu_o_tokens=256.0), costs, limits)
    assert Flag.MEMORY_BOUND_FROM_OCCUPANCY not in short.flags
