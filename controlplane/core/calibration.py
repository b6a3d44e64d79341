"""Calibration profiles in the eb-vllm JSON formats (parsing and rendering; the caller does file I/O).

Two formats are read as they are:
- `pd_calibration_<model>_<gpu>.json`: alpha_p, beta_p, alpha_d, beta_d (seconds), model, device_name,
  dtype, timestamp, prefill_r2, decode_r2, prefill_sizes, decode_counts, num_iterations and, from the
  full-iteration variant, measurement_type.
- `beta_mb_<model>_<gpu>.json`: model, device_name, beta_mb_coefficients {"a (s/tok)", "b (s/tok)",
  "c (s/tok)"}, env_vars_for_pd_auto (old `VLLM_PD_CP_COST_{A,B,C}` or new `VLLM_PD_MB_COST_{A,B,C}`
  names), optionally fit_method, fit_data_source, scenarios, timestamp.

Neither format carries α_MB; a profile without it uses α_p, the approximation the reference
implementation makes (a mixed step's fixed cost is that of a prefill launch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.core.types import CostModel

_MB_KEYS = ("a (s/tok)", "b (s/tok)", "c (s/tok)")
_ENV_PREFIX_NEW = "VLLM_PD_MB_COST_"
_ENV_PREFIX_OLD = "VLLM_PD_CP_COST_"
_PD_KEYS = ("alpha_p", "beta_p", "alpha_d", "beta_d")


class CalibrationError(ValueError):
    """A calibration document is malformed; the message names the field."""


@dataclass(frozen=True, slots=True)
class CalibrationProfile:
    """Cost parameters of one (model, device); any part may be missing until profiles are merged."""

    model: str = ""
    device_name: str = ""
    alpha_p_s: float | None = None
    beta_p_s_per_token: float | None = None
    alpha_d_s: float | None = None
    beta_d_s_per_request: float | None = None
    alpha_mb_s: float | None = None
    mb_coeffs_s_per_token: tuple[float, float, float] | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def merged(self, other: CalibrationProfile) -> CalibrationProfile:
        """This profile with every field `other` sets taken from `other`."""
        updates = {
            name: getattr(other, name)
            for name in ("alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request",
                         "alpha_mb_s", "mb_coeffs_s_per_token")
            if getattr(other, name) is not None
        }
        return replace(
            self,
            model=other.model or self.model,
            device_name=other.device_name or self.device_name,
            metadata={**self.metadata, **other.metadata},
            **updates,
        )

    def to_cost_model(self) -> CostModel | None:
        """A CostModel when α_p, β_p, α_d, β_d are known; MB coefficients default to 0, α_MB to α_p."""
        if None in (self.alpha_p_s, self.beta_p_s_per_token, self.alpha_d_s, self.beta_d_s_per_request):
            return None
        return CostModel(
            alpha_p_s=self.alpha_p_s,
            beta_p_s_per_token=self.beta_p_s_per_token,
            alpha_d_s=self.alpha_d_s,
            beta_d_s_per_request=self.beta_d_s_per_request,
            alpha_mb_s=self.alpha_mb_s if self.alpha_mb_s is not None else self.alpha_p_s,
            mb_coeffs_s_per_token=self.mb_coeffs_s_per_token or (0.0, 0.0, 0.0),
        )


def _number(document: Mapping[str, Any], key: str, *, where: str) -> float:
    value = document.get(key)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise CalibrationError(f"{where}: field {key!r} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise CalibrationError(f"{where}: field {key!r} must be finite, got {value!r}")
    return number


def parse_calibration(document: Mapping[str, Any]) -> CalibrationProfile:
    """Parse either eb-vllm format (detected by its keys).

    Raises:
        CalibrationError naming the missing or malformed field.
    """
    if not isinstance(document, Mapping):
        raise CalibrationError(f"calibration must be a JSON object, got {type(document).__name__}")
    model = str(document.get("model", ""))
    device = str(document.get("device_name", ""))
    if any(key in document for key in _PD_KEYS):
        where = "pd_calibration"
        alpha_p, beta_p, alpha_d, beta_d = (_number(document, k, where=where) for k in _PD_KEYS)
        metadata = {k: v for k, v in document.items() if k not in (*_PD_KEYS, "model", "device_name")}
        return CalibrationProfile(
            model=model, device_name=device, alpha_p_s=alpha_p, beta_p_s_per_token=beta_p,
            alpha_d_s=alpha_d, beta_d_s_per_request=beta_d, metadata=metadata,
        )
    if "beta_mb_coefficients" in document or "env_vars_for_pd_auto" in document:
        return CalibrationProfile(
            model=model, device_name=device, mb_coeffs_s_per_token=_mb_coefficients(document),
            metadata={k: v for k, v in document.items()
                      if k not in ("beta_mb_coefficients", "env_vars_for_pd_auto", "model", "device_name")},
        )
    raise CalibrationError(
        "unknown calibration format: expected alpha_p/beta_p/alpha_d/beta_d (pd_calibration) or "
        "beta_mb_coefficients/env_vars_for_pd_auto (beta_mb)"
    )


def _mb_coefficients(document: Mapping[str, Any]) -> tuple[float, float, float]:
    coefficients = document.get("beta_mb_coefficients")
    if coefficients is not None:
        if not isinstance(coefficients, Mapping):
            raise CalibrationError("beta_mb: field 'beta_mb_coefficients' must be an object")
        a, b, c = (_number(coefficients, key, where="beta_mb.beta_mb_coefficients") for key in _MB_KEYS)
        return a, b, c
    env = document.get("env_vars_for_pd_auto")
    if not isinstance(env, Mapping):
        raise CalibrationError("beta_mb: field 'env_vars_for_pd_auto' must be an object")
    for prefix in (_ENV_PREFIX_NEW, _ENV_PREFIX_OLD):
        names = [f"{prefix}{letter}" for letter in "ABC"]
        if all(name in env for name in names):
            a, b, c = (_number(env, name, where="beta_mb.env_vars_for_pd_auto") for name in names)
            return a, b, c
    raise CalibrationError(
        f"beta_mb: env_vars_for_pd_auto needs {_ENV_PREFIX_NEW}A/B/C or {_ENV_PREFIX_OLD}A/B/C"
    )


def render_pd_calibration(profile: CalibrationProfile) -> dict[str, Any]:
    """The pd_calibration document of a profile (its extra metadata fields are carried over)."""
    if None in (profile.alpha_p_s, profile.beta_p_s_per_token, profile.alpha_d_s, profile.beta_d_s_per_request):
        raise CalibrationError("profile lacks alpha_p/beta_p/alpha_d/beta_d")
    return {
        **{k: v for k, v in profile.metadata.items() if k not in ("fit_method", "fit_data_source", "scenarios")},
        "model": profile.model,
        "device_name": profile.device_name,
        "alpha_p": profile.alpha_p_s,
        "beta_p": profile.beta_p_s_per_token,
        "alpha_d": profile.alpha_d_s,
        "beta_d": profile.beta_d_s_per_request,
    }


def render_beta_mb(profile: CalibrationProfile, *, legacy_env_names: bool = False) -> dict[str, Any]:
    """The beta_mb document of a profile, with new (or, on request, old) environment variable names."""
    if profile.mb_coeffs_s_per_token is None:
        raise CalibrationError("profile lacks the beta_mb coefficients")
    prefix = _ENV_PREFIX_OLD if legacy_env_names else _ENV_PREFIX_NEW
    a, b, c = profile.mb_coeffs_s_per_token
    return {
        "model": profile.model,
        "device_name": profile.device_name,
        "beta_mb_coefficients": dict(zip(_MB_KEYS, (a, b, c), strict=True)),
        "env_vars_for_pd_auto": {f"{prefix}{letter}": repr(v) for letter, v in zip("ABC", (a, b, c), strict=True)},
        **{k: v for k, v in profile.metadata.items() if k in ("fit_method", "fit_data_source", "scenarios",
                                                                "timestamp")},
    }
