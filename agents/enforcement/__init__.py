"""Engine-agnostic enforcement of controller decisions, evaluated every engine step.

PURE: no I/O, no clock reads (time is passed in), no grpc/vllm/asyncio/threading imports, no allocation
proportional to the batch. Imports nothing of controlplane but the generated `controlplane.api`.

- `policy`   EnforcedPolicy, policy_from_decision (validation, budgets only lowered, budget floor), stock_policy
- `budget`   the P-PAS(+) per-step token budget rule
- `phase`    the EB phase machine (decode-only / prefill-only steps, threshold k, cap N, KV gate)
- `plan`     StepPlan / StepKind: the per-step instruction for the engine adapter
- `enforcer` Enforcer: versions and TTL of decisions; per-step dispatch MB / EB / stock
"""

from agents.enforcement.budget import BudgetRule, step_budget_tokens, under_pressure
from agents.enforcement.enforcer import Enforcer
from agents.enforcement.phase import Phase, PhaseMachine
from agents.enforcement.plan import StepKind, StepPlan
from agents.enforcement.policy import (
    EnforcedPolicy,
    Mode,
    budget_floor_tokens,
    policy_from_decision,
    reject_reason,
    stock_policy,
)

__all__ = [
    "BudgetRule",
    "EnforcedPolicy",
    "Enforcer",
    "Mode",
    "Phase",
    "PhaseMachine",
    "StepKind",
    "StepPlan",
    "budget_floor_tokens",
    "policy_from_decision",
    "reject_reason",
    "step_budget_tokens",
    "stock_policy",
    "under_pressure",
]
