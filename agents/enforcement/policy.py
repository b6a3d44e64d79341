"""The decision an engine enforces (`EnforcedPolicy`) and its conversion from a controller `Decision`.

Responsibility: validate a `controlplane.v1.Decision` against the engine's start-up limits and turn it into
plain values the per-step code reads. Protobuf stops here: nothing below this module sees a message.

Rules (budgets are only ever LOWERED: vLLM ignores a budget above its start-up value):
- b_max_tokens = 0 means the start-up budget; b_cap_tokens = 0 means no cap (= b_max). Both are clamped to
  the start-up budget (`max_num_batched_tokens`, or the start-up `max_num_scheduled_tokens` when smaller);
  b_cap is then clamped to b_max.
- Budget floor: after that resolution, b_max and b_cap must be ≥ `budget_floor_tokens(start-up budget)`
  = min(start-up budget, 256) (`controlplane.protocol.min_budget_tokens`, the one definition the controller
  also keeps to), else the decision is refused (`budget_below_floor`). Why: below a few hundred tokens the
  fixed per-step cost dominates (a 1-token budget ran the CPU engine at 300 steps/s of one token each), and
  256 tokens keep a prefill chunk a useful size; the start-up budget bounds the floor so that an engine
  started with a small budget can still take decisions. (A budget below N also stalls the running requests
  at the tail of the queue within a step; N is the controller's to weigh, not a validity condition.)
- Admission cap: N is validated against the engine's slots (`max_num_seqs`, else
  `n_greater_than_max_num_seqs`) and then the cap in force is min(N, the engine's own start-up admission cap
  `max_num_active_reqs`, i.e. `--max-num-active-seqs`); k is lowered to that cap when above it. A decision
  never raises the engine's own admission cap.
- PASSTHROUGH decisions are not checked for k, n or the budget (they are ignored: stock behaviour).
- An advisory decision is validated like any other and yields a policy flagged `advisory`: the engine keeps
  stock behaviour and only reports what the policy would do.
- Reject reasons are string codes (they travel in DecisionAck.reject_reason): mode_unspecified, mode_unknown,
  n_zero, n_greater_than_max_num_seqs, k_zero, k_greater_than_n, b_cap_greater_than_b_max, ttl_invalid,
  budget_below_floor. Versions are checked by the `Enforcer`, which knows the version it holds
  (stale_version).

Pure: no I/O, no clock. Built once per decision, never on the per-step path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from agents.enforcement.budget import BudgetRule
from controlplane.api.v1 import common_pb2
from controlplane.protocol import MODE_FROM_PROTO, Mode, min_budget_tokens


@dataclass(frozen=True, slots=True)
class EnforcedPolicy:
    """A validated decision, in engine terms. Frozen; slot reads only on the per-step path.

    Attributes:
        mode: MB, EB or PASSTHROUGH.
        k: EB phase-switch threshold, requests (1 ≤ k ≤ n).
        n: admission cap N, requests (1 ≤ n ≤ max_num_seqs); max_num_seqs for PASSTHROUGH.
        budget: the P-PAS(+) rule; b_cap ≤ b_max ≤ start-up budget. Both equal the start-up budget for
            PASSTHROUGH.
        advisory: report what this policy would do, apply stock behaviour.
        version: the decision's version (0: the stock start-up state, no decision).
        ttl_s: how long the policy is held without hearing from the controller, seconds (inf for the stock
            start-up policy, which never expires).
    """

    mode: Mode
    k: int
    n: int
    budget: BudgetRule
    advisory: bool = False
    version: int = 0
    ttl_s: float = math.inf

    @property
    def is_stock(self) -> bool:
        """True when the engine runs stock vLLM behaviour under this policy (PASSTHROUGH or advisory)."""
        return self.advisory or self.mode is Mode.PASSTHROUGH


def stock_policy(*, max_num_seqs: int, max_num_batched_tokens: int, version: int = 0,
                 ttl_s: float = math.inf) -> EnforcedPolicy:
    """Stock vLLM: PASSTHROUGH, all slots, the start-up budget (no P-PAS cap).

    Args:
        max_num_seqs: the engine's slots, requests (≥ 1).
        max_num_batched_tokens: the engine's start-up token budget, tokens (≥ 1).
        version: 0 for the start-up state; a PASSTHROUGH decision's version otherwise.
        ttl_s: seconds the policy is held (inf: never expires).

    Raises:
        ValueError: a limit below 1.
    """
    _check_limits(max_num_seqs, max_num_batched_tokens)
    budget = BudgetRule(b_max_tokens=max_num_batched_tokens, b_cap_tokens=max_num_batched_tokens, n_th=0,
                        t_large_tokens=0, n_d_large=0)
    return EnforcedPolicy(mode=Mode.PASSTHROUGH, k=1, n=max_num_seqs, budget=budget, advisory=False,
                          version=version, ttl_s=ttl_s)


def budget_floor_tokens(*, max_num_batched_tokens: int) -> int:
    """The smallest b_max/b_cap an engine with this start-up budget accepts, tokens: min(start-up, 256)."""
    return min_budget_tokens(max_num_batched_tokens)


def reject_reason(decision: common_pb2.Decision, *, max_num_seqs: int,
                  max_num_batched_tokens: int | None = None) -> str:
    """Why `decision` cannot be held by an engine with `max_num_seqs` slots; "" when it can.

    Checked in this order: mode, ttl, then (not for PASSTHROUGH) n, k, the budget ordering and, when
    `max_num_batched_tokens` is given, the budget floor (see the module docstring). Advisory decisions are
    checked like the others. Versions are not checked here (see `Enforcer.apply`).
    """
    mode = MODE_FROM_PROTO.get(decision.mode)
    if mode is None:
        return "mode_unspecified" if decision.mode == common_pb2.MODE_UNSPECIFIED else "mode_unknown"
    if not (math.isfinite(decision.ttl_s) and decision.ttl_s > 0.0):
        return "ttl_invalid"
    if mode is Mode.PASSTHROUGH:
        return ""
    if decision.n == 0:
        return "n_zero"
    if decision.n > max_num_seqs:
        return "n_greater_than_max_num_seqs"
    if decision.k == 0:
        return "k_zero"
    if decision.k > decision.n:
        return "k_greater_than_n"
    budget = decision.budget
    if budget.b_max_tokens and budget.b_cap_tokens > budget.b_max_tokens:
        return "b_cap_greater_than_b_max"
    if max_num_batched_tokens is not None:
        _, b_cap = _resolved_budgets(budget, max_num_batched_tokens)
        if b_cap < budget_floor_tokens(max_num_batched_tokens=max_num_batched_tokens):
            return "budget_below_floor"
    return ""


def policy_from_decision(decision: common_pb2.Decision, *, max_num_seqs: int, max_num_batched_tokens: int,
                         max_num_active_reqs: int | None = None) -> tuple[EnforcedPolicy | None, str]:
    """Validate `decision` and convert it into the policy an engine with these start-up limits enforces.

    Args:
        decision: the controller's decision.
        max_num_seqs: the engine's slots (start-up `max_num_seqs`), requests.
        max_num_batched_tokens: the engine's start-up token budget, tokens (pass the start-up
            `max_num_scheduled_tokens` when it is smaller, e.g. with speculative decoding).
        max_num_active_reqs: the engine's own start-up admission cap (`--max-num-active-seqs`), requests;
            None: max_num_seqs. The policy's N is min(decision.n, this), its k at most that N.

    Returns:
        (policy, "") or (None, reject_reason) with a code from `reject_reason`. Never raises for any decision.

    Raises:
        ValueError: a limit below 1 (a programming error of the caller, not a bad decision).
    """
    _check_limits(max_num_seqs, max_num_batched_tokens)
    active_cap = max_num_seqs if max_num_active_reqs is None else min(max_num_active_reqs, max_num_seqs)
    if active_cap < 1:
        raise ValueError(f"max_num_active_reqs must be ≥ 1, got {max_num_active_reqs}")
    reason = reject_reason(decision, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)
    if reason:
        return None, reason
    mode = MODE_FROM_PROTO[decision.mode]
    if mode is Mode.PASSTHROUGH:
        stock = stock_policy(max_num_seqs=active_cap, max_num_batched_tokens=max_num_batched_tokens,
                             version=decision.version, ttl_s=decision.ttl_s)
        return (replace(stock, advisory=True) if decision.advisory else stock), ""
    budget = decision.budget
    b_max, b_cap = _resolved_budgets(budget, max_num_batched_tokens)
    rule = BudgetRule(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=budget.n_th,
                      t_large_tokens=budget.t_large_tokens, n_d_large=budget.n_d_large)
    n = min(decision.n, active_cap)
    policy = EnforcedPolicy(mode=mode, k=min(decision.k, n), n=n, budget=rule, advisory=decision.advisory,
                            version=decision.version, ttl_s=decision.ttl_s)
    return policy, ""


def _resolved_budgets(budget: common_pb2.BudgetPolicy, max_num_batched_tokens: int) -> tuple[int, int]:
    """(b_max, b_cap) after the 0 defaults and the clamp to the start-up budget (b_cap ≤ b_max)."""
    b_max = min(budget.b_max_tokens or max_num_batched_tokens, max_num_batched_tokens)
    return b_max, min(budget.b_cap_tokens or b_max, b_max)


def _check_limits(max_num_seqs: int, max_num_batched_tokens: int) -> None:
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be ≥ 1, got {max_num_seqs}")
    if max_num_batched_tokens < 1:
        raise ValueError(f"max_num_batched_tokens must be ≥ 1, got {max_num_batched_tokens}")
