"""Iteration time of one engine step in the twin, from a profile.

A profile with a `roofline` runs on it (`controlplane.sim.roofline`: compute and memory time of the linear
layers and of attention from the model's architecture and the accelerator's datasheet, calibrated efficiency
factors, per-step overheads, the mixed-batch interference). Otherwise the linear model of its CostModel:

    prefill-only   α_p + β_p · prefill tokens                                         + λ · attention pairs
    decode-only    α_d + β_d · decoding requests                         + γ · Σ context of the decodes
    mixed          α_MB + β_MB^e(r) · (prefill tokens + decodes), r = decodes / tokens  + γ · Σ context
                                                                                      + λ · attention pairs

γ (`decode_context_s_per_token`) is the optional context-length term of the decodes and λ
(`prefill_attention_s_per_pair`) the optional prefix-attention term of the prefill chunks (a chunk of c
tokens after p computed ones has c·p + c·(c+1)/2 causal query-key pairs). Pure arithmetic; no I/O. Raises
nothing: negative inputs are the caller's bug and give what the formula gives.
"""

from __future__ import annotations

from controlplane.sim.profiles import SimProfile
from controlplane.sim.roofline import PREFILL_QUERY_TILE_TOKENS, RooflineStepModel


def attention_pairs(chunk_tokens: int, prefix_tokens: int) -> int:
    """Causal query-key pairs of a prefill chunk of `chunk_tokens` after `prefix_tokens` computed ones."""
    return chunk_tokens * prefix_tokens + chunk_tokens * (chunk_tokens + 1) // 2


class StepCosts:
    """The cost formulas of one profile, with the constants unpacked for the per-step hot path.

    `context_s_per_token` and `attention_s_per_pair` are the marginal seconds of one decode context token and
    one prefill query-key pair (for a roofline profile: at its KV bandwidth and prefill FLOP rate); the engine
    counts context and pairs only when they are > 0."""

    __slots__ = ("_a_d", "_a_mb", "_a_p", "_b_d", "_b_p", "_c0", "_c1", "_c2", "_roofline", "attention_s_per_pair",
                 "context_s_per_token")

    def __init__(self, profile: SimProfile) -> None:
        c = profile.costs
        self._a_p, self._b_p = c.alpha_p_s, c.beta_p_s_per_token
        self._a_d, self._b_d = c.alpha_d_s, c.beta_d_s_per_request
        self._a_mb = c.alpha_mb_s
        self._c0, self._c1, self._c2 = c.mb_coeffs_s_per_token
        self._roofline = RooflineStepModel(profile.roofline) if profile.roofline is not None else None
        if profile.roofline is not None:
            spec = profile.roofline
            bandwidth = spec.accelerator.memory_bandwidth_bytes_per_s * spec.params.kv_memory_efficiency
            flops = spec.accelerator.peak_bf16_dense_flops * spec.params.prefill_compute_efficiency
            self.context_s_per_token = spec.model.kv_bytes_per_token / bandwidth
            self.attention_s_per_pair = max(spec.model.attention_flops_per_pair / flops,
                                            spec.model.kv_bytes_per_token / PREFILL_QUERY_TILE_TOKENS / bandwidth)
        else:
            self.context_s_per_token = profile.decode_context_s_per_token
            self.attention_s_per_pair = profile.prefill_attention_s_per_pair

    def duration_s(self, prefill_tokens: int, num_decodes: int, decode_context_tokens: int = 0,
                   prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step with `prefill_tokens` prefill tokens and `num_decodes` decodes (one token each)
        whose KV contexts sum to `decode_context_tokens`, the prefill chunks having `prefill_attention_pairs`
        query-key pairs. 0.0 for an empty step."""
        if self._roofline is not None:
            return self._roofline.duration_s(prefill_tokens, num_decodes, decode_context_tokens,
                                             prefill_attention_pairs)
        attention = self.attention_s_per_pair * prefill_attention_pairs
        if num_decodes == 0:
            if prefill_tokens == 0:
                return 0.0
            return self._a_p + self._b_p * prefill_tokens + attention
        context = self.context_s_per_token * decode_context_tokens
        if prefill_tokens == 0:
            return self._a_d + self._b_d * num_decodes + context
        tokens = prefill_tokens + num_decodes
        r = num_decodes / tokens
        return self._a_mb + (self._c0 + self._c1 * r + self._c2 * r * r) * tokens + context + attention
