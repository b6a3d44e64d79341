"""Memory-safe batch size N̂* ([EB] Prop. 3.3) and the threshold k̂* = ⌊θ̂*·N̂*⌋.

Pure functions, no I/O; every input gives a value in the documented range, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist


@dataclass(frozen=True, slots=True)
class BatchSize:
    """Result of the batch-size formula.

    n: N̂* in [1, max_num_seqs]. n_unclipped: the formula's value before the cap (may be ≤ 0 or huge;
    0 when it could not be evaluated). below_one_request: the KV capacity cannot hold one average
    request with the OOM tolerance. capped: n was cut to max_num_seqs.
    """

    n: int
    n_unclipped: float
    below_one_request: bool
    capped: bool


def tokens_per_slot(*, theta: float, p0: float, mu_l_tokens: float) -> float:
    """Denominator of [EB] Prop. 3.3: mean KV tokens one slot holds, μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ))."""
    zeta = -math.log1p(-theta)
    return mu_l_tokens + (1.0 - theta) * zeta / theta / p0


def memory_safe_batch_size(
    *,
    theta: float,
    p0: float,
    mu_l_tokens: float,
    kv_capacity_tokens: float,
    oom_tolerance: float,
    max_num_seqs: int,
) -> BatchSize:
    """N* = ⌊(C − ln(1/ε)/(p0²·μ_L)) / (μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ)))⌋, capped to [1, max_num_seqs].

    Args:
        theta: θ in (0, 1) (the clipped θ̂*). p0: hazard intercept, per token. mu_l_tokens: mean prompt
        length. kv_capacity_tokens: C, KV-cache blocks × block size. oom_tolerance: ε in (0, 1), the
        tolerated probability of exceeding C. max_num_seqs: the engine's slot count (≥ 1 assumed; a
        smaller value is treated as 1).
    Returns:
        BatchSize. Fallbacks: any input not finite or out of its domain (θ ∉ (0, 1), p0 ≤ 0, μ_L ≤ 0,
        ε ∉ (0, 1)) → n = max_num_seqs (stock behaviour, nothing is known to be unsafe); a numerator
        below one slot's tokens → n = 1 with below_one_request set.
    """
    cap = max(1, int(max_num_seqs))
    inputs = (theta, p0, mu_l_tokens, kv_capacity_tokens, oom_tolerance)
    if not all(math.isfinite(x) for x in inputs) or not (
        0.0 < theta < 1.0 and p0 > 0.0 and mu_l_tokens > 0.0 and 0.0 < oom_tolerance < 1.0
    ):
        return BatchSize(n=cap, n_unclipped=0.0, below_one_request=False, capped=False)
    # Divide step by step: p0²·μ_L and θ·p0 can underflow to 0 for tiny finite inputs (the result overflows
    # to inf instead of raising).
    reserve = reserve_tokens(p0=p0, mu_l_tokens=mu_l_tokens, oom_tolerance=oom_tolerance)
    per_slot_tokens = tokens_per_slot(theta=theta, p0=p0, mu_l_tokens=mu_l_tokens)
    value = (kv_capacity_tokens - reserve) / per_slot_tokens
    if value < 1.0:  # includes −inf: the OOM reserve alone exceeds any capacity
        return BatchSize(n=1, n_unclipped=value, below_one_request=True, capped=False)
    if not math.isfinite(value):
        return BatchSize(n=cap, n_unclipped=0.0, below_one_request=False, capped=False)
    n = math.floor(value)
    return BatchSize(n=min(n, cap), n_unclipped=value, below_one_request=False, capped=n > cap)


def reserve_tokens(*, p0: float, mu_l_tokens: float, oom_tolerance: float) -> float:
    """[EB] Prop. 3.3's OOM reserve ln(1/ε)/(p0²·μ_L), tokens (inf when p0²·μ_L underflows; inputs assumed in
    their domains)."""
    return math.log(1.0 / oom_tolerance) / p0 / p0 / mu_l_tokens


def _normal_quantile(probability: float) -> float:
    return NormalDist().inv_cdf(probability)


def occupancy_batch_size(
    *,
    mu_l_tokens: float,
    mu_o_tokens: float,
    sigma_o_tokens: float,
    kv_capacity_tokens: float,
    oom_tolerance: float,
    max_num_seqs: int,
) -> BatchSize:
    """The largest N whose slots' KV stays within C with probability ≥ 1 − ε, from the length moments alone.

    A slot refilled as its request finishes holds a prompt and the age of an output drawn length-biased:
    mean m = μ_L + E[O²]/(2·μ_O). Its spread is taken as s = E[O²]/(2·μ_O), the age's mean: an age's
    standard deviation is at most its mean for outputs of increasing hazard (their age law has increasing
    hazard too, hence a coefficient of variation ≤ 1), so the bound is conservative exactly where [EB] Prop. 3.3
    is not usable. The sum of N independent slots, taken as normal: N·m + z_{1−ε}·√N·s ≤ C, solved for √N.
    σ_O ≤ 0 (unknown) is taken as σ_O = μ_O (geometric).

    Returns:
        BatchSize; fallbacks as `memory_safe_batch_size` (inputs out of domain → max_num_seqs; fewer than one
        slot → 1 with below_one_request).
    """
    cap = max(1, int(max_num_seqs))
    inputs = (mu_l_tokens, mu_o_tokens, sigma_o_tokens, kv_capacity_tokens, oom_tolerance)
    if not all(math.isfinite(x) for x in inputs) or not (
        mu_l_tokens >= 0.0 and mu_o_tokens > 0.0 and 0.0 < oom_tolerance < 1.0
    ):
        return BatchSize(n=cap, n_unclipped=0.0, below_one_request=False, capped=False)
    sigma = sigma_o_tokens if sigma_o_tokens > 0.0 else mu_o_tokens
    age_tokens = 0.5 * mu_o_tokens + 0.5 * sigma * (sigma / mu_o_tokens)  # E[O²]/(2μ_O), no underflow
    mean_tokens = mu_l_tokens + age_tokens
    spread = -_normal_quantile(oom_tolerance) * age_tokens  # z_{1−ε}·s (−z_ε: exact for tiny ε)
    # √N = (−spread + √(spread² + 4·m·C)) / (2m), written as 2C / (spread + √(spread² + 4·m·C)): no
    # cancellation when spread² ≫ m·C, and an overflow (lengths near the float range) gives 0, not NaN.
    denominator = spread + math.sqrt(spread * spread + 4.0 * mean_tokens * max(0.0, kv_capacity_tokens))
    root = 2.0 * max(0.0, kv_capacity_tokens) / denominator if denominator > 0.0 else 0.0
    value = root * root
    if not value >= 1.0:  # includes NaN (inf / inf)
        return BatchSize(n=1, n_unclipped=value if math.isfinite(value) else 0.0, below_one_request=True,
                         capped=False)
    if not math.isfinite(value):  # C near the float range over a slot of almost nothing
        return BatchSize(n=cap, n_unclipped=0.0, below_one_request=False, capped=True)
    n = math.floor(value)
    return BatchSize(n=min(n, cap), n_unclipped=value, below_one_request=False, capped=n > cap)


def threshold_k(*, theta: float, n: int) -> int:
    """k̂* = ⌊θ·N⌋, clamped to [1, N] (N ≥ 1 assumed; NaN θ gives 1)."""
    n = max(1, int(n))
    if not math.isfinite(theta):
        return 1
    return min(n, max(1, math.floor(theta * n)))
