"""What a fake engine records: one step, the scheduler state, and the drained telemetry of a batch.

Value types only (no I/O). Units in the names: tokens, requests, seconds of the engine's simulated clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step: tokens scheduled and its duration (s); end_s is the engine clock after it."""

    prefill_tokens: int
    decode_tokens: int
    decode_requests: int
    duration_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class SchedulerState:
    """Scheduler state between steps: running prefills/decodes and waiting (requests), and the tokens left
    to prefill of the largest running prefill."""

    num_running_prefills: int
    num_running_decodes: int
    num_waiting: int
    largest_remaining_prefill_tokens: int


def _empty_scheduler_state() -> SchedulerState:
    return SchedulerState(0, 0, 0, 0)


@dataclass(frozen=True, eq=False)
class EngineTelemetry:
    """Everything recorded since the previous `drain()`, columnar (element i of each list is event i).

    Step columns: prefill tokens, decode tokens, decode requests, duration (s), engine clock at the end
    of the step (s). Completion columns: prompt tokens, output tokens, finish time and the time the request
    was first scheduled, both on the engine clock (s); the fake engine never aborts. The running requests
    (right-censored output lengths, as an agent reports them): a histogram binned as
    `agents.running_lengths` bins it, output tokens so far and requests per entry, with the earliest time
    one of the entry's requests was first scheduled (engine clock, s). The gauges (KV, scheduler state),
    the running requests and the cumulative counters are read at drain time; now_s is the engine clock
    then. The lists are owned by the receiver after a drain.
    """

    step_prefill_tokens: list[int] = field(default_factory=list)
    step_decode_tokens: list[int] = field(default_factory=list)
    step_decode_requests: list[int] = field(default_factory=list)
    step_duration_s: list[float] = field(default_factory=list)
    step_end_s: list[float] = field(default_factory=list)
    completion_prompt_tokens: list[int] = field(default_factory=list)
    completion_output_tokens: list[int] = field(default_factory=list)
    completion_finish_s: list[float] = field(default_factory=list)
    completion_admitted_s: list[float] = field(default_factory=list)
    completion_arrival_s: list[float] = field(default_factory=list)
    completion_first_token_s: list[float] = field(default_factory=list)
    running_output_tokens: list[int] = field(default_factory=list)
    running_num_requests: list[int] = field(default_factory=list)
    running_admitted_s: list[float] = field(default_factory=list)
    kv_used_tokens: int = 0
    kv_total_tokens: int = 0
    scheduler: SchedulerState = field(default_factory=_empty_scheduler_state)
    num_preemptions: int = 0
    num_events_dropped: int = 0
    now_s: float = 0.0
