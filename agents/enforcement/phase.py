"""The exclusive-batching (EB) phase machine: which kind of step the engine runs next, and what it may admit.

Responsibility: given counts the engine already has at a step boundary, decide whether the next step is
decode-only or prefill-only, its token budget and its admission limit. It must not read a clock, do I/O,
or allocate anything proportional to the batch; one call per engine step, before the engine schedules.

Model ([EB] §3.1): N slots; a decode phase runs decode-only steps while slots go idle as requests finish;
when k slots are idle the engine switches to a prefill phase that loads up to k waiting requests (chunked
within the token budget), then decodes again with the refilled batch.

State machine (evaluated by `plan_step`, top to bottom; "idle slots" = N − running):

    nothing running can progress (no decode, no partial prefill)  ──▶  PREFILL: start a refill now, the KV
        gate bypassed (at least one admission when anything waits and a slot is free); DECODE_ONLY (inert)
        when nothing can be admitted either.

    DECODE ──(partial prefill running, or refill due, and not stalled)──▶ PREFILL  [refill target set]
        refill due = waiting > 0 ∧ idle slots ≥ k ∧ KV gate (free KV fits ≥ 1 new request)
                     ∧ (last refill not KV-limited ∨ ≥ min(k, batch after it) slots freed since it)
        otherwise: DECODE_ONLY step (something decodes: guaranteed non-empty).

    PREFILL: admit = min(target − running, k, idle slots, waiting, requests that fit in free KV)
        target reached, no partial prefill, and a refill is due again (k slots still idle, e.g. while the
            batch ramps up from empty) ──▶ the next refill starts at once (new target), no decode step between
        admit > 0 or a partial prefill running ──▶ PREFILL_ONLY step (partials continue, ≤ admit admitted)
        else (refill done, or blocked by KV) ──▶ DECODE: DECODE_ONLY step (something decodes).

    refill target = running at the start of the refill + min(k, idle slots) (≤ N): a refill loads at most
    k requests (plus replacements for slots freed while it runs: a 1-token request finishing in its prefill,
    an abort, a preemption), at most k in any one step, and never lets running exceed N.

Choices and why:
- The trigger counts idle slots (N − running), the paper's definition. After a refill that filled the batch
  this equals "k slots freed since the last refill"; when the refill stopped because the waiting queue ran
  dry it lets new arrivals in without waiting for k finishes (no TTFT stall at low load); when it stopped
  because free KV ran out (KV-limited) the machine also waits for k slots to free since that refill, so it
  does not degrade to switching on every finish (EB(k=1), which the paper shows wastes α_p). Slots freed by
  preemption count as freed (the request returns to the waiting queue). Deriving this from `num_running`
  each step needs no finish events, so a missed event cannot wedge the machine.
- KV-aware gate ([EB] §3.4, [EB] App. D.6): the decode→prefill switch is deferred while free KV is below
  `kv_tokens_per_new_request` (the headroom one new request needs, chosen by the adapter, e.g. the mean or
  a high quantile of prompt + a few decode blocks); admission is min(k_left, fits in KV, idle slots), never
  all-or-nothing. `kv_tokens_per_new_request = 0` disables the gate.
- A prefill phase continues while partial prefills remain: requests that were mid-prefill when the phase or
  the mode switched are continued, never stranded. A partial prefill seen in a decode phase (after a mode
  switch) starts a prefill phase at once: it holds KV without progress.
- Never an empty step while work exists: DECODE_ONLY only when something decodes (vLLM's throttle is inert
  otherwise), PREFILL_ONLY only when a partial prefill runs or admission is possible. If the engine still
  scheduled nothing in a prefill-only step (the KV headroom was an underestimate, or waiting requests were
  not admissible), `observe_step` reports it: the machine returns to decoding and defers the next refill
  until free KV exceeds the most the failed prefill phase had, so empty steps cannot repeat while something
  decodes. The ratchet matters: a chunked prefill that cannot grow preempts itself (vLLM preempts the latest
  admitted request), its KV returns to the pool, and readmitting it at once would repeat the cycle forever
  while the decodes holding the rest of the KV stay frozen; decoding until they free more breaks it.

Pure: no I/O, no clock, no threads. Not thread-safe: one owner (the scheduler thread) calls it.
"""

from __future__ import annotations

import enum

from agents.enforcement.plan import StepKind, StepPlan


class Phase(enum.Enum):
    """The EB phase the machine is in."""

    DECODE = "decode"
    PREFILL = "prefill"


_DECODE = Phase.DECODE
_PREFILL = Phase.PREFILL
_DECODE_ONLY = StepKind.DECODE_ONLY
_PREFILL_ONLY = StepKind.PREFILL_ONLY


class PhaseMachine:
    """The EB phase machine of one engine (see the module docstring for the rules).

    Call `plan_step` once per engine step before the engine schedules, and (optionally but recommended)
    `observe_step` once after it scheduled, with what it scheduled.
    """

    __slots__ = ("_decode_budget_tokens", "_decode_plan", "_decode_switch_plan", "_k", "_last_kind", "_n", "_phase",
                 "_phase_max_free_kv_tokens", "_prefill_budget_tokens", "_refill_kv_limited", "_refill_running",
                 "_stall_free_kv_tokens", "_target_running")

    def __init__(self, *, k: int, n: int, prefill_budget_tokens: int, decode_budget_tokens: int) -> None:
        """
        Args:
            k: phase-switch threshold, requests (1 ≤ k ≤ n).
            n: admission cap N, requests (≥ 1).
            prefill_budget_tokens: token budget of prefill-only steps (B_max; no decode shares the step).
            decode_budget_tokens: token budget of decode-only steps (the engine's start-up budget, so that
                no decode is cut by a small B_cap).

        Raises:
            ValueError: k < 1, k > n, or a budget below 1.
        """
        self._k = self._n = self._prefill_budget_tokens = self._decode_budget_tokens = 0
        self.configure(k=k, n=n, prefill_budget_tokens=prefill_budget_tokens,
                       decode_budget_tokens=decode_budget_tokens)
        self.reset()

    # ----------------------------------------------------------------------------------------- set-up

    def configure(self, *, k: int, n: int, prefill_budget_tokens: int, decode_budget_tokens: int) -> None:
        """Change the parameters at a step boundary, keeping the phase (an EB → EB decision refresh).

        A refill in progress keeps going with its target lowered to the new N; the new k applies from the
        next refill. Raises ValueError as `__init__`.
        """
        if not 1 <= k <= n:
            raise ValueError(f"need 1 ≤ k ≤ n, got k={k}, n={n}")
        if prefill_budget_tokens < 1 or decode_budget_tokens < 1:
            raise ValueError(f"budgets must be ≥ 1, got prefill={prefill_budget_tokens}, "
                             f"decode={decode_budget_tokens}")
        self._k = k
        self._n = n
        self._prefill_budget_tokens = prefill_budget_tokens
        self._decode_budget_tokens = decode_budget_tokens
        # Decode-only plans do not depend on the batch: built once, returned every decode step.
        self._decode_plan = StepPlan(_DECODE_ONLY, decode_budget_tokens, n, 0, n, False)
        self._decode_switch_plan = StepPlan(_DECODE_ONLY, decode_budget_tokens, n, 0, n, True)
        if getattr(self, "_phase", None) is _PREFILL and self._target_running > n:
            self._target_running = n

    def reset(self) -> None:
        """Forget all phase state (a mode switch into EB): decode phase, no refill history, no stall."""
        self._phase = _DECODE
        self._target_running = 0
        self._refill_running = 0
        self._refill_kv_limited = False
        self._stall_free_kv_tokens = -1
        self._last_kind = None
        self._phase_max_free_kv_tokens = 0

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def k(self) -> int:
        return self._k

    @property
    def n(self) -> int:
        return self._n

    @property
    def is_stalled(self) -> bool:
        """True while a refill is deferred because the last prefill-only step scheduled nothing."""
        return self._stall_free_kv_tokens >= 0

    # -------------------------------------------------------------------------------------- per step

    def plan_step(self, *, num_running: int, num_running_prefills: int, num_running_decodes: int, num_waiting: int,
                  free_kv_tokens: int, kv_tokens_per_new_request: int) -> StepPlan:
        """The plan for the next engine step. O(1), no allocation except a PREFILL_ONLY plan.

        Args:
            num_running: requests in the running queue (slots in use).
            num_running_prefills: running requests still prefilling (partial prefills), requests.
            num_running_decodes: running requests past their prompt, which would decode this step.
            num_waiting: requests in the waiting queue (including preempted ones), requests.
            free_kv_tokens: free KV cache, tokens (free blocks × block size).
            kv_tokens_per_new_request: KV headroom one new request needs, tokens (0: no KV gate).

        Returns:
            DECODE_ONLY or PREFILL_ONLY; see `StepPlan`. Never raises.
        """
        n = self._n
        free_slots = n - num_running
        if free_slots < 0:
            free_slots = 0
        if kv_tokens_per_new_request > 0:
            kv_fit = free_kv_tokens // kv_tokens_per_new_request if free_kv_tokens > 0 else 0
        else:
            kv_fit = free_slots
        if num_running_decodes <= 0 and num_running_prefills <= 0:
            return self._plan_idle_batch(num_running, free_slots, num_waiting, kv_fit, free_kv_tokens)

        stall = self._stall_free_kv_tokens
        if stall >= 0 and free_kv_tokens > stall:
            self._stall_free_kv_tokens = stall = -1
        entered = False
        if self._phase is _DECODE:
            if num_running_decodes > 0 and (
                stall >= 0 or (num_running_prefills <= 0 and not self._refill_due(num_running, free_slots,
                                                                                  num_waiting, kv_fit))
            ):
                self._last_kind = _DECODE_ONLY
                return self._decode_plan
            self._phase = _PREFILL
            target = num_running + (self._k if self._k < free_slots else free_slots)
            self._target_running = target
            self._refill_kv_limited = False
            self._phase_max_free_kv_tokens = free_kv_tokens
            entered = True
        else:
            target = self._target_running
            if free_kv_tokens > self._phase_max_free_kv_tokens:
                self._phase_max_free_kv_tokens = free_kv_tokens

        admit = target - num_running
        if admit > self._k:  # slots freed during the refill (finish, abort, preemption) are refilled, ≤ k a step
            admit = self._k
        if admit <= 0 and num_running_prefills <= 0 and not entered and self._refill_due(
                num_running, free_slots, num_waiting, kv_fit):
            # This refill reached its target and another is already due (k slots still idle, e.g. while the
            # batch ramps up): roll over into the next refill instead of one decode step in between.
            target = num_running + (self._k if self._k < free_slots else free_slots)
            self._target_running = target
            admit = target - num_running
        if free_slots < admit:
            admit = free_slots
        if num_waiting < admit:
            admit = num_waiting
        if kv_fit < admit:
            admit = kv_fit
        if admit > 0 or num_running_prefills > 0:
            if admit < 0:
                admit = 0
            max_active = num_running + admit
            if max_active > n:
                max_active = n
            self._last_kind = _PREFILL_ONLY
            return StepPlan(_PREFILL_ONLY, self._prefill_budget_tokens, max_active, admit, n, entered)

        # The refill is over (target reached, queue empty or KV full) and no partial prefill is left:
        # something decodes (num_running_decodes > 0 here), so decode.
        self._phase = _DECODE
        self._refill_running = num_running
        self._refill_kv_limited = kv_fit <= 0 and num_waiting > 0 and free_slots > 0 and target > num_running
        self._last_kind = _DECODE_ONLY
        return self._decode_plan if entered else self._decode_switch_plan

    def observe_step(self, *, num_scheduled_tokens: int) -> None:
        """Report what the engine scheduled in the step just planned (total tokens, all requests).

        A PREFILL_ONLY step that scheduled nothing means admission was impossible (KV headroom
        underestimated, or the waiting requests were not admissible): the machine goes back to decoding and
        defers the next refill until free KV grows. Optional; without it that guard is off.
        """
        if self._last_kind is _PREFILL_ONLY and num_scheduled_tokens <= 0:
            # The most free KV this prefill phase had was not enough (typically: a partial prefill had to
            # preempt itself, its KV went back to the pool, and readmitting it would repeat the cycle while
            # the decodes holding the rest of the KV are frozen). Decode until KV exceeds that.
            free_kv = self._phase_max_free_kv_tokens
            self._stall_free_kv_tokens = free_kv if free_kv > 0 else 0
            if self._phase is _PREFILL:
                self._phase = _DECODE
                self._refill_running = 0
                self._refill_kv_limited = False
        self._last_kind = None

    # ------------------------------------------------------------------------------------- internals

    def _refill_due(self, num_running: int, free_slots: int, num_waiting: int, kv_fit: int) -> bool:
        k = self._k
        if num_waiting <= 0 or free_slots < k or kv_fit <= 0:
            return False
        if not self._refill_kv_limited:
            return True
        refill_running = self._refill_running
        return refill_running - num_running >= (k if k < refill_running else refill_running)

    def _plan_idle_batch(self, num_running: int, free_slots: int, num_waiting: int, kv_fit: int,
                         free_kv_tokens: int) -> StepPlan:
        """Nothing running can progress: refill now (KV gate bypassed: nothing else could free KV)."""
        self._stall_free_kv_tokens = -1
        k = self._k
        room = k if k < free_slots else free_slots
        admit = room
        if num_waiting < admit:
            admit = num_waiting
        if kv_fit < admit:
            admit = kv_fit if kv_fit > 0 else 1
        n = self._n
        if admit > 0:
            entered = self._phase is _DECODE
            self._phase = _PREFILL
            self._target_running = num_running + room
            self._phase_max_free_kv_tokens = free_kv_tokens
            self._last_kind = _PREFILL_ONLY
            max_active = num_running + admit
            if max_active > n:
                max_active = n
            return StepPlan(_PREFILL_ONLY, self._prefill_budget_tokens, max_active, admit, n, entered)
        # Nothing can run and nothing can be admitted (no waiting request or no free slot): an inert plan.
        # DECODE_ONLY with nothing decoding leaves vLLM's throttle off, i.e. stock behaviour under the cap.
        self._phase = _DECODE
        self._refill_running = num_running
        self._refill_kv_limited = False
        self._last_kind = _DECODE_ONLY
        return self._decode_plan
