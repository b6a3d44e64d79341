"""One check, at engine start, of every vLLM internal the agent reads or writes.

The agent drives vLLM 0.32 through attributes and signatures that are not a public interface (the scheduler's
`_inflight_prefills`, `prefill_capacity_bound`, `max_num_active_reqs`, `schedule(throttle_prefills=...)`, the
requests' `next_decode_eligible_step`, …). `probe_scheduler` checks them all once, on the constructed
scheduler and on vLLM's classes, and returns what is missing or changed; the runtime then refuses to attach
(one ERROR naming every problem) and the engine runs stock vLLM scheduling for its whole life, instead of an
AttributeError inside vLLM's scheduler thread some steps later.

It must not change the scheduler, and it must not raise for any object (a problem is reported, not raised).
Names are checked on the class vLLM would have used (the one below the agent's mixin), so a scheduler
subclass that hides or renames one is caught as well.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

# (dotted attribute path on the scheduler instance, expected type(s), what the agent does with it)
_INSTANCE_ATTRIBUTES: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("running", list, "reads the running queue"),
    ("requests", dict, "looks up scheduled requests"),
    ("_inflight_prefills", (set, frozenset), "counts the running prefills"),
    ("max_num_running_reqs", int, "reads the engine's slots"),
    ("max_num_active_reqs", int, "sets the admission cap N"),
    ("max_num_scheduled_tokens", int, "sets the step's token budget"),
    ("prefill_capacity_bound", bool, "enables decode-only steps"),
    ("current_step", int, "defers decodes in prefill-only steps"),
    ("block_size", int, "converts KV blocks to tokens"),
    ("kv_cache_manager.block_pool.num_gpu_blocks", int, "reads the KV capacity"),
    ("vllm_config.model_config.max_model_len", int, "reports the engine's limits"),
)
_CALLABLE_ATTRIBUTES = (
    ("waiting.__len__", "counts the waiting queue"),
    ("kv_cache_manager.block_pool.get_num_free_blocks", "reads the free KV"),
)
# (method of the vLLM scheduler class, parameter names it must take after self)
_METHODS = (
    ("schedule", ("throttle_prefills",)),
    ("update_from_output", ("scheduler_output", "model_runner_output")),
    ("_free_request", ("request", "delay_free_blocks")),
    ("shutdown", ()),
)
_REQUEST_ATTRIBUTES = ("request_id", "status", "num_prompt_tokens", "num_computed_tokens", "num_output_tokens",
                       "is_prefill_chunk", "next_decode_eligible_step")
_OUTPUT_FIELDS = ("num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_new_reqs",
                  "scheduled_cached_reqs", "preempted_req_ids")


def probe_scheduler(scheduler: Any, *, vllm_class: type) -> list[str]:
    """Every vLLM internal the agent needs that `scheduler` (or vLLM) lacks or changed; [] when all are there.

    Args:
        scheduler: the constructed scheduler (after vLLM's `__init__`).
        vllm_class: the vLLM scheduler class whose methods the agent wraps (the class after the agent's mixin
            in the MRO).

    Returns:
        Human-readable problems, one per missing or changed item, each naming it. Never raises.
    """
    problems: list[str] = []
    for path, expected, use in _INSTANCE_ATTRIBUTES:
        found, value = _resolve(scheduler, path)
        if not found:
            problems.append(f"scheduler.{path} is missing (the agent {use})")
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            names = "/".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
            problems.append(f"scheduler.{path} is a {type(value).__name__}, expected {names} (the agent {use})")
    for path, use in _CALLABLE_ATTRIBUTES:
        found, value = _resolve(scheduler, path)
        if not found or not callable(value):
            problems.append(f"scheduler.{path} is missing or not callable (the agent {use})")
    for name, parameters in _METHODS:
        problems.extend(_method_problems(vllm_class, name, parameters))
    problems.extend(_module_problems())
    return problems


def _resolve(obj: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # any failure of a property counts as missing
            return False, None
    return True, obj


def _method_problems(cls: type, name: str, parameters: tuple[str, ...]) -> list[str]:
    method: Callable[..., Any] | None = getattr(cls, name, None)
    if method is None or not callable(method):
        return [f"{cls.__name__}.{name}() is missing"]
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return [f"{cls.__name__}.{name}() has no readable signature"]
    names = [p.name for p in signature.parameters.values()][1:]  # after self
    missing = [p for p in parameters if p not in names]
    if missing or names[: len(parameters)] != list(parameters):
        expected = ", ".join(("self", *parameters))
        return [f"{cls.__name__}.{name}() takes ({', '.join(['self', *names])}), expected ({expected})"]
    return []


def _module_problems() -> list[str]:
    problems: list[str] = []
    try:
        import dataclasses

        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
        from vllm.v1.request import Request, RequestStatus
    except Exception as exc:  # an import moved
        return [f"vLLM module layout changed: {exc}"]
    init_names = set(getattr(getattr(Request.__init__, "__code__", None), "co_names", ()))
    for name in _REQUEST_ATTRIBUTES:
        if name not in init_names and not hasattr(Request, name):
            problems.append(f"Request.{name} is missing")
    if not hasattr(RequestStatus, "FINISHED_ABORTED"):
        problems.append("RequestStatus.FINISHED_ABORTED is missing")
    for cls, fields in ((SchedulerOutput, _OUTPUT_FIELDS), (CachedRequestData, ("resumed_req_ids",)),
                        (NewRequestData, ("req_id",))):
        present = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set(dir(cls))
        problems.extend(f"{cls.__name__}.{name} is missing" for name in fields if name not in present)
    return problems
