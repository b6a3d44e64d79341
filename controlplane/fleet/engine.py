"""A deterministic step simulator of one vLLM engine (the fake engine of the synthetic fleet).

Pure: no I/O, no clock, no threads. Simulated time advances only by the step durations the cost model
computes, so one seed and one sequence of `apply`/`step` calls always give the same result.

Model (a small subset of vLLM v1, chosen to produce the telemetry the controller reads):
- Slots and KV: at most `max_num_seqs` running requests (further capped by the decision's N); KV is held
  in blocks of `block_size_tokens` out of `kv_capacity_tokens`. A request holds the KV of its computed
  tokens; when a request cannot get the blocks it needs, the latest-admitted running request not yet
  scheduled in the step is preempted (recompute: its KV is freed and it returns to the front of the
  waiting queue; on resume it prefills prompt + generated tokens again), possibly itself.
- Request life: prefill the prompt (chunked), the final chunk samples the first output token, then one
  decode token per step until the output length is reached. Output lengths are fixed at arrival.
- Arrivals: closed loop. `workload.concurrency` requests are in the system (running + waiting); each
  finish brings a new arrival at the finish time (until `num_requests` arrivals, when given).
- Modes (the decision in force):
    MB           every step decodes all running decodes, then continues running chunked prefills, then
                 admits waiting requests, all within the P-PAS token budget (B_cap under pressure, else
                 B_max, evaluated on the state at the start of the step, with N_p = running prefills +
                 admissible waiting requests: see `_pressure_snapshot`); running capped at N.
    EB           exclusive steps. Decode phase: decode-only steps while something decodes and fewer than
                 k slots (of N) are free. Then a prefill phase: prefill-only steps that finish running
                 prefills and admit up to k waiting requests (capped by N, free KV and the no-pressure
                 budget B_max), until no running prefill is left. A prefill step with nothing to schedule
                 falls back to a decode step.
    PASSTHROUGH  stock vLLM: MB with N = max_num_seqs and the start-up budget (the state before any
                 decision, and after a decision's TTL expires).
- Step cost (seconds), by the content of the step, like the controller's cost-model fit:
    prefill-only α_p + β_p·prefill tokens; decode-only α_d + β_d·decode requests;
    mixed α_MB + β_MB^e(r)·tokens, r = decode tokens / tokens; times exp(σ·z) when a jitter σ is set.

Telemetry is buffered (bounded by `max_buffered_events` per kind; beyond it events are dropped and
counted) and taken with `drain()`. Times are in simulated seconds from `start_s`.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import replace

import numpy as np

from controlplane.api.v1 import common_pb2
from controlplane.core.budget import step_budget_tokens
from controlplane.core.types import CostModel, Mode, SchedulerSnapshot
from controlplane.fleet.profiles import H200_QWEN3_8B, H200_QWEN3_8B_SHAPE, EngineShape
from controlplane.fleet.settings import EngineSettings, reject_reason, settings_from_decision
from controlplane.fleet.telemetry import EngineTelemetry, SchedulerState, StepRecord
from controlplane.fleet.workload import WorkloadSpec

DEFAULT_MAX_BUFFERED_EVENTS = 1 << 16
_SAMPLE_BLOCK = 256
class _Phase(enum.Enum):
    DECODE = "decode"
    PREFILL = "prefill"


class _Request:
    """Mutable per-request state. num_tokens = prompt + generated; the KV holds num_computed of them."""

    __slots__ = ("num_blocks", "num_computed", "num_generated", "output_tokens", "prompt_tokens", "running",
                 "scheduled_at")

    def __init__(self, prompt_tokens: int, output_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.num_generated = 0
        self.num_computed = 0
        self.num_blocks = 0
        self.running = False
        self.scheduled_at = -1


class FakeEngine:
    """N slots, a KV cache, a cost model and a closed-loop workload; advanced one step at a time.

    Not thread-safe; one owner drives it. See the module docstring for the model.
    """

    def __init__(
        self,
        *,
        workload: WorkloadSpec,
        shape: EngineShape = H200_QWEN3_8B_SHAPE,
        cost_model: CostModel = H200_QWEN3_8B,
        seed: int = 0,
        num_requests: int | None = None,
        duration_jitter_rel: float = 0.0,
        max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS,
        start_s: float = 0.0,
    ) -> None:
        """
        Args:
            workload: lengths and closed-loop concurrency.
            shape: start-up limits (slots, budget, KV, block size, max model length).
            cost_model: step cost in seconds (default: H200, Qwen3-8B).
            seed: seeds the request lengths and the duration jitter (independent streams).
            num_requests: total arrivals (None: unbounded closed loop). When all have finished the
                engine is idle and `step()` returns None.
            duration_jitter_rel: σ of the multiplicative log-normal noise on step durations (0: exact).
            max_buffered_events: per kind (steps, completions) kept until `drain()`; beyond, dropped
                and counted.
            start_s: engine clock at start, seconds.

        Raises:
            ValueError: on a negative jitter, num_requests < 0 or max_buffered_events < 1.
        """
        if not (math.isfinite(duration_jitter_rel) and duration_jitter_rel >= 0.0):
            raise ValueError(f"duration_jitter_rel must be finite and ≥ 0, got {duration_jitter_rel}")
        if num_requests is not None and num_requests < 0:
            raise ValueError(f"num_requests must be ≥ 0, got {num_requests}")
        if max_buffered_events < 1:
            raise ValueError(f"max_buffered_events must be ≥ 1, got {max_buffered_events}")
        self._workload = workload
        self._shape = shape
        self._costs = cost_model
        self._jitter = duration_jitter_rel
        self._max_buffered = max_buffered_events
        length_seed, jitter_seed = np.random.SeedSequence(seed).spawn(2)
        self._length_rng = np.random.default_rng(length_seed)
        self._jitter_rng = np.random.default_rng(jitter_seed)
        self._pending_lengths: deque[tuple[int, int]] = deque()
        self._num_arrivals_left = num_requests
        self._block = shape.block_size_tokens
        self._total_blocks = shape.kv_capacity_tokens // shape.block_size_tokens
        self._free_blocks = self._total_blocks
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._settings = EngineSettings.stock(shape)
        self._phase = _Phase.DECODE
        self._k_left = 0
        self._now_s = float(start_s)
        self._step_index = 0
        self._num_steps = 0
        self._num_completed = 0
        self._num_preemptions = 0
        self._num_dropped = 0
        self._buffer = EngineTelemetry()
        for _ in range(workload.concurrency):
            self._arrive()

    # ----------------------------------------------------------------------------------------- state

    @property
    def now_s(self) -> float:
        """Engine clock, simulated seconds."""
        return self._now_s

    @property
    def shape(self) -> EngineShape:
        return self._shape

    @property
    def cost_model(self) -> CostModel:
        return self._costs

    @property
    def settings(self) -> EngineSettings:
        """The scheduling parameters in force."""
        return self._settings

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_completed(self) -> int:
        return self._num_completed

    @property
    def num_preemptions(self) -> int:
        return self._num_preemptions

    @property
    def num_steps(self) -> int:
        """Steps executed (steps that scheduled something)."""
        return self._num_steps

    @property
    def kv_used_tokens(self) -> int:
        """KV in use, tokens (whole blocks)."""
        return (self._total_blocks - self._free_blocks) * self._block

    @property
    def kv_total_tokens(self) -> int:
        """KV capacity, tokens (whole blocks)."""
        return self._total_blocks * self._block

    @property
    def is_idle(self) -> bool:
        """Nothing running or waiting (only possible when num_requests bounds the arrivals)."""
        return not self._running and not self._waiting

    def scheduler_state(self) -> SchedulerState:
        """Running prefills/decodes, waiting, and the largest remaining prefill among running requests."""
        num_prefills = num_decodes = largest = 0
        for req in self._running:
            remaining = req.prompt_tokens + req.num_generated - req.num_computed
            if req.num_generated and remaining == 1:
                num_decodes += 1
            else:
                num_prefills += 1
                largest = max(largest, remaining)
        return SchedulerState(num_prefills, num_decodes, len(self._waiting), largest)

    # ------------------------------------------------------------------------------------- decisions

    def apply(self, decision: common_pb2.Decision) -> tuple[bool, str]:
        """Put a decision in force from the next step, or refuse it.

        See `settings_from_decision` for the budget clamping; a PASSTHROUGH decision restores stock
        behaviour. Lowering N below the running count stops admission only; nobody is evicted.

        Returns:
            (applied, reject_reason): (True, "") or (False, a code from `reject_reason`). A refused
            decision leaves the settings in force unchanged.
        """
        reason = reject_reason(decision, max_num_seqs=self._shape.max_num_seqs)
        if reason:
            return False, reason
        self._set_settings(settings_from_decision(decision, shape=self._shape))
        return True, ""

    def reset_to_stock(self) -> None:
        """Fall back to stock vLLM behaviour (PASSTHROUGH, start-up budget, all slots), version 0."""
        self._set_settings(EngineSettings.stock(self._shape))

    def _set_settings(self, settings: EngineSettings) -> None:
        if settings.mode is not self._settings.mode:
            self._phase = _Phase.DECODE
            self._k_left = 0
        self._k_left = min(self._k_left, settings.k)
        self._settings = settings

    # ------------------------------------------------------------------------------------- stepping

    def run_until(self, end_s: float, *, max_steps: int | None = None) -> int:
        """Step while the clock is before `end_s` (the last step may end after it). Returns steps run.

        Stops early when the engine is idle or after `max_steps` steps.
        """
        num_steps = 0
        while self._now_s < end_s and (max_steps is None or num_steps < max_steps):
            if self.step() is None:
                break
            num_steps += 1
        return num_steps

    def step(self) -> StepRecord | None:
        """Schedule and execute one engine step; None (and no time passes) when there is nothing to do."""
        if not self._running and not self._waiting:
            return None
        self._step_index += 1
        decodes, prefills = self._partition_running()
        settings = self._settings
        if settings.mode is Mode.EB:
            scheduled, counts, prefill_tokens, num_decodes = self._schedule_eb(settings, decodes, prefills)
        else:
            scheduled, counts, prefill_tokens, num_decodes = self._schedule_mb(settings, decodes, prefills)
        if not scheduled:
            return None
        duration_s = self._duration_s(prefill_tokens, num_decodes)
        self._now_s += duration_s
        self._num_steps += 1
        self._execute(scheduled, counts)
        record = StepRecord(prefill_tokens, num_decodes, num_decodes, duration_s, self._now_s)
        buffer = self._buffer
        if len(buffer.step_duration_s) < self._max_buffered:
            buffer.step_prefill_tokens.append(prefill_tokens)
            buffer.step_decode_tokens.append(num_decodes)
            buffer.step_decode_requests.append(num_decodes)
            buffer.step_duration_s.append(duration_s)
            buffer.step_end_s.append(self._now_s)
        else:
            self._num_dropped += 1
        return record

    def drain(self) -> EngineTelemetry:
        """Take everything recorded since the last drain, with the gauges and counters as of now."""
        buffer = self._buffer
        self._buffer = EngineTelemetry()
        return replace(
            buffer,
            kv_used_tokens=self.kv_used_tokens,
            kv_total_tokens=self.kv_total_tokens,
            scheduler=self.scheduler_state(),
            num_preemptions=self._num_preemptions,
            num_events_dropped=self._num_dropped,
            now_s=self._now_s,
        )

    # ------------------------------------------------------------------------------------- internals

    def _arrive(self) -> None:
        if self._num_arrivals_left is not None:
            if self._num_arrivals_left == 0:
                return
            self._num_arrivals_left -= 1
        if not self._pending_lengths:
            prompts, outputs = self._workload.sample(self._length_rng, _SAMPLE_BLOCK)
            max_len = self._shape.max_model_len_tokens
            for p, o in zip(prompts.tolist(), outputs.tolist(), strict=True):
                prompt = min(p, max_len - 1)
                self._pending_lengths.append((prompt, max(1, min(o, max_len - prompt))))
        prompt, output = self._pending_lengths.popleft()
        self._waiting.append(_Request(prompt, output))

    def _partition_running(self) -> tuple[list[_Request], list[_Request]]:
        decodes: list[_Request] = []
        prefills: list[_Request] = []
        for req in self._running:
            if req.num_generated and req.prompt_tokens + req.num_generated - req.num_computed == 1:
                decodes.append(req)
            else:
                prefills.append(req)
        return decodes, prefills

    def _schedule_mb(
        self, settings: EngineSettings, decodes: list[_Request], prefills: list[_Request]
    ) -> tuple[list[_Request], list[int], int, int]:
        if settings.mode is Mode.PASSTHROUGH:
            budget_tokens = self._shape.max_num_batched_tokens
            cap = self._shape.max_num_seqs
        else:
            cap = settings.n
            budget_tokens = step_budget_tokens(self._pressure_snapshot(decodes, prefills, cap), settings.budget)
        budget_tokens = max(1, min(budget_tokens, self._shape.max_num_batched_tokens))
        scheduled: list[_Request] = []
        counts: list[int] = []
        tokens_left, num_decodes, ok = self._schedule_decodes(decodes, budget_tokens, scheduled, counts)
        prefill_tokens = 0
        if ok:
            tokens_left, prefill_tokens, ok = self._schedule_prefills(prefills, tokens_left, scheduled, counts)
        if ok:
            tokens_left, admitted_tokens, _ = self._admit(tokens_left, cap, None, scheduled, counts)
            prefill_tokens += admitted_tokens
        return scheduled, counts, prefill_tokens, num_decodes

    def _pressure_snapshot(self, decodes: list[_Request], prefills: list[_Request], cap: int) -> SchedulerSnapshot:
        """The P-PAS inputs at the start of a step: active prefills N_p, running decodes N_d, and the largest
        remaining prefill among those prefills (tokens).

        N_p counts running requests still prefilling plus the waiting requests the admission cap lets in
        this step (at most cap − running). Under chunked prefill at most one running request is mid-prefill
        at a step boundary (admission stops when the budget runs out), so running prefills alone would
        almost never reach N_th ≥ 2; the P-PAS paper counts "active prefills" competing for the budget.
        """
        largest = 0
        for req in prefills:
            largest = max(largest, req.prompt_tokens + req.num_generated - req.num_computed)
        num_admissible = min(len(self._waiting), max(0, cap - len(self._running)))
        for index in range(num_admissible):
            req = self._waiting[index]
            largest = max(largest, req.prompt_tokens + req.num_generated)
        return SchedulerSnapshot(len(prefills) + num_admissible, len(decodes), largest)

    def _schedule_eb(
        self, settings: EngineSettings, decodes: list[_Request], prefills: list[_Request]
    ) -> tuple[list[_Request], list[int], int, int]:
        scheduled: list[_Request] = []
        counts: list[int] = []
        n = settings.n
        if self._phase is _Phase.DECODE:
            free_slots = n - len(self._running)
            if not prefills and decodes and free_slots < settings.k:
                _, num_decodes, _ = self._schedule_decodes(
                    decodes, self._shape.max_num_batched_tokens, scheduled, counts)
                return scheduled, counts, 0, num_decodes
            self._phase = _Phase.PREFILL
            self._k_left = max(0, min(settings.k, free_slots))
        budget_tokens = max(1, min(settings.budget.b_max_tokens, self._shape.max_num_batched_tokens))
        tokens_left, prefill_tokens, ok = self._schedule_prefills(prefills, budget_tokens, scheduled, counts)
        if ok:
            _, admitted_tokens, num_admitted = self._admit(tokens_left, n, self._k_left, scheduled, counts)
            prefill_tokens += admitted_tokens
            self._k_left -= num_admitted
        if not scheduled:
            self._phase = _Phase.DECODE
            live_decodes = [r for r in decodes if r.running]
            _, num_decodes, _ = self._schedule_decodes(
                live_decodes, self._shape.max_num_batched_tokens, scheduled, counts)
            return scheduled, counts, 0, num_decodes
        if self._phase_prefill_done(n, scheduled, counts):
            self._phase = _Phase.DECODE
        return scheduled, counts, prefill_tokens, 0

    def _phase_prefill_done(self, n: int, scheduled: list[_Request], counts: list[int]) -> bool:
        """After this step, is no running prefill left and no more admission due in this phase?"""
        unfinished = any(
            req.num_computed + count < req.prompt_tokens + req.num_generated
            for req, count in zip(scheduled, counts, strict=True)
        )
        if unfinished:
            return False
        return self._k_left <= 0 or not self._waiting or len(self._running) >= n

    def _schedule_decodes(
        self, decodes: list[_Request], tokens_left: int, scheduled: list[_Request], counts: list[int]
    ) -> tuple[int, int, bool]:
        """One token per decode, in admission order. Returns (tokens left, decodes scheduled, pass ok)."""
        block = self._block
        step = self._step_index
        num = 0
        for req in decodes:
            if tokens_left <= 0:
                break
            if not req.running:
                continue
            needed = (req.num_computed + block) // block - req.num_blocks
            if needed > self._free_blocks and not self._make_room(req, needed):
                return tokens_left, num, False
            self._free_blocks -= needed
            req.num_blocks += needed
            req.scheduled_at = step
            scheduled.append(req)
            counts.append(1)
            tokens_left -= 1
            num += 1
        return tokens_left, num, True

    def _schedule_prefills(
        self, prefills: list[_Request], tokens_left: int, scheduled: list[_Request], counts: list[int]
    ) -> tuple[int, int, bool]:
        """Chunks of running prefills, in admission order. Returns (tokens left, tokens, pass ok)."""
        block = self._block
        total = 0
        for req in prefills:
            if tokens_left <= 0:
                break
            if not req.running:
                continue
            want = min(req.prompt_tokens + req.num_generated - req.num_computed, tokens_left)
            needed = -(-(req.num_computed + want) // block) - req.num_blocks
            if needed > self._free_blocks and not self._make_room(req, needed):
                return tokens_left, total, False
            self._free_blocks -= needed
            req.num_blocks += needed
            req.scheduled_at = self._step_index
            scheduled.append(req)
            counts.append(want)
            tokens_left -= want
            total += want
        return tokens_left, total, True

    def _admit(
        self, tokens_left: int, cap: int, max_admit: int | None, scheduled: list[_Request], counts: list[int]
    ) -> tuple[int, int, int]:
        """Admit waiting requests (FIFO) while the budget, the cap, `max_admit` and free KV allow.

        A request whose first chunk does not fit in free KV stops admission (as in vLLM).
        Returns (tokens left, tokens scheduled, requests admitted).
        """
        block = self._block
        total = admitted = 0
        while self._waiting and tokens_left > 0 and len(self._running) < cap:
            if max_admit is not None and admitted >= max_admit:
                break
            req = self._waiting[0]
            want = min(req.prompt_tokens + req.num_generated, tokens_left)
            needed = -(-want // block)
            if needed > self._free_blocks:
                break
            self._waiting.popleft()
            self._free_blocks -= needed
            req.num_blocks = needed
            req.running = True
            req.scheduled_at = self._step_index
            self._running.append(req)
            scheduled.append(req)
            counts.append(want)
            tokens_left -= want
            total += want
            admitted += 1
        return tokens_left, total, admitted

    def _make_room(self, req: _Request, needed_blocks: int) -> bool:
        """Preempt latest-admitted unscheduled running requests until `needed_blocks` are free.

        Returns False when `req` itself had to be preempted (the caller stops its pass, as vLLM does).
        """
        while self._free_blocks < needed_blocks:
            victim = next(r for r in reversed(self._running) if r.scheduled_at != self._step_index)
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: _Request) -> None:
        self._running.remove(req)
        self._free_blocks += req.num_blocks
        req.num_blocks = 0
        req.num_computed = 0
        req.running = False
        self._waiting.appendleft(req)
        self._num_preemptions += 1

    def _duration_s(self, prefill_tokens: int, num_decodes: int) -> float:
        costs = self._costs
        if num_decodes == 0:
            duration = costs.alpha_p_s + costs.beta_p_s_per_token * prefill_tokens
        elif prefill_tokens == 0:
            duration = costs.alpha_d_s + costs.beta_d_s_per_request * num_decodes
        else:
            tokens = prefill_tokens + num_decodes
            duration = costs.alpha_mb_s + costs.beta_mb_e(num_decodes / tokens) * tokens
        if self._jitter > 0.0:
            duration *= math.exp(self._jitter * float(self._jitter_rng.standard_normal()))
        return duration

    def _execute(self, scheduled: list[_Request], counts: list[int]) -> None:
        finished = False
        buffer = self._buffer
        for req, count in zip(scheduled, counts, strict=True):
            req.num_computed += count
            if req.num_computed != req.prompt_tokens + req.num_generated:
                continue
            req.num_generated += 1
            if req.num_generated < req.output_tokens:
                continue
            finished = True
            req.running = False
            self._free_blocks += req.num_blocks
            req.num_blocks = 0
            self._num_completed += 1
            if len(buffer.completion_finish_s) < self._max_buffered:
                buffer.completion_prompt_tokens.append(req.prompt_tokens)
                buffer.completion_output_tokens.append(req.num_generated)
                buffer.completion_finish_s.append(self._now_s)
            else:
                self._num_dropped += 1
        if finished:
            self._running = [r for r in self._running if r.running]
            # Closed loop: each finish brings one arrival, at the finish time.
            for _ in range(self._workload.concurrency - len(self._running) - len(self._waiting)):
                self._arrive()
