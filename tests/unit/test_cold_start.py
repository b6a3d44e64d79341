"""Cold start: rule (8) over every length an engine serves, and EB before min_samples only when it wins at all.

The property that matters: whenever the cold-start verdict is EB, the full rule picks EB for any workload the
engine could be serving (random μ_L, μ_O, and p0 between a tenth of 1/μ_O and 1/μ_O, at least 2 − μ_O).
Then decide(): the reason, k and N of a cold-start EB decision, and every way it stays MB.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controlplane.core.cold_start import least_favourable_to_eb
from controlplane.core.hazard import HazardFit
from controlplane.core.policy import decide, evaluate
from controlplane.core.types import (
    CostModel,
    EngineLimits,
    Mode,
    Observations,
    PolicyConfig,
    PolicyState,
    Reason,
    WorkloadStats,
)
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B, get_profile
from tests.unit.sample_fit import fit_from_samples

MAX_MODEL_LEN = 32768
LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=2_000_000,
                      max_model_len_tokens=MAX_MODEL_LEN)
FEW = np.array([300.0, 200.0, 250.0])  # three completions: far from min_samples


def _observations(*, n_obs: float, costs: CostModel | None = RTX_PRO_6000_QWEN3_8B,
                  limits: EngineLimits = LIMITS) -> Observations:
    return Observations(costs=costs, limits=limits, n_obs=n_obs)


def _fit(outputs: np.ndarray = FEW) -> HazardFit | None:
    """The hazard fit of these completions behind 512-token prompts."""
    return fit_from_samples(outputs, np.full(outputs.size, 512.0))


def _eb(point, *, delta: float = 0.0) -> bool:
    return point is not None and point.lhs_s_per_token >= point.rhs_s_per_token + delta


@pytest.mark.parametrize("mu_o_floor", [1.0, 80.0, 1500.0])
@pytest.mark.parametrize("profile", ["rtx-pro-6000-qwen3-8b", "h200-qwen3-8b", "rtx-pro-6000-qwen3-30b-a3b",
                                     "l40s-qwen3-30b-a3b"])
def test_when_the_cold_start_verdict_is_eb_the_rule_picks_eb_at_any_length(profile: str, mu_o_floor: float) -> None:
    """With a floor on μ_O (what the data proves), at any length with outputs at least that long."""
    costs = get_profile(profile).costs
    rng = np.random.default_rng(7)
    num_eb_verdicts = 0
    for n_obs in np.geomspace(20.0, 4000.0, 24):
        point = least_favourable_to_eb(costs, max_model_len_tokens=MAX_MODEL_LEN, n_obs=float(n_obs),
                                       delta_s_per_token=0.0, mu_o_floor_tokens=mu_o_floor)
        if not _eb(point):
            continue
        num_eb_verdicts += 1
        for _ in range(100):
            mu_o = float(np.exp(rng.uniform(math.log(mu_o_floor), math.log(MAX_MODEL_LEN - 1))))
            mu_l = float(np.exp(rng.uniform(0.0, math.log(MAX_MODEL_LEN - mu_o))))
            p0 = min(1.0, max(float(np.exp(rng.uniform(math.log(0.1), 0.0))) / mu_o, 2.0 - mu_o))
            evaluation = evaluate(WorkloadStats(p0=p0, eta=0.0, mu_l_tokens=mu_l, mu_o_tokens=mu_o), costs, LIMITS,
                                  n_obs=float(n_obs))
            assert evaluation.mode_instant == Mode.EB, (n_obs, mu_l, mu_o, p0)
    assert num_eb_verdicts >= 5  # the property was exercised: EB is the verdict at high occupancy


def test_the_verdict_turns_to_eb_once_occupancy_is_high_enough() -> None:
    verdicts = [_eb(least_favourable_to_eb(RTX_PRO_6000_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=n,
                                           delta_s_per_token=0.0)) for n in (16.0, 64.0, 256.0, 1024.0)]
    assert verdicts == [False, False, True, True]
    # H200 (v1 strong): a few hundred requests are not enough for every length; a thousand are.
    h200 = [_eb(least_favourable_to_eb(H200_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=n,
                                       delta_s_per_token=0.0)) for n in (256.0, 1024.0)]
    assert h200 == [False, True]


def test_a_floor_on_the_mean_output_rules_out_the_tiny_outputs_that_hold_the_h200_in_mb() -> None:
    """H200: at 512 requests EB loses nowhere but wins by less than the selector's band at μ_O ≈ 2.5 and at
    the longest prompts; a pool whose requests are known to make ≥ 80 tokens on average goes to EB."""
    config = PolicyConfig()
    def margin_past_band(floor: float) -> float:
        point = least_favourable_to_eb(H200_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=512.0,
                                       delta_s_per_token=0.0, mu_o_floor_tokens=floor)
        band = (config.hysteresis_rel * (abs(point.lhs_s_per_token) + abs(point.rhs_s_per_token))
                + config.hysteresis_abs_s_per_token)
        return point.lhs_s_per_token - point.rhs_s_per_token - band
    assert margin_past_band(1.0) < 0.0
    assert margin_past_band(80.0) > 0.0
    # A floor that proves nothing is no floor.
    for nonsense in (math.nan, math.inf, -5.0, 0.5):
        assert (least_favourable_to_eb(H200_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=512.0,
                                       delta_s_per_token=0.0, mu_o_floor_tokens=nonsense)
                == least_favourable_to_eb(H200_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=512.0,
                                          delta_s_per_token=0.0))


def test_decide_reads_the_floor_from_the_completions_so_far() -> None:
    """H200 at 512 requests: three completions prove nothing (MB); 200 of a mean ≈ 256 do (cold-start EB)."""
    state = PolicyState(mode=Mode.MB)
    few, _ = decide(_observations(n_obs=512.0, costs=H200_QWEN3_8B), state, now_s=100.0, fit=_fit())
    assert few.mode == Mode.MB and few.reason == Reason.INSUFFICIENT_DATA
    outputs = np.random.default_rng(3).geometric(1 / 256, 200).astype(np.float64)
    more, _ = decide(_observations(n_obs=512.0, costs=H200_QWEN3_8B), state, now_s=100.0, fit=_fit(outputs))
    assert more.mode == Mode.EB and more.reason == Reason.COLD_START_EB
    assert more.diagnostics.num_samples == 200
    # The explain view's terms: the floor the 200 completions prove and the point the verdict stands on.
    d, f = few.diagnostics, more.diagnostics
    assert d.mu_o_lower_tokens == 1.0 and 100.0 < f.mu_o_lower_tokens < outputs.mean()
    point = least_favourable_to_eb(H200_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=512.0,
                                   delta_s_per_token=0.0, mu_o_floor_tokens=f.mu_o_lower_tokens)
    assert (f.cold_start_mu_l_tokens, f.cold_start_mu_o_tokens, f.cold_start_p0, f.lhs_s_per_token,
            f.rhs_s_per_token) == (point.mu_l_tokens, point.mu_o_tokens, point.p0, point.lhs_s_per_token,
                                   point.rhs_s_per_token)
    assert f.cold_start_mu_o_tokens <= f.mu_o_lower_tokens  # here: the grid point just below the floor
    assert 0.0 < d.cold_start_mu_o_tokens < f.cold_start_mu_o_tokens  # without a floor: the tiny outputs


def test_a_margin_for_mb_delays_the_verdict() -> None:
    point = least_favourable_to_eb(RTX_PRO_6000_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=1024.0,
                                   delta_s_per_token=0.0)
    assert _eb(point)
    delta = point.lhs_s_per_token - point.rhs_s_per_token + 1e-7  # just enough to make MB win there
    assert not _eb(least_favourable_to_eb(RTX_PRO_6000_QWEN3_8B, max_model_len_tokens=MAX_MODEL_LEN, n_obs=1024.0,
                                          delta_s_per_token=delta), delta=delta)


@pytest.mark.parametrize(("max_model_len", "n_obs"), [(0, 1024.0), (1, 1024.0), (MAX_MODEL_LEN, 0.0),
                                                      (MAX_MODEL_LEN, math.nan), (MAX_MODEL_LEN, math.inf)])
def test_no_verdict_without_a_length_limit_or_an_occupancy(max_model_len: int, n_obs: float) -> None:
    assert least_favourable_to_eb(RTX_PRO_6000_QWEN3_8B, max_model_len_tokens=max_model_len, n_obs=n_obs,
                                  delta_s_per_token=0.0) is None


def test_no_verdict_when_the_rule_cannot_be_evaluated() -> None:
    # A fixed prefill cost of 0 gives θ0 = 0: rule (8) is not defined (the full policy flags the same).
    costs = CostModel(alpha_p_s=0.0, beta_p_s_per_token=7.6e-5, alpha_d_s=0.017, beta_d_s_per_request=1.6e-4,
                      alpha_mb_s=0.0, mb_coeffs_s_per_token=(8.8e-5, 5.4e-4, -2.0e-4))
    assert least_favourable_to_eb(costs, max_model_len_tokens=MAX_MODEL_LEN, n_obs=1024.0,
                                  delta_s_per_token=0.0) is None


def test_decide_runs_eb_at_cold_start_when_no_length_makes_mb_win() -> None:
    decision, state = decide(_observations(n_obs=1024.0), PolicyState(), 10.0, fit=_fit())
    assert (decision.mode, decision.reason) == (Mode.EB, Reason.COLD_START_EB)
    config = PolicyConfig()
    assert decision.n == LIMITS.max_num_seqs
    assert decision.k == math.floor(config.theta_min * LIMITS.max_num_seqs)
    d = decision.diagnostics
    assert d.lhs_s_per_token >= d.rhs_s_per_token > 0.0
    assert d.n_obs == 1024.0 and d.theta0 == 0.0 and d.num_samples == FEW.size  # the rule's terms, no fit
    assert (state.mode, state.last_switch_s, state.n_eb_in_force) == (Mode.EB, 10.0, LIMITS.max_num_seqs)
    # With the data, the full rule takes over from the state the cold start left.
    outputs = np.random.default_rng(1).geometric(1 / 256, 400).astype(np.float64)
    full, _ = decide(_observations(n_obs=1024.0), state, 20.0, fit=_fit(outputs))
    assert (full.mode, full.reason) == (Mode.EB, Reason.CROSSOVER_EB)
    assert full.diagnostics.theta0 > 0.0


def test_decide_keeps_mb_at_cold_start_when_some_length_makes_mb_win() -> None:
    for observations in (_observations(n_obs=16.0), _observations(n_obs=256.0, costs=H200_QWEN3_8B),
                         _observations(n_obs=1024.0, limits=EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192,
                                                                           kv_capacity_tokens=2_000_000)),
                         _observations(n_obs=1024.0, costs=None)):
        decision, state = decide(observations, PolicyState(), 10.0, fit=_fit())
        assert (decision.mode, decision.reason, state.mode) == (Mode.MB, Reason.INSUFFICIENT_DATA, Mode.MB)
    off, _ = decide(_observations(n_obs=1024.0), PolicyState(), 10.0, config=PolicyConfig(cold_start_crossover=False),
                    fit=_fit())
    assert (off.mode, off.reason) == (Mode.MB, Reason.INSUFFICIENT_DATA)


def test_a_cold_start_eb_returns_to_mb_when_occupancy_falls_after_the_cooldown() -> None:
    config = PolicyConfig(cooldown_s=30.0)
    _, state = decide(_observations(n_obs=1024.0), PolicyState(), 0.0, config=config, fit=_fit())
    held, state_held = decide(_observations(n_obs=16.0), state, 10.0, config=config, fit=_fit())
    assert (held.mode, held.reason) == (Mode.EB, Reason.COLD_START_EB)  # inside the cooldown
    back, state_back = decide(_observations(n_obs=16.0), state_held, 40.0, config=config, fit=_fit())
    assert (back.mode, back.reason, state_back.mode) == (Mode.MB, Reason.INSUFFICIENT_DATA, Mode.MB)


def test_the_first_decision_of_an_engine_without_occupancy_is_stock() -> None:
    decision, _ = decide(_observations(n_obs=0.0), PolicyState(), 0.0, fit=None)  # no completion: no fit
    assert (decision.mode, decision.reason) == (Mode.MB, Reason.INSUFFICIENT_DATA)


def test_the_verdict_reads_the_occupancy_an_eb_batch_would_reach() -> None:
    """A new engine under stock batching runs 60 requests under a queue (the RTX PRO 6000's threshold is about
    95): at N_obs alone it stays MB; with 1,024 requests held (running or waiting, `n_offered`) it runs EB,
    and the diagnostics show the occupancy the verdict was taken at. A non-finite n_offered is ignored."""
    state = PolicyState(mode=Mode.MB)
    ramping = _observations(n_obs=60.0)
    alone, _ = decide(ramping, state, now_s=10.0, fit=_fit())
    assert (alone.mode, alone.reason, alone.diagnostics.n_obs) == (Mode.MB, Reason.INSUFFICIENT_DATA, 60.0)
    queued, _ = decide(replace(ramping, n_offered=1024.0), state, now_s=10.0, fit=_fit())
    assert (queued.mode, queued.reason, queued.diagnostics.n_obs) == (Mode.EB, Reason.COLD_START_EB, 1024.0)
    for nonsense in (math.nan, math.inf, -5.0):
        same, _ = decide(replace(ramping, n_offered=nonsense), state, now_s=10.0, fit=_fit())
        assert (same.mode, same.diagnostics.n_obs) == (Mode.MB, 60.0)


def test_without_a_fit_the_verdict_reads_the_floor_the_running_requests_prove() -> None:
    """H200 at 512 requests before any completion (no fit): MB without a floor; EB when the running requests
    prove μ_O ≥ 160 (`Observations.mu_o_lower_tokens`), shown in the diagnostics. A fit's floor wins."""
    state = PolicyState(mode=Mode.MB)
    none = _observations(n_obs=512.0, costs=H200_QWEN3_8B)
    bare, _ = decide(none, state, now_s=100.0, fit=None)
    assert (bare.mode, bare.diagnostics.mu_o_lower_tokens) == (Mode.MB, 1.0)
    floored, _ = decide(replace(none, mu_o_lower_tokens=160.0), state, now_s=100.0, fit=None)
    assert (floored.mode, floored.reason) == (Mode.EB, Reason.COLD_START_EB)
    assert floored.diagnostics.mu_o_lower_tokens == 160.0 and floored.diagnostics.cold_start_mu_o_tokens <= 160.0
    # three completions: their fit proves nothing, and its floor is the one read
    few, _ = decide(replace(_observations(n_obs=512.0, costs=H200_QWEN3_8B), mu_o_lower_tokens=160.0), state,
                    now_s=100.0, fit=_fit())
    assert (few.mode, few.diagnostics.mu_o_lower_tokens) == (Mode.MB, 1.0)
