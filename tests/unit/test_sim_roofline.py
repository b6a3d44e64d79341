"""The twin's roofline step model: grounded in the data files, monotone, and faithful to the published
calibrations at short context."""

from __future__ import annotations

import itertools

import pytest

from controlplane.sim.calibrate import fit_step_params, prefill_intercept_gap_bytes
from controlplane.sim.hardware import (
    accelerators_from_json,
    get_accelerator,
    get_model,
    load_accelerators,
    load_models,
    models_from_json,
    read_data_file,
)
from controlplane.sim.profiles import PROFILES, get_profile, profile_from_json, profile_to_json
from controlplane.sim.roofline import (
    RooflineParams,
    RooflineSpec,
    RooflineStepModel,
    kv_capacity_tokens,
    prefill_pairs_from_scratch,
)

ROOFLINE_PROFILES = sorted(name for name, p in PROFILES.items() if p.roofline is not None)
CALIBRATIONS = read_data_file("calibrations.json")
FITS = read_data_file("roofline_fits.json")["profiles"]
# The roofline against the published eb-vllm lines at short context (calibrate.py's grid): the smooth maximum
# of compute and weight streaming bends where the published line is straight, most around the decode knee
# (64–128 requests); 12% bounds every residual roofline_fits.json records.
STEP_TOLERANCE = 0.12
PUBLISHED = {"h200-qwen3-8b": "qwen3-8b@h200", "rtx-pro-6000-qwen3-8b": "qwen3-8b@rtx-pro-6000"}


def test_every_data_file_names_its_source() -> None:
    for model in load_models().values():
        assert model.source.strip() and model.hf_id
    for accelerator in load_accelerators().values():
        assert accelerator.source.strip()
    for entry in CALIBRATIONS["published"].values():
        assert entry["source"].strip()
    for entry in CALIBRATIONS["priors"].values():
        assert entry["source"].strip()
    for name, entry in FITS.items():
        assert entry["source"].strip() and entry["calibration"], name


def test_a_data_entry_without_a_source_or_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(ValueError, match=r"models.json: models.m must be an object with a non-empty 'source'"):
        models_from_json({"models": {"m": {"hf_id": "x"}}})
    with pytest.raises(ValueError, match=r"accelerators.json: accelerators.a: .*unexpected keyword.*tflops"):
        accelerators_from_json({"accelerators": {"a": {"source": "s", "name": "n", "tflops": 1}}})


def test_architectures_give_the_published_parameter_counts() -> None:
    # Parameter counts the model cards publish: Qwen3-8B 8.2B, Qwen3-30B-A3B 30.5B (3.3B active), Qwen2.5-3B 3.09B.
    assert get_model("qwen3-8b").total_params / 1e9 == pytest.approx(8.19, abs=0.01)
    moe = get_model("qwen3-30b-a3b")
    assert moe.total_params / 1e9 == pytest.approx(30.5, abs=0.1)
    active = moe.linear_flops_per_token / 2 + moe.lm_head_params + moe.vocab_size * moe.hidden_size
    assert active / 1e9 == pytest.approx(3.3, abs=0.1)
    assert get_model("qwen2.5-3b").total_params / 1e9 == pytest.approx(3.09, abs=0.01)
    assert get_model("qwen3-8b").kv_bytes_per_token == 36 * 2 * 8 * 128 * 2


def test_a_mixture_of_experts_reads_only_the_experts_its_tokens_touch() -> None:
    moe, dense = get_model("qwen3-30b-a3b"), get_model("qwen3-8b")
    one, many = moe.weight_bytes_read(1), moe.weight_bytes_read(512)
    experts_one_token = moe.num_layers * moe.num_experts_per_token * moe.expert_params * moe.bytes_per_param
    assert many - one == pytest.approx(moe.num_layers * moe.num_experts * moe.expert_params * moe.bytes_per_param
                                       - experts_one_token, rel=1e-3)
    assert moe.weight_bytes_read(1) < moe.weight_bytes_read(8) < moe.weight_bytes_read(64) <= moe.weight_bytes
    assert dense.weight_bytes_read(1) == dense.weight_bytes_read(4096)


@pytest.mark.parametrize("name", ROOFLINE_PROFILES)
def test_step_time_grows_with_tokens_requests_and_context(name: str) -> None:
    model = RooflineStepModel(get_profile(name).roofline)
    prefill = [model.duration_s(n, 0, 0, prefill_pairs_from_scratch(n)) for n in (1, 64, 512, 2048, 8192, 16384)]
    decode = [model.duration_s(0, n, n * 512, 0) for n in (1, 16, 128, 512, 1024)]
    context = [model.duration_s(0, 256, 256 * c, 0) for c in (16, 512, 4096, 32768)]
    attention = [model.duration_s(2048, 0, 0, p) for p in (0, 10**6, 10**8, 10**9)]
    mixed = [model.duration_s(p, 256, 256 * 1024, prefill_pairs_from_scratch(p)) for p in (1, 512, 4096)]
    for series in (prefill, decode, context, attention, mixed):
        assert all(b > a for a, b in itertools.pairwise(series)), (name, series)
    assert model.duration_s(0, 0) == 0.0


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_roofline_reproduces_the_published_calibration_at_short_context(name: str) -> None:
    profile = get_profile(name)
    model = RooflineStepModel(profile.roofline)
    published = CALIBRATIONS["published"][PUBLISHED[name]]
    assumptions = CALIBRATIONS["assumptions"]
    context = assumptions["decode_context_tokens"]
    for n in assumptions["prefill_sizes_tokens"]:
        line = published["alpha_p_s"] + published["beta_p_s_per_token"] * n
        assert model.duration_s(n, 0, 0, prefill_pairs_from_scratch(n)) == pytest.approx(line, rel=STEP_TOLERANCE), n
    for n in assumptions["decode_counts"]:
        line = published["alpha_d_s"] + published["beta_d_s_per_request"] * n
        assert model.duration_s(0, n, n * context, 0) == pytest.approx(line, rel=STEP_TOLERANCE), n
    # The controller of these profiles uses the published calibration itself.
    assert profile.costs.alpha_d_s == published["alpha_d_s"]
    assert profile.costs.mb_coeffs_s_per_token == tuple(published["beta_mb_coeffs_s_per_token"])


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_shipped_step_factors_are_what_the_calibration_fit_gives(name: str) -> None:
    shipped = get_profile(name).roofline.params
    model_key, accelerator_key = PUBLISHED[name].split("@")
    fit = fit_step_params(model_key, accelerator_key, CALIBRATIONS["published"][PUBLISHED[name]],
                          CALIBRATIONS["assumptions"], weight_memory_efficiency=shipped.weight_memory_efficiency,
                          kv_memory_efficiency=shipped.kv_memory_efficiency)
    for field in ("prefill_compute_efficiency", "decode_compute_efficiency", "prefill_overhead_s", "decode_overhead_s"):
        assert getattr(fit.params, field) == pytest.approx(getattr(shipped, field), rel=1e-3), field
    recorded = FITS[name]["calibration"]
    for n, residual in fit.decode_residuals.items():
        assert residual == pytest.approx(recorded["decode_residuals"][str(n)], abs=1e-3)
        assert abs(residual) <= STEP_TOLERANCE


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_prefill_intercept_exceeds_the_roofline_line_by_about_one_weight_read(name: str) -> None:
    """The line through the twin's prefill steps at the calibration sizes crosses below the published α_p by
    about the model's weights read once at the card's bandwidth (13.4 / 16.6 GB for 16.4 GB of Qwen3-8B)."""
    profile = get_profile(name)
    model_key, _ = PUBLISHED[name].split("@")
    gap = prefill_intercept_gap_bytes(profile, CALIBRATIONS["published"][PUBLISHED[name]], CALIBRATIONS["assumptions"])
    weights = get_model(model_key).weight_bytes
    assert 0.7 * weights < gap < 1.1 * weights
    assert FITS[name]["calibration"]["prefill_intercept_gap_gb"] == pytest.approx(gap / 1e9, abs=0.01)


@pytest.mark.parametrize("name", ROOFLINE_PROFILES)
def test_every_profile_gives_the_controller_a_positive_prefill_intercept(name: str) -> None:
    """α_p > 0 in every shipped controller cost model: with α_p = 0, γ = p0·α_p/α_d = 0 puts θ0 at 0 and k̂*
    on the θ_min floor (k̂* 1 of N̂* 138 for WildChat on the L40S before the transferred gap)."""
    costs = get_profile(name).costs
    assert costs.alpha_p_s > 0.0
    assert costs.alpha_mb_s == costs.alpha_p_s


def test_bandwidth_bound_decode_follows_the_datasheets() -> None:
    """Same model and factors on two accelerators: a long-context decode step is dominated by KV reads, so its
    time scales with the inverse bandwidth."""
    model = get_model("qwen3-8b")
    params = RooflineParams(0.6, 0.3, 0.85, 0.75, 0.0, 0.0)
    steps = {key: RooflineStepModel(RooflineSpec(model, get_accelerator(key), params)).duration_s(0, 64, 64 * 32768)
             for key in ("h200", "l40s")}
    h200, l40s = get_accelerator("h200"), get_accelerator("l40s")
    bandwidth = h200.memory_bandwidth_bytes_per_s / l40s.memory_bandwidth_bytes_per_s
    assert steps["l40s"] / steps["h200"] == pytest.approx(bandwidth, rel=0.05)


def test_kv_capacity_from_memory_and_weights_that_do_not_fit_are_refused() -> None:
    # H200: 0.9 × 141 GB − 16.4 GB of weights − 4 GB, over 144 KiB per token.
    assert kv_capacity_tokens(get_model("qwen3-8b"), get_accelerator("h200")) == pytest.approx(722_379, abs=1)
    with pytest.raises(ValueError, match=r"Qwen/Qwen3-30B-A3B on NVIDIA L40S: 61.1 GB of weights"):
        kv_capacity_tokens(get_model("qwen3-30b-a3b"), get_accelerator("l40s"))
    assert get_profile("l40s-qwen3-30b-a3b").roofline.model.bytes_per_param == 1


def test_profiles_take_their_context_limit_from_the_model_config() -> None:
    assert get_profile("h200-qwen3-8b").shape.max_model_len_tokens == 40_960
    assert get_profile("rtx-5090-qwen2.5-3b").shape.max_model_len_tokens == 32_768


@pytest.mark.parametrize("name", ROOFLINE_PROFILES)
def test_roofline_profiles_round_trip_through_json(name: str) -> None:
    profile = get_profile(name)
    assert profile_from_json(profile_to_json(profile)) == profile


def test_efficiencies_outside_the_physical_range_are_refused() -> None:
    with pytest.raises(ValueError, match="prefill_compute_efficiency must be in"):
        RooflineParams(0.0, 0.3, 0.85, 0.75, 0.0, 0.0)
    with pytest.raises(ValueError, match="decode_overhead_s must be finite and ≥ 0"):
        RooflineParams(0.6, 0.3, 0.85, 0.75, 0.0, -1.0)
