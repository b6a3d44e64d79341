"""The scheduling parameters a fake engine runs under, and how a controller Decision becomes them.

Pure: converts and validates protobuf Decisions at the edge of the fake engine; no I/O, no clock.
Validation is the agent's own (`agents.enforcement.policy`); this module only describes what is in force.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.api.v1 import common_pb2
from controlplane.core.types import BudgetPolicy
from controlplane.fleet.profiles import EngineShape
from controlplane.protocol import MODE_FROM_PROTO, Mode


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The scheduling parameters in force: mode, EB threshold k and admission cap n (requests), the
    P-PAS budget policy (tokens) and the decision version (0: the stock start-up state, PASSTHROUGH)."""

    mode: Mode
    k: int
    n: int
    budget: BudgetPolicy
    version: int = 0

    @classmethod
    def stock(cls, shape: EngineShape) -> EngineSettings:
        """Stock vLLM: all slots, the start-up token budget, no cap."""
        budget = BudgetPolicy(b_max_tokens=shape.max_num_batched_tokens, b_cap_tokens=shape.max_num_batched_tokens)
        return cls(mode=Mode.PASSTHROUGH, k=1, n=shape.max_num_seqs, budget=budget, version=0)


def settings_from_decision(decision: common_pb2.Decision, *, shape: EngineShape) -> EngineSettings:
    """The settings an accepted decision (the Enforcer applied it) puts in force on an engine of `shape`.

    Budgets are clamped to the start-up budget (vLLM can only lower it); b_max_tokens = 0 means the
    start-up budget and b_cap_tokens = 0 means no cap (= B_max). PASSTHROUGH gives the stock settings
    with the decision's version.

    Raises:
        ValueError: the decision's mode is unspecified (the Enforcer refuses such a decision first).
    """
    mode = MODE_FROM_PROTO.get(decision.mode)
    if mode is None:
        raise ValueError(f"decision {decision.version} has no mode")
    stock = EngineSettings.stock(shape)
    if mode is Mode.PASSTHROUGH:
        return EngineSettings(mode=stock.mode, k=stock.k, n=stock.n, budget=stock.budget, version=decision.version)
    limit = shape.max_num_batched_tokens
    b_max = min(decision.budget.b_max_tokens or limit, limit)
    b_cap = min(decision.budget.b_cap_tokens or b_max, b_max)
    budget = BudgetPolicy(
        b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=decision.budget.n_th,
        t_large_tokens=decision.budget.t_large_tokens, n_d_large=decision.budget.n_d_large,
    )
    return EngineSettings(mode=mode, k=decision.k, n=decision.n, budget=budget, version=decision.version)
