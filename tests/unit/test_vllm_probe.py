"""The probe's support verdict on a real vLLM `Scheduler` built from tiny configs (no engine, no model run).

For every internal of the probe's own table (`agents.vllm.probe.INTERNALS`), taken away or retyped: the engine
is built with the agent (no exception), the verdict is stock and names exactly that internal, no agent hook is
attached, the engine then schedules step for step as stock vLLM, and the report-only agent's Hello carries the
verdict. The probe runs once, at engine start: the internal is taken away after vLLM's own `__init__` and
before the probe, and given back once the engine is built (vLLM itself needs most of them to schedule at all);
a renamed method signature, which vLLM tolerates, stays renamed for the whole run.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the vllm extra is part of the project's set-up (make test installs it)")

from vllm.v1.core.sched.scheduler import Scheduler

from agents.vllm.probe import ATTRIBUTE, CALLABLE, INTERNALS, METHOD, MODULE, Internal, support_message
from agents.vllm.scheduler import with_agent
from agents.vllm.stock import STOCK_REJECT_REASON
from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.protocol import MAX_SUPPORT_DETAIL_CHARS, MAX_SUPPORT_MISSING, MAX_SUPPORT_NAME_CHARS
from tests.unit.test_agent_scheduler import add_requests, agent_env, errors, make_scheduler, model_dir, run_steps

__all__ = ["agent_env", "model_dir"]  # fixtures shared with test_agent_scheduler

ROOT = Path(__file__).resolve().parents[2]


class _Alien:
    """A value of a type no internal has."""


class _Without:
    """`target` with the attribute at dotted `path` hidden (everything else delegated)."""

    def __init__(self, target: Any, path: str) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        head, _, rest = self._path.partition(".")
        if name == head:
            if not rest:
                raise AttributeError(name)
            return _Without(getattr(self._target, name), rest)
        return getattr(self._target, name)


def _renamed(name: str) -> Callable[..., Any]:
    """A forwarding method whose parameters vLLM would not recognise (vLLM's own calls still work)."""
    if name == "schedule":
        def schedule(self: Any, defer_prefills: bool = False) -> Any:
            return Scheduler.schedule(self, defer_prefills)
        return schedule
    if name == "update_from_output":
        def update_from_output(self: Any, output: Any, runner_output: Any) -> Any:
            return Scheduler.update_from_output(self, output, runner_output)
        return update_from_output

    def _free_request(self: Any, req: Any, delay_free_blocks: bool = False) -> Any:
        return Scheduler._free_request(self, req, delay_free_blocks)
    return _free_request


def _stand_in(internal: Internal) -> type:
    """A class for `internal.owner` with every member the probe checks but `internal`'s."""
    others = [i.path for i in INTERNALS if i.owner == internal.owner and i is not internal]
    body = "".join(f"    self.{name} = None\n" for name in others) or "    pass\n"
    namespace: dict[str, Any] = {}
    exec(f"def __init__(self):\n{body}", namespace)  # a test-built class
    return type(internal.owner.partition(":")[2], (), {"__init__": namespace["__init__"]})


def _take_away(scheduler: Any, cls: type, internal: Internal, how: str) -> Callable[[], None]:
    """Remove (`how` "missing") or retype ("retyped") `internal` now; returns what gives it back."""
    kind, path = internal.kind, internal.path
    if kind in (ATTRIBUTE, CALLABLE):
        head, _, rest = path.partition(".")
        original = getattr(scheduler, head)
        if how == "missing" and not rest:
            delattr(scheduler, head)
        elif how == "missing":
            setattr(scheduler, head, _Without(original, rest))
        elif not rest:
            setattr(scheduler, head, _Alien())
        else:
            parent_path, _, last = path.rpartition(".")
            parent = scheduler
            for part in parent_path.split("."):
                parent = getattr(parent, part)
            value = getattr(parent, last)
            setattr(parent, last, _Alien())
            return lambda: setattr(parent, last, value)
        return lambda: setattr(scheduler, head, original)
    if kind == METHOD:
        if how == "changed":  # the class was built with the renamed method: it stays
            return lambda: None
        setattr(cls, path, None)
        return lambda: delattr(cls, path)
    if kind == MODULE:
        module = sys.modules[path]
        sys.modules[path] = None  # type: ignore[assignment] - an import of it now fails
        return lambda: sys.modules.__setitem__(path, module)
    module_name, _, class_name = internal.owner.partition(":")
    module = importlib.import_module(module_name)
    original_cls = getattr(module, class_name)
    setattr(module, class_name, _stand_in(internal))
    return lambda: setattr(module, class_name, original_cls)


def _engine_class(internal: Internal, how: str) -> type:
    """vLLM's Scheduler with `internal` taken away between vLLM's __init__ and the agent's probe, given back
    once the engine is built; the agent's class over it."""
    namespace: dict[str, Any] = {}
    if internal.kind == METHOD and how == "changed":
        namespace[internal.path] = _renamed(internal.path)

    def broken_init(self: Any, *args: Any, **kwargs: Any) -> None:
        Scheduler.__init__(self, *args, **kwargs)
        self.give_back = _take_away(self, broken, internal, how)

    namespace["__init__"] = broken_init
    broken = type("Broken", (Scheduler,), namespace)
    controlled = with_agent(broken)

    def engine_init(self: Any, *args: Any, **kwargs: Any) -> None:
        controlled.__init__(self, *args, **kwargs)  # vLLM's __init__, the change, the agent's probe
        self.give_back()

    return type("Engine", (controlled,), {"__init__": engine_init})


def _ways(internal: Internal) -> list[str]:
    if internal.kind == ATTRIBUTE:
        return ["missing", "retyped"]
    if internal.kind == METHOD and internal.parameters:
        return ["missing", "changed"]
    return ["missing"]


CASES = [(internal, how) for internal in INTERNALS for how in _ways(internal)]


@pytest.fixture(scope="module")
def stock_steps(model_dir: Path) -> list[dict[str, Any]]:
    scheduler = make_scheduler(Scheduler, model_dir)
    add_requests(scheduler, 5, max_tokens=6)
    steps = run_steps(scheduler)
    scheduler.shutdown()
    return steps


@pytest.fixture
def engines() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for scheduler in made:
        scheduler.shutdown()


def test_the_table_names_each_internal_once_and_the_docs_list_them_all() -> None:
    names = [internal.name for internal in INTERNALS]
    assert len(names) == len(set(names)) <= MAX_SUPPORT_MISSING
    assert all(0 < len(name) <= MAX_SUPPORT_NAME_CHARS and name.isprintable() for name in names)
    documented = (ROOT / "docs" / "VLLM_INTERNALS.md").read_text()
    assert [name for name in names if f"`{name}`" not in documented] == []


def test_the_supported_vllm_gives_a_full_verdict_and_the_hello_says_so(
        model_dir: Path, agent_env: Path, engines: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    engines.append(scheduler := make_scheduler(with_agent(Scheduler), model_dir))
    verdict = scheduler.cp_verdict
    assert verdict.full and verdict.missing == () and verdict.vllm_version == "0.32.0"
    assert scheduler.cp_agent is not None and scheduler.cp_stock_reporter is None
    hello = scheduler.cp_agent.link._hello
    assert hello.vllm_version == "0.32.0" and hello.HasField("support")
    assert hello.support == agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_FULL)
    assert errors(caplog) == []


@pytest.mark.parametrize(("internal", "how"), CASES, ids=[f"{i.name}-{how}" for i, how in CASES])
def test_each_internal_taken_away_gives_stock_scheduling_and_a_verdict_naming_it(
        internal: Internal, how: str, model_dir: Path, agent_env: Path, engines: list[Any],
        stock_steps: list[dict[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    engines.append(scheduler := make_scheduler(_engine_class(internal, how), model_dir))
    assert scheduler.cp_agent is None  # no hook of the agent runs in the scheduler thread
    verdict = scheduler.cp_verdict
    assert verdict is not None and verdict.level == "stock" and verdict.vllm_version == "0.32.0"
    if internal.kind == MODULE:  # its members cannot be checked either
        assert verdict.missing == (internal.name, *(i.name for i in INTERNALS if i.owner.startswith(internal.path)))
    else:
        assert verdict.missing == (internal.name,), verdict.problems
    [record] = errors(caplog)  # one ERROR at start, naming the problem
    assert verdict.problems[0] in record.getMessage() and "stock vLLM scheduling" in record.getMessage()

    reporter = scheduler.cp_stock_reporter  # the verdict goes to the controller
    assert reporter is not None
    support = reporter.hello.support
    assert support.level == agent_pb2.SUPPORT_LEVEL_STOCK and list(support.missing) == list(verdict.missing)
    assert support.detail.isprintable() and len(support.detail) <= MAX_SUPPORT_DETAIL_CHARS
    assert reporter.hello.limits.max_num_seqs == 8 and reporter.hello.limits.max_num_batched_tokens == 512
    assert reporter.hello.instance_id and reporter.hello.vllm_version == "0.32.0"
    report = json.loads(agent_env.read_text())
    assert report["agent_state"] == "stock" and report["support"]["missing"] == list(verdict.missing)

    # A decision that reaches it anyway is never applied, and no knob is ever touched.
    decision = common_pb2.Decision(version=1, mode=common_pb2.MODE_EB, k=1, n=2, ttl_s=60,
                                   budget=common_pb2.BudgetPolicy(b_max_tokens=256, b_cap_tokens=256))
    assert reporter._on_decision(decision, time.monotonic()) == (False, STOCK_REJECT_REASON)
    add_requests(scheduler, 5, max_tokens=6)
    assert run_steps(scheduler) == stock_steps
    assert (scheduler.max_num_scheduled_tokens, scheduler.max_num_active_reqs) == (512, 8)
    assert len(errors(caplog)) == 1  # nothing more went wrong


def test_an_engine_whose_limits_cannot_be_read_is_stock_and_not_reported(
        model_dir: Path, agent_env: Path, engines: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hello without limits would be refused by the controller on every reconnect: the agent does not send one."""
    import agents.vllm.stock as stock

    monkeypatch.setattr(stock, "_first_int", lambda *places: None)
    engines.append(scheduler := make_scheduler(_engine_class(INTERNALS[0], "retyped"), model_dir))
    assert scheduler.cp_agent is None and scheduler.cp_stock_reporter is None
    report = json.loads(agent_env.read_text())
    assert report["agent_state"] == "stock" and report["reporting_to_controller"] is False


def test_the_wire_verdict_is_cut_to_the_protocols_bounds() -> None:
    from agents.vllm.probe import ProbeVerdict

    verdict = ProbeVerdict(vllm_version="9.9", missing=tuple(f"X.{'a' * 200}{i}" for i in range(100)),
                           problems=("line one\nline two\x00", "y" * 2000))
    support = support_message(verdict)
    assert support.level == agent_pb2.SUPPORT_LEVEL_STOCK
    assert len(support.missing) == MAX_SUPPORT_MISSING
    assert all(len(name) == MAX_SUPPORT_NAME_CHARS for name in support.missing)
    assert len(support.detail) == MAX_SUPPORT_DETAIL_CHARS and support.detail.isprintable()
    assert support.detail.startswith("line one?line two?; yyy")
