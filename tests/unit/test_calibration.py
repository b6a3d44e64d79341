"""eb-vllm calibration formats: pd_calibration and beta_mb (old and new env names), round trips, errors."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from controlplane.core.calibration import (
    CalibrationError,
    CalibrationProfile,
    parse_calibration,
    render_beta_mb,
    render_pd_calibration,
)
from controlplane.core.types import CostModel

H200 = {
    "alpha_p": 0.0012785933415095027, "beta_p": 2.4852551825304505e-05,
    "alpha_d": 0.008921181622454422, "beta_d": 4.586467522217373e-05,
    "abc": (2.494e-05, 5.193e-05, 1.478e-05),
}
RTX = {
    "alpha_p": 0.004691170692443847, "beta_p": 5.007938367705191e-05,
    "alpha_d": 0.010375998928844651, "beta_d": 0.00010388105329650523,
    "abc": (6.29342675989941e-05, 0.00019689261661008702, 9.8989734316548e-06),
}
MB_KEYS = ("a (s/tok)", "b (s/tok)", "c (s/tok)")


def pd_document(values: dict[str, Any], device: str, **extra: Any) -> dict[str, Any]:
    """A pd_calibration_<model>_<gpu>.json document as eb-vllm writes it."""
    return {
        "model": "Qwen/Qwen3-8B",
        "device_name": device,
        "dtype": "bfloat16",
        "timestamp": "2026-05-16T14:45:55",
        "alpha_p": values["alpha_p"],
        "beta_p": values["beta_p"],
        "alpha_d": values["alpha_d"],
        "beta_d": values["beta_d"],
        "prefill_r2": 0.99987,
        "decode_r2": 0.99412,
        "prefill_sizes": [128, 256, 512, 1024, 2048, 4096, 8192],
        "decode_counts": [1, 8, 32, 64, 128, 256, 512],
        "num_iterations": 20,
        **extra,
    }


def beta_mb_document(abc: tuple[float, float, float], device: str, *, prefix: str = "VLLM_PD_CP_COST_",
                     coefficients: bool = True, env: bool = True) -> dict[str, Any]:
    """A beta_mb_<model>_<gpu>.json document (env values are strings, "%.6e" as the fit script writes)."""
    document: dict[str, Any] = {"model": "Qwen/Qwen3-8B", "device_name": device}
    if coefficients:
        document["beta_mb_coefficients"] = dict(zip(MB_KEYS, abc, strict=True))
    if env:
        document["env_vars_for_pd_auto"] = {f"{prefix}{x}": f"{v:.6e}" for x, v in zip("ABC", abc, strict=True)}
    return document


# ---------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("values", "device"), [(H200, "NVIDIA H200"), (RTX, "NVIDIA RTX PRO 6000 Blackwell")])
def test_parse_pd_calibration(values: dict[str, Any], device: str) -> None:
    profile = parse_calibration(pd_document(values, device))
    assert profile.model == "Qwen/Qwen3-8B"
    assert profile.device_name == device
    assert profile.alpha_p_s == values["alpha_p"]
    assert profile.beta_p_s_per_token == values["beta_p"]
    assert profile.alpha_d_s == values["alpha_d"]
    assert profile.beta_d_s_per_request == values["beta_d"]
    assert profile.alpha_mb_s is None
    assert profile.mb_coeffs_s_per_token is None
    assert profile.metadata["dtype"] == "bfloat16"
    assert profile.metadata["prefill_r2"] == 0.99987
    assert profile.metadata["decode_counts"][-1] == 512
    assert profile.metadata["num_iterations"] == 20
    assert "alpha_p" not in profile.metadata
    assert "model" not in profile.metadata
    costs = profile.to_cost_model()
    assert costs == CostModel(
        alpha_p_s=values["alpha_p"], beta_p_s_per_token=values["beta_p"], alpha_d_s=values["alpha_d"],
        beta_d_s_per_request=values["beta_d"], alpha_mb_s=values["alpha_p"],  # α_MB ≈ α_p
        mb_coeffs_s_per_token=(0.0, 0.0, 0.0),
    )


def test_parse_full_iteration_variant_keeps_measurement_type() -> None:
    profile = parse_calibration(pd_document(H200, "NVIDIA H200", measurement_type="full_iteration"))
    assert profile.metadata["measurement_type"] == "full_iteration"
    assert profile.alpha_d_s == H200["alpha_d"]


def test_parse_pd_calibration_from_json_text_with_integer_and_string_numbers() -> None:
    document = json.loads(json.dumps(pd_document(H200, "NVIDIA H200") | {"alpha_p": "0.0012785933415095027",
                                                                          "beta_d": 1}))
    profile = parse_calibration(document)
    assert profile.alpha_p_s == H200["alpha_p"]
    assert profile.beta_d_s_per_request == 1.0


@pytest.mark.parametrize(("values", "device"), [(H200, "H200"), (RTX, "RTX_PRO_6000")])
@pytest.mark.parametrize("prefix", ["VLLM_PD_CP_COST_", "VLLM_PD_MB_COST_"])
def test_parse_beta_mb_with_coefficients(values: dict[str, Any], device: str, prefix: str) -> None:
    profile = parse_calibration(beta_mb_document(values["abc"], device, prefix=prefix))
    # The exact floats of beta_mb_coefficients win over the rounded env strings.
    assert profile.mb_coeffs_s_per_token == values["abc"]
    assert profile.device_name == device
    assert profile.alpha_p_s is None
    assert profile.to_cost_model() is None  # α/β still missing


@pytest.mark.parametrize(("values", "device"), [(H200, "H200"), (RTX, "RTX_PRO_6000")])
@pytest.mark.parametrize("prefix", ["VLLM_PD_CP_COST_", "VLLM_PD_MB_COST_"])
def test_parse_beta_mb_with_only_env_vars(values: dict[str, Any], device: str, prefix: str) -> None:
    profile = parse_calibration(beta_mb_document(values["abc"], device, prefix=prefix, coefficients=False))
    expected = tuple(float(f"{v:.6e}") for v in values["abc"])
    assert profile.mb_coeffs_s_per_token == expected
    assert profile.mb_coeffs_s_per_token == pytest.approx(values["abc"], rel=1e-6)


def test_parse_env_vars_prefers_new_names_when_both_are_present() -> None:
    document = {"env_vars_for_pd_auto": {
        "VLLM_PD_CP_COST_A": "1", "VLLM_PD_CP_COST_B": "2", "VLLM_PD_CP_COST_C": "3",
        "VLLM_PD_MB_COST_A": "4", "VLLM_PD_MB_COST_B": "5", "VLLM_PD_MB_COST_C": "6",
    }}
    assert parse_calibration(document).mb_coeffs_s_per_token == (4.0, 5.0, 6.0)


def test_merging_pd_and_beta_mb_profiles_gives_a_full_cost_model() -> None:
    pd = parse_calibration(pd_document(RTX, "RTX_PRO_6000"))
    mb = parse_calibration(beta_mb_document(RTX["abc"], "RTX_PRO_6000") | {"fit_method": "lstsq"})
    merged = pd.merged(mb)
    assert merged.to_cost_model() == CostModel(
        alpha_p_s=RTX["alpha_p"], beta_p_s_per_token=RTX["beta_p"], alpha_d_s=RTX["alpha_d"],
        beta_d_s_per_request=RTX["beta_d"], alpha_mb_s=RTX["alpha_p"], mb_coeffs_s_per_token=RTX["abc"],
    )
    assert merged.metadata["fit_method"] == "lstsq"
    assert merged.metadata["dtype"] == "bfloat16"
    # The later profile's fields win; unset ones do not erase earlier ones.
    override = merged.merged(CalibrationProfile(alpha_d_s=0.5))
    assert override.alpha_d_s == 0.5
    assert override.alpha_p_s == RTX["alpha_p"]
    assert override.mb_coeffs_s_per_token == RTX["abc"]
    assert override.device_name == "RTX_PRO_6000"


# ------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize(("values", "device"), [(H200, "NVIDIA H200"), (RTX, "RTX PRO 6000")])
def test_pd_calibration_round_trip(values: dict[str, Any], device: str) -> None:
    profile = parse_calibration(pd_document(values, device, measurement_type="full_iteration"))
    document = json.loads(json.dumps(render_pd_calibration(profile)))
    assert document["alpha_p"] == values["alpha_p"]
    assert document["measurement_type"] == "full_iteration"
    assert document["prefill_sizes"] == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert parse_calibration(document) == profile


@pytest.mark.parametrize(("values", "device"), [(H200, "H200"), (RTX, "RTX_PRO_6000")])
@pytest.mark.parametrize("legacy", [False, True])
def test_beta_mb_round_trip(values: dict[str, Any], device: str, legacy: bool) -> None:
    profile = CalibrationProfile(model="Qwen/Qwen3-8B", device_name=device, mb_coeffs_s_per_token=values["abc"],
                                 metadata={"fit_method": "lstsq", "timestamp": "2026-05-16"})
    document = json.loads(json.dumps(render_beta_mb(profile, legacy_env_names=legacy)))
    prefix = "VLLM_PD_CP_COST_" if legacy else "VLLM_PD_MB_COST_"
    assert set(document["env_vars_for_pd_auto"]) == {f"{prefix}A", f"{prefix}B", f"{prefix}C"}
    assert document["beta_mb_coefficients"] == dict(zip(MB_KEYS, values["abc"], strict=True))
    assert parse_calibration(document) == profile
    # The env strings alone carry the exact values too.
    del document["beta_mb_coefficients"]
    assert parse_calibration(document).mb_coeffs_s_per_token == values["abc"]


def test_render_refuses_incomplete_profiles() -> None:
    with pytest.raises(CalibrationError, match="alpha_p"):
        render_pd_calibration(CalibrationProfile(alpha_p_s=1.0, beta_p_s_per_token=1.0, alpha_d_s=1.0))
    with pytest.raises(CalibrationError, match="beta_mb"):
        render_beta_mb(CalibrationProfile(alpha_p_s=1.0))


# ---------------------------------------------------------------------------------- malformed input


def without(document: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != key}


@pytest.mark.parametrize(
    ("document", "named"),
    [
        (without(pd_document(H200, "H200"), "alpha_d"), "'alpha_d'"),
        (without(pd_document(H200, "H200"), "beta_p"), "'beta_p'"),
        (pd_document(H200, "H200") | {"alpha_p": "fast"}, "'alpha_p'"),
        (pd_document(H200, "H200") | {"beta_d": [1.0]}, "'beta_d'"),
        (pd_document(H200, "H200") | {"beta_p": math.nan}, "'beta_p'"),
        (pd_document(H200, "H200") | {"alpha_d": "inf"}, "'alpha_d'"),
        (pd_document(H200, "H200") | {"alpha_p": None}, "'alpha_p'"),
        ({"beta_mb_coefficients": [1, 2, 3]}, "'beta_mb_coefficients'"),
        ({"beta_mb_coefficients": {"a (s/tok)": 1.0, "c (s/tok)": 3.0}}, "'b (s/tok)'"),
        ({"beta_mb_coefficients": {"a (s/tok)": 1.0, "b (s/tok)": "x", "c (s/tok)": 3.0}}, "'b (s/tok)'"),
        ({"env_vars_for_pd_auto": "VLLM_PD_MB_COST_A=1"}, "env_vars_for_pd_auto"),
        ({"env_vars_for_pd_auto": {"VLLM_PD_MB_COST_A": "1", "VLLM_PD_MB_COST_B": "2"}}, "env_vars_for_pd_auto"),
        ({"env_vars_for_pd_auto": {"VLLM_PD_CP_COST_A": "1", "VLLM_PD_CP_COST_B": "oops",
                                   "VLLM_PD_CP_COST_C": "3"}}, "'VLLM_PD_CP_COST_B'"),
        ({"env_vars_for_pd_auto": {"VLLM_PD_MB_COST_A": "1", "VLLM_PD_MB_COST_B": "2",
                                   "VLLM_PD_MB_COST_C": "nan"}}, "'VLLM_PD_MB_COST_C'"),
        ({"model": "Qwen/Qwen3-8B"}, "unknown calibration format"),
        ([1.0, 2.0], "JSON object"),
    ],
)
def test_malformed_documents_name_the_field(document: Any, named: str) -> None:
    with pytest.raises(CalibrationError) as raised:
        parse_calibration(document)
    assert named in str(raised.value)
    assert isinstance(raised.value, ValueError)
