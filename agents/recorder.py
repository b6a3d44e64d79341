"""Hot-path telemetry buffers filled by the scheduler thread and drained by the link thread.

Every `record_*` call is O(1): it writes scalars into preallocated columns of a ring buffer under a
lock held for a few hundred nanoseconds. When a ring is full the oldest event is overwritten and
counted in `num_dropped`; the scheduler never waits for the network.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass


class _Ring:
    """Columns of fixed capacity; `push` overwrites the oldest row when full."""

    __slots__ = ("_capacity", "_columns", "_count", "_head", "num_dropped")

    def __init__(self, capacity: int, width: int) -> None:
        self._capacity = capacity
        self._columns = [[0] * capacity for _ in range(width)]
        self._head = 0
        self._count = 0
        self.num_dropped = 0

    def push(self, *values: float) -> None:
        head = self._head
        for column, value in zip(self._columns, values):  # noqa: B905 - fixed width
            column[head] = value
        self._head = head + 1 if head + 1 < self._capacity else 0
        if self._count < self._capacity:
            self._count += 1
        else:
            self.num_dropped += 1

    def take(self) -> list[list[float]]:
        """The stored rows as columns, oldest first; empties the ring."""
        count, head, capacity = self._count, self._head, self._capacity
        start = head - count
        out = []
        for column in self._columns:
            if start >= 0:
                out.append(column[start:head])
            else:
                out.append(column[start + capacity:] + column[:head])
        self._count = 0
        return out

    def __len__(self) -> int:
        return self._count


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """What the link sends in one batch (columns as lists; gauges as of the latest step)."""

    prompt_tokens: list[int]
    output_tokens: list[int]
    finish_time_s: list[float]
    aborted: list[bool]
    prefill_tokens: list[int]
    decode_tokens: list[int]
    decode_requests: list[int]
    duration_s: list[float]
    kv_used_tokens: int
    kv_total_tokens: int
    num_running_prefills: int
    num_running_decodes: int
    num_waiting: int
    largest_remaining_prefill_tokens: int
    num_preemptions: int
    num_events_dropped: int
    running_output_tokens: list[int]
    running_num_requests: list[int]
    admitted_time_s: list[float]  # per completion: when first scheduled (NaN: never scheduled)
    running_admitted_time_s: list[float]  # per running entry: its earliest first-scheduled time; [] unknown
    arrival_time_s: list[float]  # per completion: when it reached the engine (NaN: unknown)
    first_token_time_s: list[float]  # per completion: when its first output token came (NaN: none)
    step_mode: list[int]  # per step: the wire Mode in force
    step_budget_tokens: list[int]  # per step: the token budget in force


class TelemetryRecorder:
    """Thread-safe single-producer (scheduler) / single-consumer (link) telemetry buffer."""

    __slots__ = ("_completions", "_gauges", "_lock", "_running", "_steps", "num_preemptions")

    def __init__(self, *, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be ≥ 1, got {capacity}")
        self._lock = threading.Lock()
        self._completions = _Ring(capacity, 7)
        self._steps = _Ring(capacity, 6)
        self._gauges = (0, 0, 0, 0, 0, 0)
        self._running: tuple[list[int], list[int], list[float]] | None = None
        self.num_preemptions = 0

    def record_step(self, prefill_tokens: int, decode_tokens: int, decode_requests: int, duration_s: float,
                    mode: int = 0, budget_tokens: int = 0) -> None:
        """mode: the wire Mode in force in the step; budget_tokens: the token budget it could schedule."""
        with self._lock:
            self._steps.push(prefill_tokens, decode_tokens, decode_requests, duration_s, mode, budget_tokens)

    def record_completion(self, prompt_tokens: int, output_tokens: int, finish_time_s: float, aborted: bool,
                          admitted_time_s: float = math.nan, arrival_time_s: float = math.nan,
                          first_token_time_s: float = math.nan) -> None:
        """Times are engine wall clock (Unix seconds). admitted_time_s: when the engine first scheduled the
        request (NaN: never); arrival_time_s: when it reached the engine; first_token_time_s: when its first
        output token was produced (NaN: none)."""
        with self._lock:
            self._completions.push(prompt_tokens, output_tokens, finish_time_s, aborted, admitted_time_s,
                                   arrival_time_s, first_token_time_s)

    def set_gauges(self, kv_used_tokens: int, kv_total_tokens: int, num_running_prefills: int,
                   num_running_decodes: int, num_waiting: int, largest_remaining_prefill_tokens: int) -> None:
        """Latest engine state (a tuple swap: atomic under the GIL, no lock needed)."""
        self._gauges = (kv_used_tokens, kv_total_tokens, num_running_prefills, num_running_decodes, num_waiting,
                        largest_remaining_prefill_tokens)

    def set_running_lengths(self, output_tokens: list[int], num_requests: list[int],
                            admitted_time_s: list[float] | None = None) -> None:
        """The running requests' output-length histogram (see agents.running_lengths), with each entry's
        earliest first-scheduled time when known, handed over whole; it replaces one not drained yet. The
        next `drain` takes it, so it is sent once."""
        with self._lock:
            self._running = (output_tokens, num_requests, admitted_time_s or [])

    def add_preemptions(self, count: int) -> None:
        self.num_preemptions += count

    @property
    def num_dropped(self) -> int:
        return self._steps.num_dropped + self._completions.num_dropped

    def drain(self) -> TelemetrySnapshot:
        """Everything recorded since the last drain (called by the link thread)."""
        with self._lock:
            prompts, outputs, finish, aborted, admitted, arrival, first_token = self._completions.take()
            prefill, decode_tok, decode_req, duration, step_mode, step_budget = self._steps.take()
            dropped = self.num_dropped
            running, self._running = self._running, None
        kv_used, kv_total, running_prefills, running_decodes, waiting, largest = self._gauges
        running_tokens, running_counts, running_admitted = running if running is not None else ([], [], [])
        return TelemetrySnapshot(
            prompt_tokens=prompts, output_tokens=outputs, finish_time_s=finish, aborted=[bool(a) for a in aborted],
            prefill_tokens=prefill, decode_tokens=decode_tok, decode_requests=decode_req, duration_s=duration,
            kv_used_tokens=kv_used, kv_total_tokens=kv_total, num_running_prefills=running_prefills,
            num_running_decodes=running_decodes, num_waiting=waiting, largest_remaining_prefill_tokens=largest,
            num_preemptions=self.num_preemptions, num_events_dropped=dropped,
            running_output_tokens=running_tokens, running_num_requests=running_counts,
            admitted_time_s=admitted, running_admitted_time_s=running_admitted,
            arrival_time_s=arrival, first_token_time_s=first_token, step_mode=step_mode,
            step_budget_tokens=step_budget,
        )
