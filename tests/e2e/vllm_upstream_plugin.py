"""pytest plugin for vLLM's own scheduler tests, run by `test_vllm_upstream_scheduler` in a subprocess.

- Provides the two fixtures those tests take from vLLM's root conftest, which is not loaded (it imports
  vLLM's GPU-test dependencies): `temporary_enable_log_propagate` and `caplog_vllm`.
- With CP_UPSTREAM_SCHEDULER=agent, the tests build the agent's classes: after collection, every module of
  the tests whose global `Scheduler` / `AsyncScheduler` is vLLM's gets `ControlledSyncScheduler` /
  `ControlledAsyncScheduler` instead, and a `scheduler_cls` passed to `create_scheduler` is wrapped with
  `with_agent` (functions read module globals when called, so the tests' own code is unchanged).
- With CP_UPSTREAM_DECISION=mb_own_limits, every agent attached holds a decision from its start: MB at the
  engine's own max_num_seqs and max_num_batched_tokens (applied as the link thread applies one).
- Writes to CP_UPSTREAM_SUMMARY: the agents attached (`AgentRuntime.create` returned one), those not attached,
  the decisions applied, and the hook failures (`_cp_failed`, which turns an agent off).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from agents.vllm import runtime as agent_runtime
from agents.vllm import scheduler as agent_scheduler
from controlplane.api.v1 import common_pb2

_COUNTS: Counter[str] = Counter()
_SWAPS = {Scheduler: agent_scheduler.ControlledSyncScheduler, AsyncScheduler: agent_scheduler.ControlledAsyncScheduler}


@pytest.fixture
def temporary_enable_log_propagate() -> Iterator[None]:
    logger = logging.getLogger("vllm")
    previous, logger.propagate = logger.propagate, True
    yield
    logger.propagate = previous


@pytest.fixture
def caplog_vllm(temporary_enable_log_propagate: None, caplog: pytest.LogCaptureFixture
                ) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO):
        yield caplog


def _count_runtimes() -> None:
    create = agent_runtime.AgentRuntime.create.__func__

    def counted_create(cls: type, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = create(cls, scheduler, *args, **kwargs)
        attached = isinstance(runtime, agent_runtime.AgentRuntime)  # not a stock engine's report-only agent
        _COUNTS["attached" if attached else "not_attached"] += 1
        kind = os.environ.get("CP_UPSTREAM_DECISION")
        if attached and kind in _DECISIONS:
            applied, reason = runtime._on_decision(_DECISIONS[kind](scheduler), time.monotonic())
            _COUNTS["decisions_applied" if applied else f"decision_rejected_{reason}"] += 1
        return runtime

    agent_runtime.AgentRuntime.create = classmethod(counted_create)
    failed = agent_scheduler._AgentHooks._cp_failed

    def counted_failed(self: Any, where: str, exc: BaseException) -> None:
        _COUNTS["hook_failures"] += 1
        failed(self, where, exc)

    agent_scheduler._AgentHooks._cp_failed = counted_failed


def _own_limits_decision(scheduler: Any) -> common_pb2.Decision:
    """MB at the engine's own limits (N = max_num_seqs, budget = max_num_batched_tokens): the steering path
    runs every step (knobs set by the agent) and must schedule exactly as stock."""
    budget = scheduler.scheduler_config.max_num_batched_tokens
    return common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=scheduler.scheduler_config.max_num_seqs,
                               ttl_s=3600, budget=common_pb2.BudgetPolicy(b_max_tokens=budget, b_cap_tokens=budget))


def _eb_decision(scheduler: Any) -> common_pb2.Decision:
    """EB with threshold k = 2 and N = max_num_seqs: prefill-only and decode-only steps alternate, so
    vLLM's scenarios run under another schedule (their assertions may not hold; the hooks must never fail)."""
    return common_pb2.Decision(version=1, mode=common_pb2.MODE_EB, k=2, n=scheduler.scheduler_config.max_num_seqs,
                               ttl_s=3600)


_DECISIONS = {"mb_own_limits": _own_limits_decision, "eb": _eb_decision}


def _wrap_create_scheduler(create: Any) -> Any:
    @functools.wraps(create)
    def create_scheduler(*args: Any, scheduler_cls: type | None = None, **kwargs: Any) -> Any:
        if scheduler_cls is not None:
            scheduler_cls = agent_scheduler.with_agent(scheduler_cls)
        return create(*args, scheduler_cls=scheduler_cls, **kwargs)

    return create_scheduler


def pytest_collection_finish(session: pytest.Session) -> None:
    _count_runtimes()
    if os.environ.get("CP_UPSTREAM_SCHEDULER") != "agent":
        return
    modules = [m for name, m in sys.modules.items() if name.startswith("tests.v1.") and m is not None]
    utils = sys.modules["tests.v1.core.utils"]
    wrapped = _wrap_create_scheduler(utils.create_scheduler)
    for module in modules:
        for name in ("Scheduler", "AsyncScheduler"):
            value = getattr(module, name, None)
            if isinstance(value, type) and value in _SWAPS:
                setattr(module, name, _SWAPS[value])
                _COUNTS[f"swapped_{name}"] += 1
        if getattr(module, "create_scheduler", None) is utils.create_scheduler:
            module.create_scheduler = wrapped
    utils.create_scheduler = wrapped


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("CP_UPSTREAM_SUMMARY")
    if path:
        with open(path, "w") as f:
            json.dump(dict(_COUNTS), f)
