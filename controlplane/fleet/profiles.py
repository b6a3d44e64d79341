"""Published cost profiles and engine shapes the fake engines default to.

Cost models are the eb-vllm reference calibrations for Qwen3-8B (DESIGN.md, Appendix A), in seconds;
α_MB is absent from the calibration files and defaults to α_p, as in the decision core.
Constants only (frozen values); nothing here is mutable.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.core.types import CostModel

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


@dataclass(frozen=True, slots=True)
class EngineShape:
    """Start-up limits of a fake engine (what vLLM would be launched with).

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


H200_QWEN3_8B_SHAPE = EngineShape()
