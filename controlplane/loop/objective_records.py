"""Latency objectives as operators set them: what makes one valid, its δ bounds, and which one a pool is under.

An objective (`LatencyObjective`) is set like a δ override, at fleet, pool or engine scope (an engine's is
`loop.engine_objectives`'); a pool is under its pool-scope objective, else the fleet's. The loop that drives a pool
towards its objective is `loop.objective`.

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import math

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN
from controlplane.loop.outcomes import objective_targets
from controlplane.protocol import pool_key_of_message

MIN_QUANTILE, MAX_QUANTILE = 0.5, 0.9999
MAX_TARGET_S = 3600.0


def delta_bounds(objective: operator_pb2.LatencyObjective) -> tuple[float, float]:
    """(lowest, highest) δ the loop may set, s/token (both 0 in the message: the whole ±limit)."""
    if objective.delta_min_s_per_token == 0.0 and objective.delta_max_s_per_token == 0.0:
        return -DELTA_LIMIT_S_PER_TOKEN, DELTA_LIMIT_S_PER_TOKEN
    return objective.delta_min_s_per_token, objective.delta_max_s_per_token


def objective_problem(objective: operator_pb2.LatencyObjective) -> str | None:
    """What makes an objective invalid, in words; None when it is valid."""
    targets = 0
    for name, quantile, target in objective_targets(objective, named_only=False):
        if quantile == 0.0 and target == 0.0:
            continue
        targets += 1
        if not MIN_QUANTILE <= quantile <= MAX_QUANTILE:
            return f"{name}_quantile must be in [{MIN_QUANTILE}, {MAX_QUANTILE}], got {quantile}"
        if not (math.isfinite(target) and 0.0 < target <= MAX_TARGET_S):
            return f"{name}_target_s must be in (0, {MAX_TARGET_S:.0f}] seconds, got {target}"
    if not targets:
        return "an objective needs a TTFT or a TPOT target (quantile and target_s)"
    low, high = delta_bounds(objective)
    if not (math.isfinite(low) and math.isfinite(high) and -DELTA_LIMIT_S_PER_TOKEN <= low <= 0.0 <= high
            <= DELTA_LIMIT_S_PER_TOKEN):
        return (f"delta bounds must satisfy -{DELTA_LIMIT_S_PER_TOKEN} <= delta_min_s_per_token <= 0 <= "
                f"delta_max_s_per_token <= {DELTA_LIMIT_S_PER_TOKEN}, got [{low}, {high}]")
    budget_min, budget_max = objective.budget_min_tokens, objective.budget_max_tokens
    if budget_max and budget_min > budget_max:
        return f"budget_min_tokens {budget_min} exceeds budget_max_tokens {budget_max}"
    return None


def objective_for(records: list[operator_pb2.OverrideRecord], pool_key: str, *,
                  now_s: float) -> operator_pb2.OverrideRecord | None:
    """The objective record in force for a pool: its pool-scope one, else the fleet's; None when neither."""
    best = None
    for record in records:
        if record.kind != operator_pb2.OVERRIDE_KIND_OBJECTIVE or record.cleared:
            continue
        if record.expires_at_s > 0 and record.expires_at_s <= now_s:
            continue
        kind = record.scope.kind
        if (kind == operator_pb2.SCOPE_KIND_POOL
                and pool_key_of_message(record.scope.pool) == pool_key):
            return record
        if kind == operator_pb2.SCOPE_KIND_FLEET:
            best = record
    return best
