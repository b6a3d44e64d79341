"""The twin's roofline step model: one engine step's time from the model's architecture, the accelerator's
datasheet peaks and a handful of calibrated efficiency factors and overheads.

A step runs two kinds of kernels one after the other, and each kind takes the longer of its compute time
and its memory time (a roofline per kernel kind):

    linear layers   smax( FLOPs_lin / (peak · e_c),  weight bytes read / (bandwidth · e_w) )
    attention       max( FLOPs_attn / (peak · e_c), KV bytes read / (bandwidth · e_kv) )

smax(a, b) = (a² + b²)^½ is a smooth maximum: the linear layers' many GEMMs do not all sit on the same side
of the ridge point, so compute and weight streaming overlap only partly near it. Against the published
eb-vllm lines a sharp max leaves up to 20% error around the decode knee (64–128 requests) and a plain sum
(no overlap) +19% on short prefills (it puts every prefill above the weight-streaming floor, which the
published α_p sits below); the smooth maximum stays within about 11% everywhere (calibrate.py reports it).

    prefill-only    o_p + linear + attention
    decode-only     o_d + linear + attention
    mixed           max(o_p, o_d) + linear + attention + κ · P·D / (P + D)

FLOPs: 2 per multiply-add of the active weights per token (decode tokens also pay the LM head: they are
sampled; a prefill chunk samples at most once and that is left out), 4·layers·heads·head_dim per causal
query-key pair. Prefill tokens compute at e_c = e_prefill, decode tokens at e_decode (small-M GEMMs, the
LM head and sampling per request); a mixed step's linear layers at the token-weighted mean. Bytes: the
weights a step touches (every expert a mixture of experts routes its tokens to, see
`ModelArchitecture.weight_bytes_read`); the decodes' whole KV context (Σ context · KV bytes per token); a
prefill chunk reads its prefix once per 128-query tile (pairs / 128 · KV bytes per token).

κ (`mixed_interference_s_per_token`) is the measured cost of mixing P prefill tokens and D decodes in one step:
the EB paper's kernel breakdowns ([EB] §1, [EB] App. A.2) put it in attention, where co-located prefill and
decode contend, and its convexity analysis ([EB] App. A.3, [EB] eq. (10)) gives it the form κ·n·r(1 − r) for
n = P + D tokens at decode ratio r = D / n, i.e. κ·P·D / (P + D): nothing when either side is absent, most at
r = ½. Only the r(1 − r) factor is the paper's: its κ is a dimensionless convexity index of the kernel-time
curve, negative where interference exists, not this cost in seconds per token. It does not grow with context
([EB] App. A.2: context lifts the mixed and decode curves alike). The crossover it implies, the decode ratio
above which a mixed step's marginal cost per token exceeds a decode step's, is what the paper publishes
([EB] §1, [EB] Fig. 1) and what calibrates it (`mixed_crossover_ratio`). Two other forms were tried against the
published figures and dropped: a constant cost per decoding request of a mixed step (the crossover then asks for
a cost that makes v1 on ShareGPT, whose mixed steps carry few prefill tokens, a quarter too slow), and the
decodes' KV reads slowed in mixed steps (it slows the prefill-heavy workload, whose contexts are longest,
where the published v1 is fastest).

Pure arithmetic on frozen data; no I/O. Negative counts are the caller's bug.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.sim.hardware import Accelerator, ModelArchitecture

PREFILL_QUERY_TILE_TOKENS = 128


@dataclass(frozen=True, slots=True)
class RooflineParams:
    """Calibrated factors of one (model, accelerator) pair. Efficiencies are fractions of the datasheet peak
    in (0, 1.5] (above 1 would mean the datasheet understates the part: refused past 1.5); times in seconds.

    prefill_compute_efficiency: e_prefill, the FLOP/s fraction prefill-token work reaches.
    decode_compute_efficiency: e_decode, the same for decode-token work (LM head, sampling included).
    weight_memory_efficiency: e_w, the bandwidth fraction of weight streaming.
    kv_memory_efficiency: e_kv, the bandwidth fraction of KV-cache reads by the attention kernels.
    prefill_overhead_s, decode_overhead_s: o_p, o_d, fixed time of a prefill-only / decode-only step (launch,
        scheduling, input preparation); a mixed step pays the larger.
    mixed_interference_s_per_token: κ, a mixed step's extra seconds per P·D / (P + D) token.
    """

    prefill_compute_efficiency: float
    decode_compute_efficiency: float
    weight_memory_efficiency: float
    kv_memory_efficiency: float
    prefill_overhead_s: float
    decode_overhead_s: float
    mixed_interference_s_per_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prefill_compute_efficiency", "decode_compute_efficiency", "weight_memory_efficiency",
                     "kv_memory_efficiency"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 < value <= 1.5):
                raise ValueError(f"roofline: {name} must be in (0, 1.5], got {value}")
        for name in ("prefill_overhead_s", "decode_overhead_s", "mixed_interference_s_per_token"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"roofline: {name} must be finite and ≥ 0, got {value}")


@dataclass(frozen=True, slots=True)
class RooflineSpec:
    """A step model as data: which model on which accelerator, and the calibrated factors."""

    model: ModelArchitecture
    accelerator: Accelerator
    params: RooflineParams


class RooflineStepModel:
    """Step durations of one `RooflineSpec` (constants unpacked for the per-step hot path)."""

    __slots__ = ("_attn_flops_per_pair", "_dense_weight_s", "_flop_s_decode", "_flop_s_prefill", "_kv_s_per_token",
                 "_lin_flops_decode", "_lin_flops_prefill", "_model", "_o_d", "_o_mb", "_o_p",
                 "_penalty", "_weight_s_per_byte", "spec")

    def __init__(self, spec: RooflineSpec) -> None:
        model, acc, p = spec.model, spec.accelerator, spec.params
        self.spec = spec
        self._model = model
        self._flop_s_prefill = 1.0 / (acc.peak_bf16_dense_flops * p.prefill_compute_efficiency)
        self._flop_s_decode = 1.0 / (acc.peak_bf16_dense_flops * p.decode_compute_efficiency)
        self._weight_s_per_byte = 1.0 / (acc.memory_bandwidth_bytes_per_s * p.weight_memory_efficiency)
        self._kv_s_per_token = model.kv_bytes_per_token / (acc.memory_bandwidth_bytes_per_s * p.kv_memory_efficiency)
        self._lin_flops_prefill = model.linear_flops_per_token
        self._lin_flops_decode = model.linear_flops_per_token + model.lm_head_flops_per_token
        self._attn_flops_per_pair = model.attention_flops_per_pair
        self._dense_weight_s = None if model.is_moe else model.weight_bytes_read(1) * self._weight_s_per_byte
        self._o_p, self._o_d = p.prefill_overhead_s, p.decode_overhead_s
        self._o_mb = max(p.prefill_overhead_s, p.decode_overhead_s)
        self._penalty = p.mixed_interference_s_per_token

    def _weight_s(self, num_tokens: int) -> float:
        if self._dense_weight_s is not None:
            return self._dense_weight_s
        return self._model.weight_bytes_read(num_tokens) * self._weight_s_per_byte

    def duration_s(self, prefill_tokens: int, num_decodes: int, decode_context_tokens: int = 0,
                   prefill_attention_pairs: int = 0) -> float:
        """Seconds of one step: `prefill_tokens` prefill tokens whose chunks have `prefill_attention_pairs`
        causal query-key pairs, and `num_decodes` decodes (one token each) over `decode_context_tokens` KV
        tokens in all. 0.0 for an empty step."""
        if prefill_tokens == 0 and num_decodes == 0:
            return 0.0
        compute_lin = (prefill_tokens * self._lin_flops_prefill * self._flop_s_prefill
                       + num_decodes * self._lin_flops_decode * self._flop_s_decode)
        weights = self._weight_s(prefill_tokens + num_decodes)
        linear = math.sqrt(compute_lin * compute_lin + weights * weights)
        attn_compute = (prefill_attention_pairs * self._flop_s_prefill
                        + decode_context_tokens * self._flop_s_decode) * self._attn_flops_per_pair
        kv_tokens = decode_context_tokens + prefill_attention_pairs / PREFILL_QUERY_TILE_TOKENS
        attention = max(attn_compute, kv_tokens * self._kv_s_per_token)
        if num_decodes == 0:
            return self._o_p + linear + attention
        if prefill_tokens == 0:
            return self._o_d + linear + attention
        interfering = prefill_tokens * num_decodes / (prefill_tokens + num_decodes)
        return self._o_mb + linear + attention + self._penalty * interfering


def mixed_crossover_ratio(model: RooflineStepModel, *, context_tokens: int = 16, tokens: int = 4096) -> float:
    """The decode ratio r above which a mixed step's marginal cost per token exceeds a decode-only step's ([EB] Fig. 1's
    quantity: execution time against batch tokens at fixed r, decodes at `context_tokens` of
    context). Slopes between batches of `tokens` / 2 and `tokens` tokens; bisection on r in (0, 1); 1.0 when
    mixing never costs more."""

    def slope(r: float) -> float:
        def step(n: int) -> float:
            decodes = max(1, round(n * r)) if r < 1.0 else n
            prefill = n - decodes
            return model.duration_s(prefill, decodes, decodes * context_tokens, prefill_pairs_from_scratch(prefill))
        half = tokens // 2
        return (step(tokens) - step(half)) / half

    decode = slope(1.0)
    low, high = 1e-3, 0.999
    if slope(high) <= decode:
        return 1.0
    if slope(low) > decode:
        return 0.0
    return bisect_boundary(lambda r: slope(r) <= decode, low, high)


def bisect_boundary(below: Callable[[float], bool], low: float, high: float, *, steps: int = 40) -> float:
    """Where `below` turns from True to False between `low` (below) and `high` (not below): the midpoint of the
    bracket after `steps` halvings."""
    for _ in range(steps):
        mid = 0.5 * (low + high)
        if below(mid):
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def prefill_pairs_from_scratch(prompt_tokens: int) -> int:
    """Causal query-key pairs of one prompt prefilled in one chunk from an empty cache."""
    return prompt_tokens * (prompt_tokens + 1) // 2


def kv_capacity_tokens(model: ModelArchitecture, accelerator: Accelerator, *, gpu_memory_utilization: float = 0.9,
                       reserved_bytes: float = 4e9) -> int:
    """KV-cache tokens vLLM would allocate: utilization × memory − weights − a reserve for activations, CUDA
    graphs and workspaces, over the KV bytes per token.

    Raises:
        ValueError: the weights and reserve do not fit (naming the sizes).
    """
    free = gpu_memory_utilization * accelerator.memory_bytes - model.weight_bytes - reserved_bytes
    if free <= 0:
        raise ValueError(
            f"{model.hf_id} on {accelerator.name}: {model.weight_bytes / 1e9:.1f} GB of weights and "
            f"{reserved_bytes / 1e9:.1f} GB of reserve exceed {gpu_memory_utilization:.0%} of "
            f"{accelerator.memory_bytes / 1e9:.0f} GB")
    return int(free // model.kv_bytes_per_token)
