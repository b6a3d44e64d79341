"""One check, at engine start, of every vLLM internal the agent reads or writes: the support verdict.

The agent drives vLLM 0.32 through attributes and signatures that are not a public interface (the scheduler's
`_inflight_prefills`, `prefill_capacity_bound`, `max_num_active_reqs`, `schedule(throttle_prefills=...)`, the
requests' `next_decode_eligible_step`, …). `INTERNALS` lists every one of them; `probe_scheduler` checks them
all once, on the constructed scheduler and on vLLM's classes, and returns a `ProbeVerdict`: the vLLM version,
the name of each internal missing or of another type (e.g. "Scheduler.max_num_active_reqs") and a sentence per
problem. The runtime attaches only on a full verdict; otherwise the engine runs stock vLLM scheduling for its
whole life (one ERROR naming every problem) and the agent only reports the verdict to the controller, instead
of an AttributeError inside vLLM's scheduler thread some steps later.

There is no degraded verdict: every internal is needed by everything the agent enforces (MB's token budget and
admission cap, EB's decode-only and prefill-only steps, the KV gate, and the step telemetry the controller
decides from), so a partial agent could enforce nothing it can vouch for. The wire's SUPPORT_LEVEL_DEGRADED is
never sent by this agent.

It must not change the scheduler, and it must not raise for any object (a problem is reported, not raised).
Names are checked on the class vLLM would have used (the one below the agent's mixin), so a scheduler
subclass that hides or renames one is caught as well.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

from controlplane.api.v1 import agent_pb2
from controlplane.protocol import MAX_SUPPORT_DETAIL_CHARS, MAX_SUPPORT_MISSING, MAX_SUPPORT_NAME_CHARS

# Kinds of internal (`Internal.kind`).
ATTRIBUTE = "attribute"  # a dotted path on the scheduler instance, of one of `types`
CALLABLE = "callable"  # a dotted path on the scheduler instance that must be callable
METHOD = "method"  # a method of vLLM's scheduler class taking `parameters` (in that order) after self
MODULE = "module"  # a vLLM module the agent imports
MEMBER = "member"  # a name of a class in one of those modules (`owner` "module:Class"): an attribute its
#                    __init__ sets, a class attribute, an enum member or a dataclass field


@dataclasses.dataclass(frozen=True, slots=True)
class Internal:
    """One vLLM internal the agent relies on; `name` is what a verdict's `missing` lists."""

    name: str
    kind: str
    path: str
    use: str
    types: tuple[type, ...] = ()
    parameters: tuple[str, ...] = ()
    owner: str = ""


_SCHED_OUTPUT = "vllm.v1.core.sched.output"
_REQUEST = "vllm.v1.request"


def _attribute(path: str, types: type | tuple[type, ...], use: str) -> Internal:
    return Internal(f"Scheduler.{path}", ATTRIBUTE, path, use, types if isinstance(types, tuple) else (types,))


def _callable(path: str, use: str) -> Internal:
    return Internal(f"Scheduler.{path}", CALLABLE, path, use)


def _method(name: str, parameters: tuple[str, ...], use: str) -> Internal:
    return Internal(f"Scheduler.{name}", METHOD, name, use, parameters=parameters)


def _member(module: str, cls: str, name: str, use: str) -> Internal:
    return Internal(f"{cls}.{name}", MEMBER, name, use, owner=f"{module}:{cls}")


INTERNALS: tuple[Internal, ...] = (
    _attribute("running", list, "reads the running queue"),
    _attribute("requests", dict, "looks up scheduled requests"),
    _attribute("_inflight_prefills", (set, frozenset), "counts the running prefills"),
    _attribute("max_num_running_reqs", int, "reads the engine's slots"),
    _attribute("max_num_active_reqs", int, "sets the admission cap N"),
    _attribute("max_num_scheduled_tokens", int, "sets the step's token budget"),
    _attribute("prefill_capacity_bound", bool, "enables decode-only steps"),
    _attribute("current_step", int, "defers decodes in prefill-only steps"),
    _attribute("block_size", int, "converts KV blocks to tokens"),
    _attribute("kv_cache_manager.block_pool.num_gpu_blocks", int, "reads the KV capacity"),
    _attribute("vllm_config.model_config.max_model_len", int, "reports the engine's limits"),
    _callable("waiting.__len__", "counts the waiting queue"),
    _callable("kv_cache_manager.block_pool.get_num_free_blocks", "reads the free KV"),
    _method("schedule", ("throttle_prefills",), "asks for decode-only steps"),
    _method("update_from_output", ("scheduler_output", "model_runner_output"), "times the steps"),
    _method("_free_request", ("request", "delay_free_blocks"), "sees every finished request"),
    _method("shutdown", (), "writes the final report"),
    Internal(_REQUEST, MODULE, _REQUEST, "reads requests and their status"),
    Internal(_SCHED_OUTPUT, MODULE, _SCHED_OUTPUT, "reads each step's composition"),
    *(_member(_REQUEST, "Request", name, "reads the requests") for name in (
        "request_id", "status", "num_prompt_tokens", "num_computed_tokens", "num_output_tokens", "is_prefill_chunk",
        "next_decode_eligible_step")),
    _member(_REQUEST, "RequestStatus", "FINISHED_ABORTED", "tells aborted requests apart"),
    *(_member(_SCHED_OUTPUT, "SchedulerOutput", name, "reads each step's composition") for name in (
        "num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs",
        "preempted_req_ids")),
    _member(_SCHED_OUTPUT, "CachedRequestData", "resumed_req_ids", "counts resumed prefills"),
    _member(_SCHED_OUTPUT, "NewRequestData", "req_id", "counts new prefills"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeVerdict:
    """What the probe found: `missing` names each internal missing or of another type (`Internal.name`, in
    `INTERNALS` order), `problems` says what is wrong with each, in words."""

    vllm_version: str
    missing: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def full(self) -> bool:
        """Every internal is there: the agent can enforce decisions."""
        return not self.missing

    @property
    def level(self) -> str:
        """"full" or "stock" (this agent never reports "degraded", see the module docstring)."""
        return "full" if self.full else "stock"

    @property
    def detail(self) -> str:
        """The problems in one line ("" when full)."""
        return "; ".join(self.problems)


def support_message(verdict: ProbeVerdict) -> agent_pb2.AgentSupport:
    """The verdict as the Hello carries it, cut to the protocol's bounds (a detail in one printable line)."""
    level = agent_pb2.SUPPORT_LEVEL_FULL if verdict.full else agent_pb2.SUPPORT_LEVEL_STOCK
    detail = _printable(verdict.detail[:MAX_SUPPORT_DETAIL_CHARS])
    missing = [_printable(name)[:MAX_SUPPORT_NAME_CHARS] for name in verdict.missing[:MAX_SUPPORT_MISSING]]
    return agent_pb2.AgentSupport(level=level, missing=missing, detail=detail)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def vllm_version() -> str:
    """The installed vLLM's version ("unknown" when it cannot be read). Never raises."""
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:  # pragma: no cover - the adapter runs inside vLLM
        return "unknown"


def probe_scheduler(scheduler: Any, *, vllm_class: type) -> ProbeVerdict:
    """Check every internal of `INTERNALS` on `scheduler` and vLLM's classes. Never raises.

    Args:
        scheduler: the constructed scheduler (after vLLM's `__init__`).
        vllm_class: the vLLM scheduler class whose methods the agent wraps (the class after the agent's mixin
            in the MRO).
    """
    missing: list[str] = []
    problems: list[str] = []
    modules: dict[str, Any] = {}
    for internal in INTERNALS:
        try:
            problem = _check(internal, scheduler, vllm_class, modules)
        except Exception as exc:  # a check that fails in an unforeseen way counts as a problem
            problem = f"{internal.name} could not be checked ({type(exc).__name__}: {exc})"
        if problem is not None:
            missing.append(internal.name)
            problems.append(problem)
    return ProbeVerdict(vllm_version=vllm_version(), missing=tuple(missing), problems=tuple(problems))


def _check(internal: Internal, scheduler: Any, vllm_class: type, modules: dict[str, Any]) -> str | None:
    kind, path, use = internal.kind, internal.path, internal.use
    if kind == ATTRIBUTE:
        found, value = _resolve(scheduler, path)
        if not found:
            return f"scheduler.{path} is missing (the agent {use})"
        types = internal.types
        if not isinstance(value, types) or (int in types and bool not in types and isinstance(value, bool)):
            names = "/".join(t.__name__ for t in types)
            return f"scheduler.{path} is a {type(value).__name__}, expected {names} (the agent {use})"
        return None
    if kind == CALLABLE:
        found, value = _resolve(scheduler, path)
        if not found or not callable(value):
            return f"scheduler.{path} is missing or not callable (the agent {use})"
        return None
    if kind == METHOD:
        return _method_problem(vllm_class, path, internal.parameters)
    if kind == MODULE:
        try:
            modules[path] = importlib.import_module(path)
        except Exception as exc:  # an import moved
            return f"vLLM module {path} cannot be imported ({type(exc).__name__}: {exc}; the agent {use})"
        return None
    module_name, _, class_name = internal.owner.partition(":")
    module = modules.get(module_name)
    if module is None:
        return f"{internal.name} cannot be checked: vLLM module {module_name} cannot be imported"
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return f"{module_name}.{class_name} is missing"
    if path not in _members(cls):
        return f"{internal.name} is missing (the agent {use})"
    return None


def _resolve(obj: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:  # any failure of a property counts as missing
            return False, None
    return True, obj


def _members(cls: type) -> set[str]:
    """The names `cls` has: class attributes (enum members, properties), dataclass fields, and the attribute
    names its __init__ refers to (where plain instance attributes are set)."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    code = getattr(getattr(cls, "__init__", None), "__code__", None)
    names.update(getattr(code, "co_names", ()))
    return names


def _method_problem(cls: type, name: str, parameters: tuple[str, ...]) -> str | None:
    method = getattr(cls, name, None)
    if method is None or not callable(method):
        return f"{cls.__name__}.{name}() is missing"
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return f"{cls.__name__}.{name}() has no readable signature"
    names = [p.name for p in signature.parameters.values()][1:]  # after self
    if names[: len(parameters)] != list(parameters):
        expected = ", ".join(("self", *parameters))
        return f"{cls.__name__}.{name}() takes ({', '.join(['self', *names])}), expected ({expected})"
    return None
