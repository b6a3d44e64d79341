"""The per-step instruction the enforcement code hands to the engine adapter: `StepPlan`.

One `StepPlan` is produced per engine step, before the engine schedules. It uses only knobs that a vLLM 0.32
scheduler subclass can set between steps without copying `schedule()` (docs/VLLM_INTERNALS.md):

- `kind`:
    DECODE_ONLY   call `schedule(throttle_prefills=True)` with `prefill_capacity_bound = False`: running
                  prefill chunks are skipped and nothing is admitted. vLLM applies the throttle only when
                  at least one request can decode, so the step is never empty while something decodes.
    PREFILL_ONLY  push `next_decode_eligible_step` of every running request that is not a prefill chunk to
                  at least `current_step + 2` before `schedule()`: only prefill chunks run (running partial
                  prefills first, then admissions up to `max_num_active_reqs`).
    STOCK         stock scheduling (mixed batching) under `token_budget_tokens` and `max_num_active_reqs`.
- `token_budget_tokens` → `self.max_num_scheduled_tokens` (already clamped to the start-up budget; vLLM can
  only lower it).
- `max_num_active_reqs` → `self.max_num_active_reqs` (gates admission only; may be below the running count,
  nobody is evicted). Never touch `max_num_running_reqs`.

Pure data: no I/O. A plain `__slots__` class (not a dataclass) because one is built every engine step.
"""

from __future__ import annotations

import enum


class StepKind(enum.Enum):
    """What one engine step may contain (see the module docstring for how the adapter applies it)."""

    DECODE_ONLY = "decode_only"
    PREFILL_ONLY = "prefill_only"
    STOCK = "stock"


class StepPlan:
    """The instruction for one engine step. Treat as immutable; it is safe to keep after the step.

    Attributes:
        kind: DECODE_ONLY | PREFILL_ONLY (exclusive batching) or STOCK (MB, PASSTHROUGH, advisory).
        token_budget_tokens: the step's token budget, tokens; 1 ≤ value ≤ the engine's start-up budget.
        max_num_active_reqs: admission gate for this step, requests: vLLM admits from the waiting queue only
            while running < this. N for STOCK and DECODE_ONLY; min(N, running + num_new_reqs_max) for
            PREFILL_ONLY.
        num_new_reqs_max: how many waiting requests this step may admit, requests (≥ 0): 0 for DECODE_ONLY,
            the EB admission limit for PREFILL_ONLY (= k_left capped by idle slots, waiting and free KV), and
            N for STOCK (no per-step limit besides the gate `max_num_active_reqs`).
        num_seqs_cap: the admission cap N in force, requests (max_num_seqs under stock behaviour).
        phase_switched: True when this step starts a new EB phase (decode→prefill or prefill→decode);
            always False for STOCK. Lets the recorder count phase switches (each costs a batch rebuild).
    """

    __slots__ = ("kind", "max_num_active_reqs", "num_new_reqs_max", "num_seqs_cap", "phase_switched",
                 "token_budget_tokens")

    def __init__(self, kind: StepKind, token_budget_tokens: int, max_num_active_reqs: int, num_new_reqs_max: int,
                 num_seqs_cap: int, phase_switched: bool = False, /) -> None:
        self.kind = kind
        self.token_budget_tokens = token_budget_tokens
        self.max_num_active_reqs = max_num_active_reqs
        self.num_new_reqs_max = num_new_reqs_max
        self.num_seqs_cap = num_seqs_cap
        self.phase_switched = phase_switched

    def _fields(self) -> tuple:
        return (self.kind, self.token_budget_tokens, self.max_num_active_reqs, self.num_new_reqs_max,
                self.num_seqs_cap, self.phase_switched)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepPlan):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"StepPlan(kind={self.kind.name}, token_budget_tokens={self.token_budget_tokens}, "
                f"max_num_active_reqs={self.max_num_active_reqs}, num_new_reqs_max={self.num_new_reqs_max}, "
                f"num_seqs_cap={self.num_seqs_cap}, phase_switched={self.phase_switched})")
