"""vLLM scheduler classes carrying the control-plane agent.

Attach with `--scheduler-cls agents.vllm.ControlledScheduler` (or `LLM(..., scheduler_cls=...)`).
`ControlledScheduler` picks, at construction, the class vLLM itself would have used: a subclass of
`AsyncScheduler` when async scheduling is on, of `Scheduler` otherwise, so async scheduling is kept.
`with_agent(cls)` puts the agent over any other vLLM scheduler class (a custom subclass of `Scheduler`).
Without CP_CONTROLLER_ADDRESS the hooks are skipped and the engine is stock vLLM.

Failure containment: the vLLM internals the agent uses are probed once at construction (a missing or changed
one: one ERROR, no agent hook, stock scheduling for the engine's life; the verdict is still reported to the
controller by a `StockReporter`, which never touches the scheduler). Any exception raised by the agent's own
code in a per-step hook is logged once, the agent switches the engine to stock scheduling for good
(`AgentRuntime.disable`), and vLLM's step goes on as stock: nothing of ours propagates into vLLM. vLLM's own
exceptions pass through untouched.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from agents.vllm.probe import ProbeVerdict
from agents.vllm.runtime import AgentRuntime
from agents.vllm.stock import StockReporter

logger = logging.getLogger(__name__)


class _AgentHooks:
    """Mixin placed before vLLM's scheduler class: the agent's hooks around schedule and update.

    A scheduler whose `__init__` never ran (built with `object.__new__` and its attributes set by hand, as
    some of vLLM's own tests do) has no agent and behaves as stock vLLM: `_cp` defaults to None on the class.
    """

    _cp: AgentRuntime | None = None
    _cp_stock: StockReporter | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cp = None
        self._cp_stock = None
        attached = AgentRuntime.create(self, vllm_class=_vllm_class(type(self)))
        if isinstance(attached, StockReporter):
            self._cp_stock = attached
        else:
            self._cp = attached

    @property
    def cp_agent(self) -> AgentRuntime | None:
        """The agent attached to this scheduler; None when it is off (stock vLLM) or was switched off."""
        return self._cp

    @property
    def cp_stock_reporter(self) -> StockReporter | None:
        """The report-only agent of an engine whose vLLM failed the probe (None otherwise)."""
        return self._cp_stock

    @property
    def cp_verdict(self) -> ProbeVerdict | None:
        """The probe's verdict of this engine's vLLM; None when no agent was configured (or it was switched
        off after a fault)."""
        if self._cp is not None:
            return self._cp.verdict
        return self._cp_stock.verdict if self._cp_stock is not None else None

    def _cp_failed(self, where: str, exc: BaseException) -> None:
        """The agent's code raised in a hook: log once, go stock for good (never raises)."""
        runtime, self._cp = self._cp, None
        logger.error("control-plane agent failed in %s (%s: %s); this engine runs stock vLLM scheduling from now on",
                     where, type(exc).__name__, exc, exc_info=exc)
        if runtime is not None:
            try:
                runtime.disable(self, f"{where}: {type(exc).__name__}: {exc}")
            except Exception:
                logger.exception("control-plane agent could not shut down cleanly")

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        runtime = self._cp
        if runtime is None:
            return super().schedule(*args, **kwargs)
        try:
            decode_only = runtime.before_schedule(self)
        except Exception as exc:
            self._cp_failed("before_schedule", exc)
            return super().schedule(*args, **kwargs)
        if decode_only:
            if args:
                args = (True, *args[1:])
            else:
                kwargs["throttle_prefills"] = True
        output = super().schedule(*args, **kwargs)
        try:
            runtime.after_schedule(self, output)
        except Exception as exc:
            self._cp_failed("after_schedule", exc)
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        runtime = self._cp
        if runtime is not None:
            try:
                runtime.after_update(scheduler_output)
            except Exception as exc:
                self._cp_failed("after_update", exc)
        return outputs

    def _free_request(self, request: Any, delay_free_blocks: bool = False) -> Any:
        runtime = self._cp
        if runtime is not None:
            try:
                runtime.record_finish(request)
            except Exception as exc:
                self._cp_failed("record_finish", exc)
        return super()._free_request(request, delay_free_blocks)

    def shutdown(self) -> None:
        runtime, self._cp = self._cp, None
        reporter, self._cp_stock = self._cp_stock, None
        for part in (runtime, reporter):
            if part is not None:
                try:
                    part.close()
                except Exception:
                    logger.exception("control-plane agent could not shut down cleanly")
        super().shutdown()


def _vllm_class(cls: type) -> type:
    """The class after the agent's mixin in `cls`'s MRO: the vLLM scheduler class whose methods are wrapped."""
    mro = cls.__mro__
    return mro[mro.index(_AgentHooks) + 1]


@functools.cache
def with_agent(scheduler_cls: type) -> type:
    """A scheduler class that is `scheduler_cls` with the agent's hooks (one class per base, cached).

    Args:
        scheduler_cls: vLLM's `Scheduler`, `AsyncScheduler` or a subclass of either.

    Raises:
        TypeError: scheduler_cls is not a subclass of vLLM's Scheduler.
    """
    if not (isinstance(scheduler_cls, type) and issubclass(scheduler_cls, Scheduler)):
        raise TypeError(f"with_agent needs a subclass of vllm's Scheduler, got {scheduler_cls!r}")
    if issubclass(scheduler_cls, _AgentHooks):
        return scheduler_cls
    return type(f"Controlled{scheduler_cls.__name__}", (_AgentHooks, scheduler_cls),
                {"__doc__": f"The control-plane agent over {scheduler_cls.__qualname__}.",
                 "__module__": __name__})


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
