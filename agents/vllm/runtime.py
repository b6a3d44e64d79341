"""The agent inside one vLLM engine: reads scheduler state, applies the plan, records telemetry.

`AgentRuntime` is created by the scheduler subclass (agents/vllm/scheduler.py) and called from the
scheduler thread only: `before_schedule` (apply a newly received decision at the step boundary, plan
the step, set the scheduler's knobs), `after_schedule` (step composition), `after_update` (step
duration, KV usage) and `record_finish` (finished requests). Each hook is O(1) plus, at most, a C-level
pass over the step's scheduled-token counts; the network lives in the link thread.

Knobs (shared/VLLM_NOTES.md): `max_num_scheduled_tokens` (only lowered), `max_num_active_reqs`
(admission gate), decode-only steps through `schedule(throttle_prefills=True)` with
`prefill_capacity_bound = False`, prefill-only steps by pushing `next_decode_eligible_step` of the
decoding requests past this step.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from agents import __version__
from agents.config import AgentConfig, load_agent_config
from agents.enforcement.enforcer import Enforcer
from agents.enforcement.plan import StepKind
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from controlplane.api.v1 import agent_pb2, common_pb2

logger = logging.getLogger(__name__)
_PREFILL_ONLY = StepKind.PREFILL_ONLY
_DECODE_ONLY = StepKind.DECODE_ONLY
_REPORT_EVERY_STEPS = 512
_HOOK_SAMPLES = 4096


def _vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except ImportError:  # pragma: no cover - the adapter runs inside vLLM
        return "unknown"


class AgentRuntime:
    """Per-engine agent state; lives in the EngineCore process, driven by the scheduler thread."""

    def __init__(self, scheduler: Any, config: AgentConfig, *, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self._config = config
        self._start_budget_tokens = int(scheduler.max_num_scheduled_tokens)
        self._max_num_seqs = int(scheduler.max_num_running_reqs)
        self._block_size = int(scheduler.block_size)
        block_pool = scheduler.kv_cache_manager.block_pool
        self._block_pool = block_pool
        # num_gpu_blocks includes the null block.
        self.kv_capacity_tokens = max(0, int(block_pool.num_gpu_blocks) - 1) * self._block_size
        self.enforcer = Enforcer(max_num_seqs=self._max_num_seqs, max_num_batched_tokens=self._start_budget_tokens)
        self.recorder = TelemetryRecorder(capacity=config.buffer_events)
        # Guards the enforcer's held decision: the link thread applies and refreshes it, the scheduler
        # thread expires it. Held for microseconds; the scheduler takes it only when an expiry is due.
        self._decision_lock = threading.Lock()
        self._pending_steps: collections.deque[tuple[int, int, float]] = collections.deque()
        self._last_update_s = 0.0
        self._prompt_tokens_ema = 0.0
        self._aborted_status: Any = None
        self.num_steps = 0
        self.hook_time_s = 0.0
        # Per-step hook time of the last _HOOK_SAMPLES steps (the mean alone is inflated by the rare steps
        # where another thread held the GIL while a hook ran).
        self._step_hook_s = 0.0
        self._hook_samples_s = [0.0] * _HOOK_SAMPLES
        self.num_scheduled_requests = 0
        self.num_expired = 0
        self.num_applied = 0
        self.num_rejected = 0
        self._report_path = Path(env["CP_AGENT_REPORT"]) if env.get("CP_AGENT_REPORT") else None
        trace = self._report_path is not None and env.get("CP_STEP_TRACE", "") not in ("", "0")
        self._step_trace: list[dict[str, Any]] | None = [] if trace else None
        self._trace_awaiting_duration: collections.deque[dict[str, Any]] = collections.deque()
        model_config = scheduler.vllm_config.model_config
        hello = agent_pb2.Hello(
            engine_id=config.engine_id,
            pool=common_pb2.Pool(model=config.pool_model, accelerator=config.pool_accelerator),
            vllm_version=_vllm_version(), agent_version=__version__,
            limits=agent_pb2.EngineLimits(
                max_num_seqs=self._max_num_seqs, max_num_batched_tokens=self._start_budget_tokens,
                kv_capacity_tokens=self.kv_capacity_tokens, block_size_tokens=self._block_size,
                max_model_len_tokens=int(model_config.max_model_len)),
        )
        self.link = ControllerLink(config, hello=hello, recorder=self.recorder, on_decision=self._on_decision)
        self.link.start()
        logger.info("control-plane agent %s on for engine %s (pool %s|%s), controller %s", __version__,
                    config.engine_id, config.pool_model, config.pool_accelerator, config.controller_address)

    @classmethod
    def create(cls, scheduler: Any) -> AgentRuntime | None:
        """The runtime, or None when CP_CONTROLLER_ADDRESS is unset (stock engine).

        Raises:
            AgentConfigError: the environment is malformed (the engine refuses to start with a clear
                message rather than run half-configured).
        """
        vllm_config = scheduler.vllm_config
        model_config = vllm_config.model_config
        served = getattr(model_config, "served_model_name", None) or model_config.model
        if isinstance(served, (list, tuple)):
            served = served[0]
        config = load_agent_config(default_model=str(served), default_accelerator=_accelerator_name())
        if config is None:
            return None
        return cls(scheduler, config)

    def _on_decision(self, decision: common_pb2.Decision, now_s: float) -> tuple[bool, str]:
        """Link thread: validate and hold a decision for the next step boundary; the verdict is ACKed."""
        with self._decision_lock:
            applied, reason = self.enforcer.apply(decision, now_s=now_s)
            self.enforcer.touch(now_s)
        if applied:
            self.num_applied += 1
        else:
            self.num_rejected += 1
            logger.warning("decision %d rejected: %s", decision.version, reason)
        return applied, reason

    # ---- hooks (scheduler thread) ----

    def before_schedule(self, s: Any) -> bool:
        """Expire a stale decision, plan this step (installing a newly held decision) and set the knobs.

        Returns True for a decode-only step."""
        started = time.perf_counter()
        now_s = time.monotonic()
        enforcer = self.enforcer
        ttl_cap_s = self._config.decision_ttl_s
        silent = ttl_cap_s > 0 and now_s - self.link.last_heard_s > ttl_cap_s
        if silent or now_s >= enforcer.expires_at_s:
            with self._decision_lock:
                dropped = enforcer.expire(math.inf if silent else now_s)
            if dropped:
                self.num_expired += 1
                logger.warning("decision expired without a controller; back to stock scheduling")
        running = s.running
        num_running = len(running)
        inflight = s._inflight_prefills
        num_prefills = len(inflight)
        largest_remaining = 0
        for request in inflight:
            remaining = request.num_prompt_tokens - request.num_computed_tokens
            if remaining > largest_remaining:
                largest_remaining = remaining
        num_waiting = len(s.waiting)
        free_kv_tokens = self._block_pool.get_num_free_blocks() * self._block_size
        plan = enforcer.plan_step(
            num_running=num_running, num_running_prefills=num_prefills,
            num_running_decodes=num_running - num_prefills, num_waiting=num_waiting,
            free_kv_tokens=free_kv_tokens,
            kv_tokens_per_new_request=int(self._prompt_tokens_ema) + self._block_size,
            largest_remaining_prefill_tokens=largest_remaining,
        )
        s.max_num_scheduled_tokens = plan.token_budget_tokens
        s.max_num_active_reqs = plan.max_num_active_reqs
        kind = plan.kind
        if kind is _PREFILL_ONLY:
            skip_until = s.current_step + 2
            for request in running:
                if not request.is_prefill_chunk and request.next_decode_eligible_step < skip_until:
                    request.next_decode_eligible_step = skip_until
        elif kind is _DECODE_ONLY:
            s.prefill_capacity_bound = False
        self.recorder.set_gauges(self.kv_capacity_tokens - free_kv_tokens, self.kv_capacity_tokens, num_prefills,
                                 num_running - num_prefills, num_waiting, largest_remaining)
        self._step_hook_s = time.perf_counter() - started
        return kind is _DECODE_ONLY

    def after_schedule(self, s: Any, output: Any) -> None:
        """Record the step's composition (a single-token entry counts as a decode)."""
        started = time.perf_counter()
        counts = output.num_scheduled_tokens
        num_decodes = list(counts.values()).count(1)
        total = output.total_num_scheduled_tokens
        self._pending_steps.append((total - num_decodes, num_decodes, started))
        preempted = output.preempted_req_ids
        if preempted:
            self.recorder.add_preemptions(len(preempted))
        self.enforcer.observe_step(num_scheduled_tokens=total)
        self.num_scheduled_requests += len(counts)
        self._step_hook_s += time.perf_counter() - started
        if self._step_trace is not None:  # audit mode, outside the measured hook time
            self._trace_step(s, output)

    def _trace_step(self, s: Any, output: Any) -> None:
        """Audit record of one step with an exact prefill/decode split (CP_STEP_TRACE only: O(batch)).

        A scheduled request decodes when it had computed its whole prompt before this step; new and
        resumed requests, and prompt chunks, are prefill work. `prefill_attention_pairs` counts the causal
        query-key pairs of the prefill chunks: a chunk of c tokens after p computed ones attends
        c·p + c·(c+1)/2 pairs (the attention work that grows with the prefix, not with the chunk alone).
        """
        plan = self.enforcer.last_plan
        new_ids = {r.req_id for r in output.scheduled_new_reqs}
        prefill_tokens = decode_tokens = num_prefill_reqs = num_decode_reqs = decode_context_tokens = 0
        prefill_attention_pairs = 0
        for req_id, num_tokens in output.num_scheduled_tokens.items():
            request = s.requests.get(req_id)
            computed_before = request.num_computed_tokens - num_tokens if request is not None else 0
            if req_id not in new_ids and request is not None and computed_before >= request.num_prompt_tokens:
                decode_tokens += num_tokens
                num_decode_reqs += 1
                decode_context_tokens += computed_before
            else:
                prefill_tokens += num_tokens
                num_prefill_reqs += 1
                prefill_attention_pairs += num_tokens * max(0, computed_before) + num_tokens * (num_tokens + 1) // 2
        entry = {
            "step": self.num_steps, "plan": plan.kind.value if plan else "stock",
            "mode": self.enforcer.active_policy.mode.value, "budget_tokens": plan.token_budget_tokens if plan else 0,
            "n_cap": plan.num_seqs_cap if plan else 0, "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens, "num_prefill_reqs": num_prefill_reqs, "num_decode_reqs": num_decode_reqs,
            "num_running": len(s.running), "num_waiting": len(s.waiting),
            "total_tokens": output.total_num_scheduled_tokens,
            "resumed": len(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ()),
            "preempted": len(output.preempted_req_ids or ()),
            "decode_requests": num_decode_reqs, "decode_context_tokens": decode_context_tokens,
            "prefill_attention_pairs": prefill_attention_pairs, "duration_s": None,
        }
        self._step_trace.append(entry)
        self._trace_awaiting_duration.append(entry)

    def after_update(self, output: Any) -> None:
        """Close the step: its duration runs from schedule() returning (or the previous update, when the
        engine schedules ahead) to this update."""
        now = time.perf_counter()
        if self._pending_steps:
            prefill, decode, scheduled_at = self._pending_steps.popleft()
            duration_s = now - max(scheduled_at, self._last_update_s)
            if prefill + decode > 0:
                self.recorder.record_step(prefill, decode, decode, duration_s)
            if self._trace_awaiting_duration:
                self._trace_awaiting_duration.popleft()["duration_s"] = duration_s
        self._last_update_s = now
        step_hook_s = self._step_hook_s + time.perf_counter() - now
        self.hook_time_s += step_hook_s
        self._hook_samples_s[self.num_steps % _HOOK_SAMPLES] = step_hook_s
        self.num_steps += 1
        if self._report_path is not None and self.num_steps % _REPORT_EVERY_STEPS == 0:
            self.write_report()

    def record_finish(self, request: Any) -> None:
        """A request left the engine (finished, stopped, aborted or failed)."""
        if self._aborted_status is None:
            from vllm.v1.request import RequestStatus

            self._aborted_status = RequestStatus.FINISHED_ABORTED
        aborted = request.status == self._aborted_status
        prompt_tokens = request.num_prompt_tokens
        self.recorder.record_completion(prompt_tokens, request.num_output_tokens, time.time(), aborted)
        if not aborted:
            self._prompt_tokens_ema += 0.05 * (prompt_tokens - self._prompt_tokens_ema)

    def write_report(self) -> None:
        """Write the agent's counters (and, with CP_STEP_TRACE=1, every step) to CP_AGENT_REPORT."""
        if self._report_path is None:
            return
        samples = sorted(self._hook_samples_s[: min(self.num_steps, _HOOK_SAMPLES)])
        report = {
            "engine_id": self._config.engine_id, "num_steps": self.num_steps, "hook_time_s": self.hook_time_s,
            "hook_us_median": 1e6 * _quantile(samples, 0.5), "hook_us_p90": 1e6 * _quantile(samples, 0.9),
            "num_scheduled_requests": self.num_scheduled_requests, "num_applied": self.num_applied,
            "num_rejected": self.num_rejected, "num_expired": self.num_expired,
            "decision_version": self.enforcer.version_floor, "mode": self.enforcer.active_policy.mode.value,
            "num_events_dropped": self.recorder.num_dropped, "link_reconnects": self.link.num_reconnects,
            "link_batch_cpu_s": self.link.cpu_time_s, "num_preemptions": self.recorder.num_preemptions,
            "steps": self._step_trace,
        }
        tmp = self._report_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(self._report_path)

    def close(self) -> None:
        self.write_report()
        self.link.stop(timeout_s=2.0)


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[int(q * (len(sorted_values) - 1))] if sorted_values else 0.0


def _accelerator_name() -> str:
    try:
        from vllm.platforms import current_platform

        return str(current_platform.get_device_name()) or current_platform.device_type
    except Exception:  # pragma: no cover - falls back to the platform type
        return "unknown"
