"""Memory-safe batch size N̂* (EB paper Proposition 3.3) and the threshold k̂* = ⌊θ̂*·N̂*⌋.

Pure functions, no I/O; every input gives a value in the documented range, never an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
    """Denominator of Prop. 3.3: mean KV tokens one slot holds, μ_L + (1−θ)/(θ·p0)·ln(1/(1−θ))."""
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
    reserve_tokens = math.log(1.0 / oom_tolerance) / p0 / p0 / mu_l_tokens
    per_slot_tokens = tokens_per_slot(theta=theta, p0=p0, mu_l_tokens=mu_l_tokens)
    value = (kv_capacity_tokens - reserve_tokens) / per_slot_tokens
    if value < 1.0:  # includes −inf: the OOM reserve alone exceeds any capacity
        return BatchSize(n=1, n_unclipped=value, below_one_request=True, capped=False)
    if not math.isfinite(value):
        return BatchSize(n=cap, n_unclipped=0.0, below_one_request=False, capped=False)
    n = math.floor(value)
    return BatchSize(n=min(n, cap), n_unclipped=value, below_one_request=False, capped=n > cap)


def threshold_k(*, theta: float, n: int) -> int:
    """k̂* = ⌊θ·N⌋, clamped to [1, N] (N ≥ 1 assumed; NaN θ gives 1)."""
    n = max(1, int(n))
    if not math.isfinite(theta):
        return 1
    return min(n, max(1, math.floor(theta * n)))
