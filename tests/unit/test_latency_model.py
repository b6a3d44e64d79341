"""The queueing estimate of TTFT and TPOT per mode (`core.latency_model`): its limits at no load and at
saturation, its monotonicity in the load and the budget, and its refusal of loads it cannot use."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controlplane.core.latency_model import EngineLoad, load_problem, predict, prompt_quantile_tokens
from controlplane.core.types import CostModel, Mode
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B

LOAD = EngineLoad(arrival_rate_per_s=10.0, mu_l_tokens=400.0, mu_o_tokens=250.0, max_running=1024, k=32,
                  b_max_tokens=8192, b_cap_tokens=2048)


@pytest.mark.parametrize("mode", [Mode.EB, Mode.MB])
def test_at_almost_no_load_ttft_is_one_step_plus_the_prompt_and_tpot_one_step(mode: Mode) -> None:
    costs = H200_QWEN3_8B
    load = replace(LOAD, arrival_rate_per_s=1e-6)
    prediction = predict(mode, costs, load, quantile=0.99)
    prompt = prompt_quantile_tokens(load, 0.99)
    if mode == Mode.EB:
        alone = costs.alpha_p_s + costs.beta_p_s_per_token * prompt
        assert prediction.tpot_s == pytest.approx(costs.alpha_d_s, rel=1e-3)
        assert alone <= prediction.ttft_s <= alone + costs.alpha_d_s
    else:  # between prompts MB runs decode-only steps; a prompt shorter than the budget takes one mixed step
        alone = costs.alpha_mb_s + costs.beta_mb_e(0.0) * prompt
        assert prediction.tpot_s == pytest.approx(costs.alpha_d_s, rel=1e-3)
        assert prediction.ttft_s == pytest.approx(costs.alpha_d_s + alone, rel=0.05)


@pytest.mark.parametrize("mode", [Mode.EB, Mode.MB])
@pytest.mark.parametrize("costs", [H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B])
def test_latencies_grow_with_the_arrival_rate_until_the_engine_cannot_keep_up(mode: Mode, costs) -> None:
    previous_ttft = previous_tpot = 0.0
    became_unstable = False
    for rate in [0.5 * 1.25 ** i for i in range(40)]:
        prediction = predict(mode, costs, replace(LOAD, arrival_rate_per_s=rate), quantile=0.99)
        if not prediction.stable:
            became_unstable = True
            assert math.isinf(prediction.ttft_s) and math.isinf(prediction.tpot_s)
            continue
        assert not became_unstable, "stable again at a higher rate"
        assert prediction.ttft_s >= previous_ttft and prediction.tpot_s >= previous_tpot
        assert 0.0 <= prediction.utilisation < 1.0
        previous_ttft, previous_tpot = prediction.ttft_s, prediction.tpot_s
    assert became_unstable  # 0.5 × 1.25^39 ≈ 3,000 requests/s is past any of these engines


def test_mb_ttft_never_rises_with_a_larger_budget_and_falls_under_pressure() -> None:
    for rate, prompt, output in [(5.0, 400.0, 250.0), (60.0, 300.0, 20.0), (100.0, 300.0, 20.0)]:
        load = replace(LOAD, arrival_rate_per_s=rate, mu_l_tokens=prompt, mu_o_tokens=output)
        ttft = [predict(Mode.MB, H200_QWEN3_8B, replace(load, b_cap_tokens=cap), quantile=0.99).ttft_s
                for cap in (512, 1024, 2048, 4096, 8192)]
        assert ttft == sorted(ttft, reverse=True)
    # At 100/s prefills queue beside decodes: B_cap binds (3% from 512 to 8,192 tokens: a step's decodes cost what
    # the mixed fit gives at that step's own decode ratio, small beside a full chunk).
    assert ttft[0] > 1.02 * ttft[-1]


def test_mb_on_long_prompts_is_read_where_its_mixed_steps_are_not_extrapolated_to_decode_only_steps() -> None:
    # An online fit of a twin H200 pool serving LongBench-like prompts (mean 5,300 tokens) on MB: its mixed steps
    # all carry a prompt chunk (decode ratio under 5%; decode-only steps are the decode line's), so the quadratic's
    # c2 is large and meaningless at r = 1 (β_MB^e(1) = 23 ms a token). Read at r = 1 it called MB unstable
    # (utilisation 5.6) where the pool served it with a TTFT p99 of 1.16 s.
    costs = CostModel(alpha_p_s=0.00128, beta_p_s_per_token=2.49e-5, alpha_d_s=0.0098, beta_d_s_per_request=2.2e-4,
                      alpha_mb_s=0.00324, mb_coeffs_s_per_token=(2.71e-5, -4.61e-5, 0.0228))
    load = EngineLoad(arrival_rate_per_s=1.6, mu_l_tokens=5314.0, mu_o_tokens=146.0, max_running=1024, k=19,
                      b_max_tokens=8192, b_cap_tokens=2048)
    mb = predict(Mode.MB, costs, load, quantile=0.99)
    assert mb.stable and mb.utilisation < 0.5
    assert 0.5 < mb.ttft_s < 2.0
    assert costs.alpha_d_s < mb.tpot_s < 2.0 * costs.alpha_d_s  # decode-only steps, and a chunk step now and then


def test_a_saturated_eb_engine_waits_for_k_completions_before_a_refill() -> None:
    roomy = predict(Mode.EB, H200_QWEN3_8B, replace(LOAD, max_running=1024, k=32), quantile=0.99)
    tight = predict(Mode.EB, H200_QWEN3_8B, replace(LOAD, max_running=int(roomy.running) + 8, k=32), quantile=0.99)
    assert tight.ttft_s == pytest.approx(roomy.ttft_s + 0.99 * 32 / LOAD.arrival_rate_per_s, rel=1e-6)


def test_the_prompt_quantile_is_capped_by_the_longest_prompt() -> None:
    assert prompt_quantile_tokens(LOAD, 0.99) == pytest.approx(400.0 * math.log(100.0))
    assert prompt_quantile_tokens(replace(LOAD, max_prompt_tokens=1000), 0.99) == 1000.0


@pytest.mark.parametrize(("load", "problem"), [
    (replace(LOAD, arrival_rate_per_s=-1.0), "arrival rate"),
    (replace(LOAD, arrival_rate_per_s=math.nan), "arrival rate"),
    (replace(LOAD, mu_l_tokens=0.0), "mean lengths"),
    (replace(LOAD, mu_o_tokens=math.inf), "mean lengths"),
    (replace(LOAD, k=0), "k"),
    (replace(LOAD, k=2000), "k"),
    (replace(LOAD, b_cap_tokens=0), "budgets"),
])
def test_unusable_loads_are_named_and_refused(load: EngineLoad, problem: str) -> None:
    found = load_problem(load)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match=problem):
        predict(Mode.EB, H200_QWEN3_8B, load, quantile=0.99)


def test_the_quantile_must_be_inside_zero_one() -> None:
    with pytest.raises(ValueError, match="quantile"):
        predict(Mode.MB, H200_QWEN3_8B, LOAD, quantile=1.0)
