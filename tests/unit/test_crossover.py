"""EB/MB crossover (Proposition 3.4, rule (8)) and the EB+ online selector with hysteresis and cooldown."""

from __future__ import annotations

import math

import pytest

from controlplane.core.crossover import ModeChoice, crossover_terms, instantaneous_mode, select_mode
from controlplane.core.threshold import solve_theta0
from controlplane.core.types import CostModel, Mode, Reason
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B

# The published calibrations (eb-vllm, Qwen3-8B; examples/calibrations/), shared with the twin.
H200 = H200_QWEN3_8B
RTX_PRO_6000 = RTX_PRO_6000_QWEN3_8B


def hand_terms(costs: CostModel, *, theta0: float, mu_l: float, mu_o: float, n_obs: float):
    """LHS and RHS of rule (8), written out from the paper."""
    r = mu_o / (mu_l + mu_o)
    a, b, c = costs.mb_coeffs_s_per_token
    beta_mb_e = a + b * r + c * r**2
    beta_eb_w = (costs.beta_p_s_per_token * mu_l + costs.beta_d_s_per_request * mu_o) / (mu_l + mu_o)
    zeta = -math.log(1.0 - theta0)
    k0 = theta0 * n_obs
    rhs = ((costs.alpha_p_s + costs.alpha_d_s * zeta * mu_o) / k0 - costs.alpha_mb_s * (1.0 + mu_o) / n_obs) / (
        mu_l + mu_o
    )
    return r, beta_mb_e, beta_eb_w, beta_mb_e - beta_eb_w, rhs


@pytest.mark.parametrize("costs", [H200, RTX_PRO_6000], ids=["H200", "RTX_PRO_6000"])
@pytest.mark.parametrize(("mu_l", "mu_o", "n_obs"), [(512.0, 256.0, 64.0), (128.0, 1024.0, 700.0),
                                                       (1024.0, 128.0, 1.0), (3000.0, 20.0, 2048.0)])
def test_crossover_terms_match_the_formula(costs: CostModel, mu_l: float, mu_o: float, n_obs: float) -> None:
    theta0 = solve_theta0((1.0 / mu_o) * costs.alpha_p_s / costs.alpha_d_s)
    terms = crossover_terms(costs=costs, theta0=theta0, mu_l_tokens=mu_l, mu_o_tokens=mu_o, n_obs=n_obs)
    assert terms is not None
    r, beta_mb_e, beta_eb_w, lhs, rhs = hand_terms(costs, theta0=theta0, mu_l=mu_l, mu_o=mu_o, n_obs=n_obs)
    assert terms.decode_ratio == pytest.approx(r, rel=1e-15)
    assert terms.beta_mb_e_s_per_token == pytest.approx(beta_mb_e, rel=1e-14)
    assert terms.beta_eb_w_s_per_token == pytest.approx(beta_eb_w, rel=1e-14)
    assert terms.lhs_s_per_token == pytest.approx(lhs, rel=1e-12, abs=1e-20)
    assert terms.rhs_s_per_token == pytest.approx(rhs, rel=1e-12, abs=1e-20)


def test_crossover_hand_computed_rtx_case() -> None:
    """RTX PRO 6000, μ_L = 512, μ_O = 256 (r = 1/3): numbers checked by hand."""
    costs = RTX_PRO_6000
    terms = crossover_terms(costs=costs, theta0=0.05, mu_l_tokens=512.0, mu_o_tokens=256.0, n_obs=100.0)
    assert terms is not None
    assert terms.decode_ratio == pytest.approx(1.0 / 3.0, rel=1e-15)
    # β_MB^e(1/3) = a + b/3 + c/9
    beta_mb_e = 6.29342675989941e-05 + 0.00019689261661008702 / 3.0 + 9.8989734316548e-06 / 9.0
    # β_EB^w = (β_p·512 + β_d·256)/768 = (2β_p + β_d)/3
    beta_eb_w = (2.0 * 5.007938367705191e-05 + 0.00010388105329650523) / 3.0
    assert terms.lhs_s_per_token == pytest.approx(beta_mb_e - beta_eb_w, rel=1e-13)
    assert terms.lhs_s_per_token == pytest.approx(6.1652e-05, rel=1e-4)
    # RHS = [(α_p + α_d·ζ·256)/(0.05·100) − α_MB·257/100]/768, ζ = −ln 0.95
    zeta = math.log(1.0 / 0.95)
    rhs = ((0.004691170692443847 + 0.010375998928844651 * zeta * 256.0) / 5.0
           - 0.004691170692443847 * 257.0 / 100.0) / 768.0
    assert terms.rhs_s_per_token == pytest.approx(rhs, rel=1e-13)
    assert terms.rhs_s_per_token == pytest.approx(2.1005e-05, rel=1e-4)
    # LHS > RHS: EB wins at N_obs = 100 on the bandwidth-constrained GPU.
    assert instantaneous_mode(lhs_s_per_token=terms.lhs_s_per_token, rhs_s_per_token=terms.rhs_s_per_token,
                              delta_s_per_token=0.0) == Mode.EB


def test_rhs_is_order_one_over_n_obs_and_lhs_does_not_depend_on_it() -> None:
    theta0 = solve_theta0((1.0 / 256.0) * H200.alpha_p_s / H200.alpha_d_s)
    base = crossover_terms(costs=H200, theta0=theta0, mu_l_tokens=512.0, mu_o_tokens=256.0, n_obs=50.0)
    for factor in (2.0, 10.0, 40.0):
        scaled = crossover_terms(costs=H200, theta0=theta0, mu_l_tokens=512.0, mu_o_tokens=256.0,
                                 n_obs=50.0 * factor)
        assert scaled is not None and base is not None
        assert scaled.rhs_s_per_token == pytest.approx(base.rhs_s_per_token / factor, rel=1e-13)
        assert scaled.lhs_s_per_token == base.lhs_s_per_token


def test_rtx_switches_from_mb_to_eb_as_occupancy_grows() -> None:
    """Traffic awareness: light load → MB (RHS large), heavy load → EB (RHS → 0, LHS > 0 on RTX)."""
    theta0 = solve_theta0((1.0 / 256.0) * RTX_PRO_6000.alpha_p_s / RTX_PRO_6000.alpha_d_s)
    modes = []
    for n_obs in (1.0, 4.0, 16.0, 64.0, 256.0, 2048.0):
        terms = crossover_terms(costs=RTX_PRO_6000, theta0=theta0, mu_l_tokens=512.0, mu_o_tokens=256.0,
                                n_obs=n_obs)
        assert terms is not None
        modes.append(instantaneous_mode(lhs_s_per_token=terms.lhs_s_per_token,
                                        rhs_s_per_token=terms.rhs_s_per_token, delta_s_per_token=0.0))
    assert modes[0] == Mode.MB
    assert modes[-1] == Mode.EB
    first_eb = modes.index(Mode.EB)
    assert all(m == Mode.EB for m in modes[first_eb:])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"theta0": 0.0}, {"theta0": 1.0}, {"theta0": math.nan},
        {"mu_l_tokens": 0.0}, {"mu_l_tokens": -1.0}, {"mu_l_tokens": math.inf},
        {"mu_o_tokens": 0.0}, {"mu_o_tokens": math.nan},
        {"n_obs": 0.5}, {"n_obs": 0.0}, {"n_obs": math.inf}, {"n_obs": math.nan},
    ],
)
def test_crossover_terms_out_of_domain_is_none(kwargs: dict[str, float]) -> None:
    args = {"theta0": 0.1, "mu_l_tokens": 512.0, "mu_o_tokens": 256.0, "n_obs": 10.0} | kwargs
    assert crossover_terms(costs=H200, **args) is None


def test_crossover_terms_overflow_is_none() -> None:
    huge = CostModel(alpha_p_s=1e-3, beta_p_s_per_token=1e-5, alpha_d_s=1e-3, beta_d_s_per_request=1e-5,
                     alpha_mb_s=1e-3, mb_coeffs_s_per_token=(1.7e308, 1.7e308, 1.7e308))
    assert crossover_terms(costs=huge, theta0=0.1, mu_l_tokens=512.0, mu_o_tokens=256.0, n_obs=10.0) is None


def test_beta_mb_e_polynomial() -> None:
    a, b, c = H200.mb_coeffs_s_per_token
    for r in (0.0, 0.11, 0.5, 0.89, 1.0):
        assert H200.beta_mb_e(r) == pytest.approx(a + b * r + c * r * r, rel=1e-15)
    assert H200.beta_mb_e(0.0) == 2.494e-05


# ------------------------------------------------------------------------------- instantaneous rule


@pytest.mark.parametrize(
    ("lhs", "rhs", "delta", "expected"),
    [
        (1e-5, 2e-5, 0.0, Mode.MB),  # LHS < RHS
        (3e-5, 2e-5, 0.0, Mode.EB),  # LHS > RHS
        (2e-5, 2e-5, 0.0, Mode.EB),  # equality is not "<"
        (3e-5, 2e-5, 2e-5, Mode.MB),  # δ > 0 favours MB (TTFT)
        (1e-5, 2e-5, -2e-5, Mode.EB),  # δ < 0 favours EB (throughput)
    ],
)
def test_instantaneous_mode(lhs: float, rhs: float, delta: float, expected: Mode) -> None:
    assert instantaneous_mode(lhs_s_per_token=lhs, rhs_s_per_token=rhs, delta_s_per_token=delta) == expected


# ------------------------------------------------------------------------------------ select_mode

BAND = {"hysteresis_rel": 0.05, "hysteresis_abs_s_per_token": 1e-7, "cooldown_s": 30.0}


def choose(current: Mode, lhs: float, rhs: float, *, delta: float = 0.0, now: float = 100.0,
           last_switch: float = 0.0, **overrides):
    return select_mode(current=current, last_switch_s=last_switch, now_s=now, lhs_s_per_token=lhs,
                       rhs_s_per_token=rhs, delta_s_per_token=delta, **(BAND | overrides))


def test_select_mode_stays_when_target_is_current() -> None:
    assert choose(Mode.EB, 3e-5, 1e-5) == ModeChoice(Mode.EB, Reason.CROSSOVER_EB, False)
    assert choose(Mode.MB, 1e-5, 3e-5) == ModeChoice(Mode.MB, Reason.CROSSOVER_MB, False)
    # Even inside the cooldown: nothing to hold.
    assert choose(Mode.EB, 3e-5, 1e-5, now=1.0).reason == Reason.CROSSOVER_EB


def test_select_mode_hysteresis_band_edges() -> None:
    lhs, rhs = 3e-5, 1e-5
    band = 0.05 * (lhs + rhs) + 1e-7  # 2.1e-6
    # MB now; margin = RHS + δ − LHS. Margin −band exactly (inside, closed band): hold.
    choice = choose(Mode.MB, lhs, rhs, delta=2e-5 - band)
    assert choice.mode == Mode.MB
    assert choice.reason == Reason.HYSTERESIS_HOLD
    assert not choice.switched
    # Just outside the band: switch to EB (cooldown long over).
    choice = choose(Mode.MB, lhs, rhs, delta=2e-5 - 1.01 * band)
    assert choice == ModeChoice(Mode.EB, Reason.CROSSOVER_EB, True)


def test_select_mode_hysteresis_hold_both_directions() -> None:
    # EB now and MB slightly favoured (margin +1e-7 < band): hold EB.
    choice = choose(Mode.EB, 2e-5, 2e-5, delta=1e-7)
    assert choice == ModeChoice(Mode.EB, Reason.HYSTERESIS_HOLD, False)
    # MB now and EB slightly favoured: hold MB.
    choice = choose(Mode.MB, 2e-5, 2e-5, delta=-1e-7)
    assert choice == ModeChoice(Mode.MB, Reason.HYSTERESIS_HOLD, False)


def test_select_mode_cooldown_then_switch() -> None:
    lhs, rhs = 5e-5, 1e-5  # EB clearly favoured
    during = choose(Mode.MB, lhs, rhs, last_switch=100.0, now=129.999)
    assert during == ModeChoice(Mode.MB, Reason.COOLDOWN_HOLD, False)
    at_end = choose(Mode.MB, lhs, rhs, last_switch=100.0, now=130.0)
    assert at_end == ModeChoice(Mode.EB, Reason.CROSSOVER_EB, True)
    # Never switched before: last_switch = −inf, no cooldown applies.
    assert choose(Mode.MB, lhs, rhs, last_switch=-math.inf, now=0.0).switched


def test_select_mode_delta_direction() -> None:
    lhs, rhs = 3e-5, 2e-5  # EB at δ = 0
    assert choose(Mode.EB, lhs, rhs, delta=0.0).mode == Mode.EB
    assert choose(Mode.EB, lhs, rhs, delta=1e-4) == ModeChoice(Mode.MB, Reason.CROSSOVER_MB, True)  # δ > 0 → MB
    lhs, rhs = 1e-5, 2e-5  # MB at δ = 0
    assert choose(Mode.MB, lhs, rhs, delta=0.0).mode == Mode.MB
    assert choose(Mode.MB, lhs, rhs, delta=-1e-4) == ModeChoice(Mode.EB, Reason.CROSSOVER_EB, True)  # δ < 0 → EB


def test_select_mode_treats_passthrough_as_mb() -> None:
    assert choose(Mode.PASSTHROUGH, 1e-5, 3e-5) == ModeChoice(Mode.MB, Reason.CROSSOVER_MB, False)
    assert choose(Mode.PASSTHROUGH, 5e-5, 1e-5, last_switch=99.0) == ModeChoice(Mode.MB, Reason.COOLDOWN_HOLD, False)


def test_select_mode_without_band_or_cooldown_follows_the_rule() -> None:
    for lhs, rhs in ((1e-5, 1.0000001e-5), (1.0000001e-5, 1e-5)):
        expected = instantaneous_mode(lhs_s_per_token=lhs, rhs_s_per_token=rhs, delta_s_per_token=0.0)
        choice = choose(Mode.MB if expected == Mode.EB else Mode.EB, lhs, rhs, now=0.0, last_switch=0.0,
                        hysteresis_rel=0.0, hysteresis_abs_s_per_token=0.0, cooldown_s=0.0)
        assert choice.mode == expected
        assert choice.switched
