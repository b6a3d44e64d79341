"""The agent inside one vLLM engine: reads scheduler state, applies the plan, records telemetry.

`AgentRuntime` is created by the scheduler subclass (agents/vllm/scheduler.py) and called from the
scheduler thread only: `before_schedule` (apply a newly received decision at the step boundary, plan
the step, set the scheduler's knobs), `after_schedule` (step composition), `after_update` (step
duration) and `record_finish` (finished requests). The network lives in the link thread, the report
file in its own thread (agents/report.py).

Knobs (docs/ARCHITECTURE.md, "The agent"): `max_num_scheduled_tokens` (only lowered), `max_num_active_reqs`
(admission gate; never above the engine's own start-up value, so `--max-num-active-seqs` holds under every
decision). They are written only while a decision steers them: before the first decision, and after one
expires (its knobs handed back at their start-up values, once), the engine's knobs are its own and are not
touched, whatever another tool sets them to. Decode-only steps run through `schedule(throttle_prefills=True)` with
`prefill_capacity_bound = False`, prefill-only steps by pushing `next_decode_eligible_step` of the
decoding requests past this step. Every internal is checked once at start (`agents.vllm.probe`); when one
is missing the runtime is not created, the engine is stock for its whole life, and the agent only reports its
verdict to the controller (`agents.vllm.stock`).

Step composition (what the controller's cost fit gets): a scheduled request is decoding when its prompt was
fully computed before the step, whatever its token count (speculative tokens included); new requests and
prompt chunks are prefill work. The hook stays O(1) + O(prefills): only the requests that can be prefilling
are looked at (new, resumed, and the running prefills snapshotted at the step boundary from
`_inflight_prefills`); every other scheduled request has computed its prompt (vLLM drops a request from
`_inflight_prefills` once its prompt is computed), so decode tokens are the step's total minus the prefill
tokens.

Running-length histogram: at most once per batch interval (a clock check per step), the hook reads the
running requests' output lengths (O(running)) and hands the histogram to the link through the recorder.
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import threading
import time
import uuid
from typing import Any

from agents import __version__
from agents.config import (
    AgentConfig,
    engine_data_parallel_rank,
    engine_kv_role,
    load_agent_config,
    pool_model_default,
)
from agents.enforcement.enforcer import Enforcer
from agents.enforcement.plan import StepKind
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from agents.report import ReportWriter
from agents.running_lengths import running_length_entries
from agents.vllm.probe import ProbeVerdict, probe_scheduler, vllm_version
from agents.vllm.stock import StockReporter, agent_hello
from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.protocol import MODE_TO_PROTO, pool_key_of_message

logger = logging.getLogger(__name__)
_PREFILL_ONLY = StepKind.PREFILL_ONLY
_DECODE_ONLY = StepKind.DECODE_ONLY
_HOOK_SAMPLES = 4096
_NO_REQUESTS: tuple[Any, ...] = ()
_NO_IDS: frozenset[str] = frozenset()
_PASSTHROUGH = common_pb2.MODE_PASSTHROUGH
# Admission stamps kept at most (one per request in the engine; finished requests drop theirs).
_MAX_ADMITTED = 1 << 20


class AgentRuntime:
    """Per-engine agent state; lives in the EngineCore process, driven by the scheduler thread."""

    def __init__(self, scheduler: Any, config: AgentConfig, *, verdict: ProbeVerdict | None = None) -> None:
        """Read the engine's start-up limits once, start the link (and the report timer when configured).

        Args:
            scheduler: the constructed vLLM scheduler (already probed, see `create`).
            config: the agent's validated configuration.
            verdict: the probe's verdict, a full one (sent in the Hello; default: full, this vLLM's version).
        """
        self._config = config
        self.instance_id = uuid.uuid4().hex
        self.started_at_s = time.time()
        self._start_budget_tokens = int(scheduler.max_num_scheduled_tokens)
        self._max_num_seqs = int(scheduler.max_num_running_reqs)
        # The engine's own admission cap (--max-num-active-seqs), read once: no plan ever admits beyond it.
        self._start_active_reqs_raw = int(scheduler.max_num_active_reqs)
        self._start_active_reqs = max(1, min(self._start_active_reqs_raw, self._max_num_seqs))
        self._block_size = int(scheduler.block_size)
        block_pool = scheduler.kv_cache_manager.block_pool
        self._block_pool = block_pool
        # num_gpu_blocks includes the null block.
        self.kv_capacity_tokens = max(0, int(block_pool.num_gpu_blocks) - 1) * self._block_size
        self.enforcer = Enforcer(max_num_seqs=self._max_num_seqs, max_num_batched_tokens=self._start_budget_tokens,
                                 max_num_active_reqs=self._start_active_reqs)
        self.recorder = TelemetryRecorder(capacity=config.buffer_events)
        # Guards the enforcer's held decision: the link thread applies and refreshes it, the scheduler
        # thread expires it. Held for microseconds; the scheduler takes it only when an expiry is due.
        self._decision_lock = threading.Lock()
        # (prefill tokens, decode tokens, decode requests, scheduled at, wire mode, budget tokens) per step
        self._pending_steps: collections.deque[tuple[int, int, int, float, int, int]] = collections.deque()
        self._prefilling: Any = _NO_REQUESTS  # the running prefills at this step's boundary
        self._last_update_s = 0.0
        self._next_running_lengths_s = 0.0
        self._prompt_tokens_ema = 0.0
        self._knobs_set = False  # a decision's knobs are in the scheduler (restored when it ends)
        self._aborted_status: Any = None
        # request id → wall-clock time it was first scheduled (dropped when it leaves); a request already
        # running when the agent started counts as admitted then.
        self._admitted_s: dict[str, float] = {}
        # Requests scheduled that have produced no output token yet (request id → request), and the wall-clock
        # time of the first output token of those that have (both dropped when the request leaves).
        self._awaiting_first_token: dict[str, Any] = {}
        self._first_token_s: dict[str, float] = {}
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
        self.disabled_reason = ""
        self._step_trace: list[dict[str, Any]] | None = [] if config.step_trace else None
        self._trace_awaiting_duration: collections.deque[dict[str, Any]] = collections.deque()
        model_config = scheduler.vllm_config.model_config
        self.verdict = verdict or ProbeVerdict(vllm_version=vllm_version())
        self.kv_role = engine_kv_role(getattr(scheduler.vllm_config, "kv_transfer_config", None))
        hello = agent_hello(
            config,
            # max_num_seqs: the admission slots the controller may fill (the engine's own active cap).
            agent_pb2.EngineLimits(
                max_num_seqs=self._start_active_reqs, max_num_batched_tokens=self._start_budget_tokens,
                kv_capacity_tokens=self.kv_capacity_tokens, block_size_tokens=self._block_size,
                max_model_len_tokens=int(model_config.max_model_len)),
            self.verdict, instance_id=self.instance_id, started_at_s=self.started_at_s, kv_role=self.kv_role)
        self.link = ControllerLink(config, hello=hello, recorder=self.recorder, on_decision=self._on_decision)
        self._report: ReportWriter | None = None
        if config.report_path is not None:
            self._report = ReportWriter(config.report_path, interval_s=config.report_interval_s,
                                        snapshot=self.report)
        self.link.start()
        if self._report is not None:
            self._report.start()
            atexit.register(self._report.write)
        logger.info("control-plane agent %s on for engine %s (pool %s, instance %s), controller %s", __version__,
                    config.engine_id, pool_key_of_message(hello.pool), self.instance_id, config.controller_address)

    @classmethod
    def create(cls, scheduler: Any, *, vllm_class: type | None = None) -> AgentRuntime | StockReporter | None:
        """The runtime when the probe's verdict is full; None when CP_CONTROLLER_ADDRESS is unset (stock
        engine). When a vLLM internal the agent needs is missing or changed: one ERROR naming every problem,
        the engine stays stock for its whole life, and the result is a `StockReporter` (the verdict reported
        to the controller, nothing steered) or None when the engine's limits cannot be read.

        Args:
            scheduler: the constructed scheduler.
            vllm_class: the vLLM scheduler class the agent's hooks wrap (default: the scheduler's class).

        Raises:
            AgentConfigError: the environment is malformed (the engine refuses to start with a clear
                message rather than run half-configured).
        """
        vllm_config = scheduler.vllm_config
        model_config = vllm_config.model_config
        config = load_agent_config(
            default_model=pool_model_default(getattr(model_config, "served_model_name", None), model_config.model),
            default_accelerator=_accelerator_name(), data_parallel_rank=_data_parallel_rank(vllm_config))
        if config is None:
            return None
        verdict = probe_scheduler(scheduler, vllm_class=vllm_class or type(scheduler))
        if not verdict.full:
            reason = "vLLM internals missing or changed: " + verdict.detail
            logger.error("control-plane agent OFF for engine %s (vLLM %s, agent %s): %s. This engine runs stock "
                         "vLLM scheduling for its whole life; the agent only reports it to the controller.",
                         config.engine_id, verdict.vllm_version, __version__, reason)
            reporter = StockReporter.create(scheduler, config, verdict)
            if config.report_path is not None:
                ReportWriter(config.report_path, interval_s=config.report_interval_s, snapshot=lambda: {
                    "engine_id": config.engine_id, "agent_state": "stock", "disabled_reason": reason,
                    "support": {"level": verdict.level, "vllm_version": verdict.vllm_version,
                                "missing": list(verdict.missing)},
                    "reporting_to_controller": reporter is not None, "written_at_s": time.time()}).write()
            return reporter
        return cls(scheduler, config, verdict=verdict)

    def _on_decision(self, decision: common_pb2.Decision, now_s: float) -> tuple[bool, str]:
        """Link thread: validate and hold a decision for the next step boundary; the verdict is ACKed."""
        if self.disabled_reason:
            return False, "agent_disabled"
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
        largest_remaining = 0
        if inflight:
            prefilling = list(inflight)
            for request in prefilling:
                remaining = request.num_prompt_tokens - request.num_computed_tokens
                if remaining > largest_remaining:
                    largest_remaining = remaining
        else:
            prefilling = _NO_REQUESTS
        self._prefilling = prefilling
        num_prefills = len(prefilling)
        num_waiting = len(s.waiting)
        free_kv_tokens = self._block_pool.get_num_free_blocks() * self._block_size
        plan = enforcer.plan_step(
            num_running=num_running, num_running_prefills=num_prefills,
            num_running_decodes=num_running - num_prefills, num_waiting=num_waiting,
            free_kv_tokens=free_kv_tokens,
            kv_tokens_per_new_request=int(self._prompt_tokens_ema) + self._block_size,
            largest_remaining_prefill_tokens=largest_remaining,
        )
        if enforcer.steers:
            s.max_num_scheduled_tokens = plan.token_budget_tokens
            s.max_num_active_reqs = plan.max_num_active_reqs
            self._knobs_set = True
        elif self._knobs_set:  # back to stock: the engine's own values, once; then its knobs are left alone
            self._restore_knobs(s)
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
        if now_s >= self._next_running_lengths_s:
            self._next_running_lengths_s = now_s + self._config.batch_interval_s
            admitted, since_s = self._admitted_s, self.started_at_s
            self.recorder.set_running_lengths(*running_length_entries(
                [r.num_output_tokens for r in running], [admitted.get(r.request_id, since_s) for r in running]))
        self._step_hook_s = time.perf_counter() - started
        return kind is _DECODE_ONLY

    def after_schedule(self, s: Any, output: Any) -> None:
        """Record the step's composition: prefill tokens of the requests that were prefilling, the rest decode."""
        started = time.perf_counter()
        counts = output.num_scheduled_tokens
        total = output.total_num_scheduled_tokens
        new_reqs = output.scheduled_new_reqs
        prefill_tokens = 0
        for new in new_reqs:
            prefill_tokens += counts[new.req_id]
        num_prefill_reqs = len(new_reqs)
        if new_reqs:
            self._note_admitted(s, new_reqs)
        resumed = output.scheduled_cached_reqs.resumed_req_ids
        prefilling = self._prefilling
        if resumed or prefilling:
            requests = s.requests
            for req_id in resumed:
                num = counts.get(req_id, 0)
                request = requests.get(req_id)
                if num and (request is None or request.num_computed_tokens - num < request.num_prompt_tokens):
                    prefill_tokens += num
                    num_prefill_reqs += 1
            if prefilling:
                new_ids = {new.req_id for new in new_reqs} if new_reqs else _NO_IDS
                for request in prefilling:
                    req_id = request.request_id
                    num = counts.get(req_id, 0)
                    if (num and request.num_computed_tokens - num < request.num_prompt_tokens
                            and req_id not in new_ids and req_id not in resumed):
                        prefill_tokens += num
                        num_prefill_reqs += 1
        decode_tokens = total - prefill_tokens
        num_decode_reqs = len(counts) - num_prefill_reqs
        enforcer = self.enforcer
        mode = MODE_TO_PROTO[enforcer.active_policy.mode] if enforcer.steers else _PASSTHROUGH
        self._pending_steps.append((prefill_tokens, decode_tokens, num_decode_reqs, started, mode,
                                    s.max_num_scheduled_tokens))
        preempted = output.preempted_req_ids
        if preempted:
            self.recorder.add_preemptions(len(preempted))
        self.enforcer.observe_step(num_scheduled_tokens=total)
        self.num_scheduled_requests += len(counts)
        self._step_hook_s += time.perf_counter() - started
        if self._step_trace is not None:  # audit mode, outside the measured hook time
            self._trace_step(s, output, (prefill_tokens, decode_tokens, num_decode_reqs))

    def _trace_step(self, s: Any, output: Any, recorded: tuple[int, int, int]) -> None:
        """Audit record of one step with an exact prefill/decode split (CP_STEP_TRACE only: O(batch)).

        A scheduled request decodes when it had computed its whole prompt before this step; new requests
        and prompt chunks are prefill work. `recorded_*` are the hook's own figures (what the controller
        gets); they must equal the exact split. `prefill_attention_pairs` counts the causal query-key pairs
        of the prefill chunks: a chunk of c tokens after p computed ones attends c·p + c·(c+1)/2 pairs (the
        attention work that grows with the prefix, not with the chunk alone).
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
            "n_cap": plan.num_seqs_cap if plan else 0, "max_num_active_reqs": s.max_num_active_reqs,
            "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens, "num_prefill_reqs": num_prefill_reqs, "num_decode_reqs": num_decode_reqs,
            "num_running": len(s.running), "num_waiting": len(s.waiting),
            "total_tokens": output.total_num_scheduled_tokens,
            "resumed": len(getattr(output.scheduled_cached_reqs, "resumed_req_ids", ()) or ()),
            "preempted": len(output.preempted_req_ids or ()),
            "decode_requests": num_decode_reqs, "decode_context_tokens": decode_context_tokens,
            "prefill_attention_pairs": prefill_attention_pairs,
            "recorded_prefill_tokens": recorded[0], "recorded_decode_tokens": recorded[1],
            "recorded_decode_requests": recorded[2], "duration_s": None,
        }
        self._step_trace.append(entry)
        self._trace_awaiting_duration.append(entry)

    def after_update(self, output: Any) -> None:
        """Close the step: its duration runs from schedule() returning (or the previous update, when the
        engine schedules ahead) to this update."""
        now = time.perf_counter()
        if self._pending_steps:
            prefill, decode, decode_requests, scheduled_at, mode, budget = self._pending_steps.popleft()
            duration_s = now - max(scheduled_at, self._last_update_s)
            if prefill + decode > 0:
                self.recorder.record_step(prefill, decode, decode_requests, duration_s, mode, budget)
        if self._awaiting_first_token:
            self._note_first_tokens()
            if self._trace_awaiting_duration:
                self._trace_awaiting_duration.popleft()["duration_s"] = duration_s
        self._last_update_s = now
        step_hook_s = self._step_hook_s + time.perf_counter() - now
        self.hook_time_s += step_hook_s
        self._hook_samples_s[self.num_steps % _HOOK_SAMPLES] = step_hook_s
        self.num_steps += 1

    def _note_admitted(self, s: Any, new_reqs: Any) -> None:
        """Stamp the wall-clock time requests were first scheduled (a resumed request keeps its first), and
        watch them for their first output token."""
        admitted, awaiting = self._admitted_s, self._awaiting_first_token
        if len(admitted) >= _MAX_ADMITTED:  # requests that left unseen: never expected; bounded anyway
            logger.warning("%d admission stamps without a finish; dropped", len(admitted))
            admitted.clear()
            awaiting.clear()
            self._first_token_s.clear()
        wall_s = time.time()
        requests = s.requests
        first_token = self._first_token_s
        for new in new_reqs:
            req_id = new.req_id
            admitted.setdefault(req_id, wall_s)
            if req_id not in first_token and (request := requests.get(req_id)) is not None:
                awaiting[req_id] = request

    def _note_first_tokens(self) -> None:
        """Stamp the requests that produced their first output token in the step just updated (O(requests
        awaiting one): those scheduled and still prefilling)."""
        wall_s = time.time()
        awaiting, first_token = self._awaiting_first_token, self._first_token_s
        for req_id in [r for r, request in awaiting.items() if request.num_output_tokens > 0]:
            del awaiting[req_id]
            first_token[req_id] = wall_s

    def record_finish(self, request: Any) -> None:
        """A request left the engine (finished, stopped, aborted or failed)."""
        if self._aborted_status is None:
            from vllm.v1.request import RequestStatus

            self._aborted_status = RequestStatus.FINISHED_ABORTED
        aborted = request.status == self._aborted_status
        prompt_tokens = request.num_prompt_tokens
        req_id = request.request_id
        wall_s = time.time()
        admitted_s = self._admitted_s.pop(req_id, math.nan)
        self._awaiting_first_token.pop(req_id, None)
        num_output_tokens = request.num_output_tokens
        first_token_s = self._first_token_s.pop(req_id, wall_s if num_output_tokens > 0 else math.nan)
        arrival_s = getattr(request, "arrival_time", math.nan)
        self.recorder.record_completion(prompt_tokens, num_output_tokens, wall_s, aborted, admitted_s,
                                        arrival_s if isinstance(arrival_s, float) else math.nan, first_token_s)
        if not aborted:
            self._prompt_tokens_ema += 0.05 * (prompt_tokens - self._prompt_tokens_ema)

    # ---- failure, report, shutdown ----

    def disable(self, scheduler: Any, reason: str) -> None:
        """Switch this engine to stock scheduling for good (scheduler thread; never raises, never blocks).

        Restores the knobs the agent lowers (token budget, admission cap) to their start-up values, refuses
        further decisions, stops the link and writes the report with the reason. A pushed
        `next_decode_eligible_step` lapses by itself after one step.
        """
        self.disabled_reason = reason or "disabled"
        self._restore_knobs(scheduler)
        self.link.stop(timeout_s=0.0)
        if self._report is not None:
            self._report.stop(timeout_s=0.0)

    def _restore_knobs(self, scheduler: Any) -> None:
        """Hand the knobs a decision set (token budget, admission cap) back at their start-up values (never
        raises)."""
        self._knobs_set = False
        for name, value in (("max_num_scheduled_tokens", self._start_budget_tokens),
                            ("max_num_active_reqs", self._start_active_reqs_raw)):
            try:
                setattr(scheduler, name, value)
            except Exception:
                logger.exception("could not restore scheduler.%s", name)

    def report(self) -> dict[str, Any]:
        """The agent's counters as JSON-ready data (read by the report thread: plain reads and list copies)."""
        num_samples = min(self.num_steps, _HOOK_SAMPLES)
        samples = sorted(self._hook_samples_s[:num_samples])
        trace = self._step_trace
        return {
            "engine_id": self._config.engine_id, "instance_id": self.instance_id,
            "agent_state": "stock" if self.disabled_reason else "on", "disabled_reason": self.disabled_reason,
            "written_at_s": time.time(), "num_steps": self.num_steps, "hook_time_s": self.hook_time_s,
            "hook_us_median": 1e6 * _quantile(samples, 0.5), "hook_us_p90": 1e6 * _quantile(samples, 0.9),
            "num_scheduled_requests": self.num_scheduled_requests, "num_applied": self.num_applied,
            "num_rejected": self.num_rejected, "num_expired": self.num_expired,
            "decision_version": self.enforcer.version_floor, "mode": self.enforcer.active_policy.mode.value,
            "max_num_active_reqs_startup": self._start_active_reqs_raw,
            "num_events_dropped": self.recorder.num_dropped, "link_reconnects": self.link.num_reconnects,
            "link_batch_cpu_s": self.link.cpu_time_s, "num_preemptions": self.recorder.num_preemptions,
            "steps": list(trace) if trace is not None else None,
        }

    def close(self) -> None:
        """Engine shutdown: final report, link stopped."""
        if self._report is not None:
            atexit.unregister(self._report.write)
            self._report.stop()
        self.link.stop(timeout_s=2.0)


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[int(q * (len(sorted_values) - 1))] if sorted_values else 0.0


def _data_parallel_rank(vllm_config: Any) -> int | None:
    """The engine's data-parallel rank as `agents.config.engine_data_parallel_rank` reads vLLM's config."""
    parallel = getattr(vllm_config, "parallel_config", None)
    index = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
    return engine_data_parallel_rank(size=int(getattr(parallel, "data_parallel_size", 1) or 1), index=int(index or 0),
                                     master_port=int(getattr(parallel, "data_parallel_master_port", 0) or 0))


def _accelerator_name() -> str:
    try:
        from vllm.platforms import current_platform

        return str(current_platform.get_device_name()) or current_platform.device_type
    except Exception:  # pragma: no cover - falls back to the platform type
        return "unknown"
