"""The `Enforcer`: holds the decision in force and turns it into one `StepPlan` per engine step.

Responsibility: version and TTL bookkeeping of the controller's decisions (fail-static, then fail-safe), and
the per-step dispatch: MB → stock scheduling under the P-PAS(+) budget and the cap N; EB → the phase machine;
PASSTHROUGH, advisory decisions and expired decisions → stock vLLM (start-up budget, N = the engine's own
start-up admission cap: `max_num_active_reqs`, which is max_num_seqs unless `--max-num-active-seqs` lowered it).
A decision's N is capped by that start-up admission cap too: the agent never admits more than stock would.
It must not read a clock (time is passed in), do I/O, import grpc/vllm/asyncio/threading, or allocate
anything proportional to the batch.

Decisions and time:
- `apply(decision, now_s)` validates the decision (`policy_from_decision`) and holds it until
  now_s + ttl_s. Versions below the highest one held are rejected (`stale_version`). A decision with the held
  version only extends the TTL (the controller's keep-alive re-send), unless the held decision already
  expired: then the controller is back and the decision is applied again. An expired decision keeps its
  version as the floor, so a late, older decision cannot come back.
- `touch(now_s)` extends the held decision's TTL whenever the link hears from the controller.
- `expire(now_s)` falls back to stock behaviour once the TTL passed without a refresh.
- A held decision takes effect at the next step boundary: `plan_step` installs it before planning, so a
  step is always planned under one policy.

Threads: the simplest use is one thread for everything (the scheduler's). `apply`, `touch` and `expire` may
instead run on another thread (the link's) than `plan_step`, `observe_step` and the `active_*`/`last_plan`/
`would_plan` reads: the two sides share one attribute (the held policy), replaced whole by one side and read
once per step by the other; a reference store is atomic in CPython, so no lock is needed. Keep `apply`,
`touch` and `expire` on one thread: if `expire` raced with `apply`, the newer decision could be replaced by
stock until the controller's next keep-alive re-applies it.

Mode switches never strand a request: MB and stock steps continue every running request; entering EB resets
the phase machine, whose first step continues any partial prefill; an EB → EB change keeps the phase.
"""

from __future__ import annotations

import math

from agents.enforcement.budget import under_pressure
from agents.enforcement.phase import Phase, PhaseMachine
from agents.enforcement.plan import StepKind, StepPlan
from agents.enforcement.policy import EnforcedPolicy, Mode, policy_from_decision, stock_policy
from controlplane.api.v1 import common_pb2

_STOCK = StepKind.STOCK
_EB = Mode.EB
_MB = Mode.MB
_PASSTHROUGH = Mode.PASSTHROUGH

# How plan_step dispatches (small ints: one comparison chain per step).
_DISPATCH_STOCK = 0     # PASSTHROUGH (advisory or not), no decision, expired decision
_DISPATCH_MB = 1
_DISPATCH_EB = 2
_DISPATCH_ADVISORY = 3  # advisory MB/EB: stock applied, the policy's plan computed as would_plan


class Enforcer:
    """The decision in force on one engine, and its per-step plans (see the module docstring)."""

    __slots__ = ("_active", "_dispatch", "_expires_at_s", "_held", "_last_plan", "_machine",
                 "_max_num_active_reqs", "_max_num_batched_tokens", "_max_num_seqs", "_mb_cap_plan", "_mb_max_plan",
                 "_stock", "_stock_plan", "_version_floor", "_would_plan")

    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int,
                 max_num_active_reqs: int | None = None) -> None:
        """
        Args:
            max_num_seqs: the engine's start-up slots, requests.
            max_num_batched_tokens: the engine's start-up token budget, tokens (the start-up
                `max_num_scheduled_tokens` when smaller). Budgets are only ever lowered below it.
            max_num_active_reqs: the engine's own start-up admission cap (vLLM's `max_num_active_reqs`,
                set by `--max-num-active-seqs`), requests; None: max_num_seqs. Stock plans admit up to it and
                no decision raises it.

        Raises:
            ValueError: a limit below 1.
        """
        active_cap = max_num_seqs if max_num_active_reqs is None else min(max_num_active_reqs, max_num_seqs)
        if active_cap < 1:
            raise ValueError(f"max_num_active_reqs must be ≥ 1, got {max_num_active_reqs}")
        self._stock = stock_policy(max_num_seqs=active_cap, max_num_batched_tokens=max_num_batched_tokens)
        self._max_num_seqs = max_num_seqs
        self._max_num_active_reqs = active_cap
        self._max_num_batched_tokens = max_num_batched_tokens
        self._stock_plan = StepPlan(_STOCK, max_num_batched_tokens, active_cap, active_cap, active_cap)
        self._held = self._stock
        self._version_floor = 0
        self._expires_at_s = math.inf
        self._active = self._stock
        self._dispatch = _DISPATCH_STOCK
        self._machine: PhaseMachine | None = None
        self._mb_max_plan = self._mb_cap_plan = self._stock_plan
        self._last_plan: StepPlan | None = None
        self._would_plan: StepPlan | None = None

    @property
    def max_num_seqs(self) -> int:
        return self._max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self._max_num_batched_tokens

    @property
    def max_num_active_reqs(self) -> int:
        """The engine's own start-up admission cap, requests (≤ max_num_seqs): no plan admits beyond it."""
        return self._max_num_active_reqs

    # ------------------------------------------------------------------------------------ link side

    @property
    def policy(self) -> EnforcedPolicy:
        """The policy held now, in force from the next step boundary (the stock policy when none or expired)."""
        return self._held

    @property
    def expires_at_s(self) -> float:
        """When the held decision expires without a refresh, on the caller's clock, seconds (inf: stock)."""
        return self._expires_at_s

    @property
    def version_floor(self) -> int:
        """The highest decision version held so far; lower versions are rejected as stale (0: none yet)."""
        return self._version_floor

    def apply(self, decision: common_pb2.Decision, *, now_s: float) -> tuple[bool, str]:
        """Hold `decision` from the next step boundary, or refuse it.

        Args:
            decision: the controller's decision.
            now_s: the caller's clock, seconds (the same clock as `touch` and `expire`).

        Returns:
            (True, "") when held: a new version, or the held version again, which only extends the TTL (its
            content is not re-read), or the version of an expired decision, which is applied again.
            (False, reason) otherwise: `stale_version` (below the highest version held) or a code of
            `policy_from_decision`. A refused decision changes nothing. An advisory decision is held like any
            other: the engine runs stock behaviour and reports `would_plan`.
        """
        version = decision.version
        held = self._held
        if version < self._version_floor:
            return False, "stale_version"
        if version == self._version_floor and held is not self._stock:
            self._expires_at_s = now_s + held.ttl_s
            return True, ""
        policy, reason = policy_from_decision(decision, max_num_seqs=self._max_num_seqs,
                                              max_num_batched_tokens=self._max_num_batched_tokens,
                                              max_num_active_reqs=self._max_num_active_reqs)
        if policy is None:
            return False, reason
        self._version_floor = version
        self._expires_at_s = now_s + policy.ttl_s
        self._held = policy
        return True, ""

    def touch(self, now_s: float) -> None:
        """The controller was heard from at `now_s`: the held decision lives ttl_s from now (no-op for stock)."""
        held = self._held
        if held is not self._stock:
            self._expires_at_s = now_s + held.ttl_s

    def expire(self, now_s: float) -> bool:
        """Fall back to stock behaviour when the held decision's TTL has passed at `now_s` (now_s ≥ expiry).

        Returns:
            True when this call dropped a decision (the caller logs and counts it), else False.
        """
        if self._held is self._stock or now_s < self._expires_at_s:
            return False
        self._held = self._stock
        self._expires_at_s = math.inf
        return True

    # ------------------------------------------------------------------------------- scheduler side

    @property
    def active_policy(self) -> EnforcedPolicy:
        """The policy the last planned step ran under."""
        return self._active

    @property
    def phase(self) -> Phase | None:
        """The EB phase (also under an advisory EB decision); None when no EB policy is active."""
        machine = self._machine
        if machine is None or self._active.mode is not _EB:
            return None
        return machine.phase

    @property
    def last_plan(self) -> StepPlan | None:
        """The plan returned by the last `plan_step` (None before the first)."""
        return self._last_plan

    @property
    def steers(self) -> bool:
        """Whether the last planned step applies a decision's knobs. False before the first step and for the
        stock plan (no decision held, an expired, PASSTHROUGH or advisory one): the engine's knobs are then
        its own, whatever their values, and the adapter leaves them alone."""
        plan = self._last_plan
        return plan is not None and plan is not self._stock_plan

    @property
    def would_plan(self) -> StepPlan | None:
        """What the active policy would have planned for the last step: under an advisory decision the plan
        it would apply (the engine ran stock), otherwise the applied plan itself. None before the first step."""
        if self._dispatch == _DISPATCH_ADVISORY:
            return self._would_plan
        return self._last_plan

    def plan_step(self, *, num_running: int, num_running_prefills: int, num_running_decodes: int, num_waiting: int,
                  free_kv_tokens: int, kv_tokens_per_new_request: int,
                  largest_remaining_prefill_tokens: int = 0) -> StepPlan:
        """The plan for the next engine step; call once per step, before the engine schedules.

        Installs a newly held policy first (step boundary). O(1); allocates at most one `StepPlan`.

        Args:
            num_running: requests in the running queue (slots in use).
            num_running_prefills: running requests still prefilling (partial prefills).
            num_running_decodes: running requests past their prompt, which would decode this step.
            num_waiting: requests in the waiting queue (including preempted ones).
            free_kv_tokens: free KV cache, tokens (free blocks × block size). EB only.
            kv_tokens_per_new_request: KV headroom one new request needs, tokens; 0 turns the EB KV gate off.
            largest_remaining_prefill_tokens: R_p of P-PAS+: the largest remaining prefill among the running
                prefills (and, when the adapter sees it cheaply, the waiting requests the cap lets in this
                step), tokens. MB only; 0 when unknown (P-PAS+ then never triggers).

        Returns:
            STOCK for MB, PASSTHROUGH, advisory and expired decisions; DECODE_ONLY or PREFILL_ONLY for EB.
            Never raises.
        """
        held = self._held
        if held is not self._active:
            self._install(held)
        dispatch = self._dispatch
        if dispatch == _DISPATCH_STOCK:
            plan = self._stock_plan
        elif dispatch == _DISPATCH_EB:
            plan = self._machine.plan_step(  # type: ignore[union-attr]
                num_running=num_running, num_running_prefills=num_running_prefills,
                num_running_decodes=num_running_decodes, num_waiting=num_waiting, free_kv_tokens=free_kv_tokens,
                kv_tokens_per_new_request=kv_tokens_per_new_request)
        elif dispatch == _DISPATCH_MB:
            plan = self._plan_mb(num_running, num_running_prefills, num_running_decodes, num_waiting,
                                 largest_remaining_prefill_tokens)
        else:
            plan = self._stock_plan
            if self._active.mode is _EB:
                self._would_plan = self._machine.plan_step(  # type: ignore[union-attr]
                    num_running=num_running, num_running_prefills=num_running_prefills,
                    num_running_decodes=num_running_decodes, num_waiting=num_waiting,
                    free_kv_tokens=free_kv_tokens, kv_tokens_per_new_request=kv_tokens_per_new_request)
            else:
                self._would_plan = self._plan_mb(num_running, num_running_prefills, num_running_decodes,
                                                 num_waiting, largest_remaining_prefill_tokens)
        self._last_plan = plan
        return plan

    def observe_step(self, *, num_scheduled_tokens: int) -> None:
        """Report the total tokens the engine scheduled in the step just planned (see
        `PhaseMachine.observe_step`: guards against repeated empty prefill-only steps). Optional, cheap."""
        if self._dispatch == _DISPATCH_EB:
            self._machine.observe_step(num_scheduled_tokens=num_scheduled_tokens)  # type: ignore[union-attr]

    # ------------------------------------------------------------------------------------- internals

    def _plan_mb(self, num_running: int, num_running_prefills: int, num_running_decodes: int, num_waiting: int,
                 largest_remaining_prefill_tokens: int) -> StepPlan:
        """Stock scheduling under the cap N and the P-PAS(+) budget.

        N_p = running prefills + the waiting requests the cap lets in this step (min(waiting, N − running)):
        under chunked prefill at most one running request is mid-prefill at a step boundary, so running
        prefills alone would almost never reach N_th ≥ 2; P-PAS counts the prefills competing for the step's
        budget. The synthetic fleet's engine (controlplane/fleet/engine.py) counts the same way.
        """
        admissible = self._active.n - num_running
        if num_waiting < admissible:
            admissible = num_waiting
        if admissible < 0:
            admissible = 0
        if under_pressure(self._active.budget, num_running_prefills + admissible, num_running_decodes,
                          largest_remaining_prefill_tokens):
            return self._mb_cap_plan
        return self._mb_max_plan

    def _install(self, policy: EnforcedPolicy) -> None:
        """Put `policy` in force at this step boundary; keep the EB phase across an EB → EB change."""
        previous = self._active
        self._active = policy
        mode = policy.mode
        if mode is _PASSTHROUGH:
            self._dispatch = _DISPATCH_STOCK
            return
        n = policy.n
        if mode is _MB:
            rule = policy.budget
            self._mb_max_plan = StepPlan(_STOCK, rule.b_max_tokens, n, n, n)
            self._mb_cap_plan = StepPlan(_STOCK, rule.b_cap_tokens, n, n, n)
        else:
            prefill_budget = policy.budget.b_max_tokens
            machine = self._machine
            if (machine is not None and previous.mode is _EB and previous.advisory == policy.advisory):
                machine.configure(k=policy.k, n=n, prefill_budget_tokens=prefill_budget,
                                  decode_budget_tokens=self._max_num_batched_tokens)
            else:
                self._machine = PhaseMachine(k=policy.k, n=n, prefill_budget_tokens=prefill_budget,
                                             decode_budget_tokens=self._max_num_batched_tokens)
        self._would_plan = None
        if policy.advisory:
            self._dispatch = _DISPATCH_ADVISORY
        else:
            self._dispatch = _DISPATCH_MB if mode is _MB else _DISPATCH_EB
