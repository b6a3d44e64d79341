"""vLLM scheduler classes carrying the control-plane agent.

Attach with `--scheduler-cls agents.vllm.ControlledScheduler` (or `LLM(..., scheduler_cls=...)`).
`ControlledScheduler` picks, at construction, the class vLLM itself would have used: a subclass of
`AsyncScheduler` when async scheduling is on, of `Scheduler` otherwise, so async scheduling is kept.
Without CP_CONTROLLER_ADDRESS the hooks are skipped and the engine is stock vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from agents.vllm.runtime import AgentRuntime


class _AgentHooks:
    """Mixin placed before vLLM's scheduler class: the agent's hooks around schedule and update."""

    _cp: AgentRuntime | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cp = AgentRuntime.create(self)

    def schedule(self, throttle_prefills: bool = False) -> Any:
        runtime = self._cp
        if runtime is None:
            return super().schedule(throttle_prefills)
        decode_only = runtime.before_schedule(self)
        output = super().schedule(throttle_prefills or decode_only)
        runtime.after_schedule(self, output)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if self._cp is not None:
            self._cp.after_update(scheduler_output)
        return outputs

    def _free_request(self, request: Any, delay_free_blocks: bool = False) -> Any:
        if self._cp is not None:
            self._cp.record_finish(request)
        return super()._free_request(request, delay_free_blocks)

    def shutdown(self) -> None:
        if self._cp is not None:
            self._cp.close()
        super().shutdown()


class ControlledSyncScheduler(_AgentHooks, Scheduler):
    """The agent over vLLM's synchronous Scheduler."""


class ControlledAsyncScheduler(_AgentHooks, AsyncScheduler):
    """The agent over vLLM's AsyncScheduler (keeps async scheduling)."""


class ControlledScheduler:
    """Entry class for `--scheduler-cls`: builds the sync or async variant from the engine's config."""

    def __new__(cls, vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        target = ControlledAsyncScheduler if vllm_config.scheduler_config.async_scheduling else \
            ControlledSyncScheduler
        return target(vllm_config, *args, **kwargs)
