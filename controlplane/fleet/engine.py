"""The synthetic fleet's engine: the twin's engine (`controlplane.sim.engine.SimEngine`) behind the interface
the fleet client drives, with a closed-loop workload and buffered telemetry.

Pure: no I/O, no clock, no threads. Simulated time advances only by the step durations of the cost model,
so one seed and one sequence of `apply`/`step` calls always give the same result.

What this adapter adds to the twin's engine (which owns all scheduling: slots, KV, chunked prefill,
preemption, and the agent's `Enforcer` planning every step):
- Arrivals: closed loop. `workload.concurrency` requests are in the system (running + waiting); each finish
  brings a new arrival at the finish time (until `num_requests` arrivals, when given).
- Decisions: validated and held by the engine's `Enforcer` (the agent's own rules: `k_greater_than_n`,
  `n_greater_than_max_num_seqs`, …; an advisory decision is held and the engine runs stock), under an
  adapter-local version (versions are not checked here because a controller whose store was reset may
  restart them) and a TTL the enforcer never reaches: the fleet client owns the TTL and calls
  `reset_to_stock` when a decision outlives it.
- Telemetry: steps and completions (with when each request was first scheduled) buffered (bounded by
  `max_buffered_events` per kind; beyond it events are dropped and counted) and taken with `drain()`, which
  adds the running requests' output lengths as the agent bins them. Times are in simulated seconds from
  `start_s`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from agents.running_lengths import running_length_entries
from controlplane.api.v1 import common_pb2
from controlplane.core.types import CostModel
from controlplane.fleet.settings import EngineSettings, settings_from_decision
from controlplane.fleet.telemetry import EngineTelemetry, SchedulerState, StepRecord
from controlplane.fleet.workload import WorkloadSpec
from controlplane.sim.engine import SimEngine
from controlplane.sim.profiles import H200_QWEN3_8B, H200_QWEN3_8B_SHAPE, EngineShape, SimProfile

DEFAULT_MAX_BUFFERED_EVENTS = 1 << 16
_SAMPLE_BLOCK = 256
# The fleet client expires decisions itself (reset_to_stock); the enforcer must never do it first.
_ENFORCER_TTL_S = 1e12


class FakeEngine:
    """A twin engine with a closed-loop workload; advanced one step at a time (see the module docstring).

    Not thread-safe; one owner drives it.
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
        if num_requests is not None and num_requests < 0:
            raise ValueError(f"num_requests must be ≥ 0, got {num_requests}")
        if max_buffered_events < 1:
            raise ValueError(f"max_buffered_events must be ≥ 1, got {max_buffered_events}")
        length_seed, jitter_seed = np.random.SeedSequence(seed).spawn(2)
        profile = SimProfile(name="fleet", costs=cost_model, shape=shape)
        self._sim = SimEngine(profile, shape=shape, seed=int(jitter_seed.generate_state(1)[0]),
                              duration_jitter_rel=duration_jitter_rel, record_steps=False, start_s=start_s)
        self._workload = workload
        self._shape = shape
        self._costs = cost_model
        self._max_buffered = max_buffered_events
        self._length_rng = np.random.default_rng(length_seed)
        self._pending_lengths: deque[tuple[int, int]] = deque()
        self._num_arrivals_left = num_requests
        self._settings = EngineSettings.stock(shape)
        self._enforcer_version = 0
        self._num_dropped = 0
        self._buffer = EngineTelemetry()
        self._arrive(workload.concurrency)

    # ----------------------------------------------------------------------------------------- state

    @property
    def now_s(self) -> float:
        """Engine clock, simulated seconds."""
        return self._sim.now_s

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
        return self._sim.num_running

    @property
    def num_waiting(self) -> int:
        return self._sim.num_waiting

    @property
    def num_completed(self) -> int:
        return self._sim.num_completed

    @property
    def num_preemptions(self) -> int:
        return self._sim.num_preemptions

    @property
    def num_steps(self) -> int:
        """Steps executed (steps that scheduled something)."""
        return self._sim.num_steps

    @property
    def kv_used_tokens(self) -> int:
        """KV in use, tokens (whole blocks)."""
        return self._sim.kv_used_tokens

    @property
    def kv_total_tokens(self) -> int:
        """KV capacity, tokens (whole blocks)."""
        return self._sim.kv_total_tokens

    @property
    def is_idle(self) -> bool:
        """Nothing running or waiting (only possible when num_requests bounds the arrivals)."""
        return self._sim.is_idle

    def scheduler_state(self) -> SchedulerState:
        """Running prefills/decodes, waiting, and the largest remaining prefill among running requests."""
        sim = self._sim
        return SchedulerState(sim.num_running_prefills, sim.num_running_decodes, sim.num_waiting,
                              sim.largest_remaining_prefill_tokens())

    # ------------------------------------------------------------------------------------- decisions

    def apply(self, decision: common_pb2.Decision) -> tuple[bool, str]:
        """Put a decision in force from the next step, or refuse it.

        See `settings_from_decision` for the budget clamping; a PASSTHROUGH decision restores stock
        behaviour. Lowering N below the running count stops admission only; nobody is evicted.

        Returns:
            (applied, reject_reason): (True, "") or (False, the Enforcer's code). A refused decision
            leaves the settings in force unchanged.
        """
        forwarded = common_pb2.Decision()
        forwarded.CopyFrom(decision)
        forwarded.version = self._enforcer_version + 1
        forwarded.ttl_s = _ENFORCER_TTL_S
        applied, reason = self._sim.enforcer.apply(forwarded, now_s=self._sim.now_s)
        if not applied:
            return False, reason
        self._enforcer_version += 1
        if decision.advisory:
            self._settings = replace(EngineSettings.stock(self._shape), version=decision.version)
        else:
            self._settings = settings_from_decision(decision, shape=self._shape)
        return True, ""

    def reset_to_stock(self) -> None:
        """Fall back to stock vLLM behaviour (PASSTHROUGH, start-up budget, all slots), version 0."""
        self._enforcer_version += 1
        self._sim.enforcer.apply(common_pb2.Decision(version=self._enforcer_version, mode=common_pb2.MODE_PASSTHROUGH,
                                                     ttl_s=_ENFORCER_TTL_S), now_s=self._sim.now_s)
        self._settings = EngineSettings.stock(self._shape)

    # ------------------------------------------------------------------------------------- stepping

    def run_until(self, end_s: float, *, max_steps: int | None = None) -> int:
        """Step while the clock is before `end_s` (the last step may end after it). Returns steps run.

        Stops early when the engine is idle or after `max_steps` steps.
        """
        num_steps = 0
        while self._sim.now_s < end_s and (max_steps is None or num_steps < max_steps):
            if self.step() is None:
                break
            num_steps += 1
        return num_steps

    def step(self) -> StepRecord | None:
        """Schedule and execute one engine step; None (and no time passes) when there is nothing to do."""
        step = self._sim.step()
        if step is None:
            return None
        record = StepRecord(step.prefill_tokens, step.num_decodes, step.num_decodes, step.duration_s, step.end_s)
        buffer = self._buffer
        if len(buffer.step_duration_s) < self._max_buffered:
            buffer.step_prefill_tokens.append(step.prefill_tokens)
            buffer.step_decode_tokens.append(step.num_decodes)
            buffer.step_decode_requests.append(step.num_decodes)
            buffer.step_duration_s.append(step.duration_s)
            buffer.step_end_s.append(step.end_s)
        else:
            self._num_dropped += 1
        finished = step.finished
        if finished.size:
            prompts, outputs = self._sim.lengths_of(finished)
            admitted = self._sim.admitted_of(finished)
            arrival, first_token = self._sim.stamps_of(finished)
            for prompt, output, admitted_s, arrival_s, first_token_s in zip(
                    prompts.tolist(), outputs.tolist(), admitted.tolist(), arrival.tolist(), first_token.tolist(),
                    strict=True):
                if len(buffer.completion_finish_s) < self._max_buffered:
                    buffer.completion_prompt_tokens.append(prompt)
                    buffer.completion_output_tokens.append(output)
                    buffer.completion_finish_s.append(step.end_s)
                    buffer.completion_admitted_s.append(admitted_s)
                    buffer.completion_arrival_s.append(arrival_s)
                    buffer.completion_first_token_s.append(first_token_s)
                else:
                    self._num_dropped += 1
            # Closed loop: each finish brings one arrival, at the finish time.
            self._arrive(self._workload.concurrency - self._sim.num_running - self._sim.num_waiting)
        return record

    def drain(self) -> EngineTelemetry:
        """Take everything recorded since the last drain, with the gauges, the running requests' output
        lengths (O(running)) and the counters as of now."""
        buffer = self._buffer
        self._buffer = EngineTelemetry()
        lengths, counts, admitted = running_length_entries(self._sim.running_output_tokens().tolist(),
                                                           self._sim.running_admitted_s().tolist())
        return replace(
            buffer,
            running_output_tokens=lengths,
            running_num_requests=counts,
            running_admitted_s=admitted,
            kv_used_tokens=self.kv_used_tokens,
            kv_total_tokens=self.kv_total_tokens,
            scheduler=self.scheduler_state(),
            num_preemptions=self.num_preemptions,
            num_events_dropped=self._num_dropped,
            now_s=self.now_s,
        )

    # ------------------------------------------------------------------------------------- internals

    def _arrive(self, count: int) -> None:
        if self._num_arrivals_left is not None:
            count = min(count, self._num_arrivals_left)
            self._num_arrivals_left -= max(0, count)
        if count <= 0:
            return
        while len(self._pending_lengths) < count:
            prompts, outputs = self._workload.sample(self._length_rng, _SAMPLE_BLOCK)
            self._pending_lengths.extend(zip(prompts.tolist(), outputs.tolist(), strict=True))
        lengths = [self._pending_lengths.popleft() for _ in range(count)]
        self._sim.add_requests(np.fromiter((p for p, _ in lengths), dtype=np.int64, count=count),
                               np.fromiter((o for _, o in lengths), dtype=np.int64, count=count), self._sim.now_s)
