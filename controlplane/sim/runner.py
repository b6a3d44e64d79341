"""Run one scenario under one scheduler on the twin: arrivals in, steps out, metrics and timeline back.

`run_scenario` builds a `SimEngine` with the scheduler's start-up shape, lets the scheduler's control set
the decision (none, fixed, or the core policy online), issues the workload's requests (closed loop: a new
one whenever fewer than the phase's concurrency are in the system, arriving at the finish time that freed
the place; open loop: at their drawn arrival times, an idle engine jumping to the next arrival) and steps
until every request has completed. Requests that arrive during a step are seen at the next step boundary,
as in vLLM.

Deterministic: same scenario, scheduler, profile and seed → identical result. Pure; no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from controlplane.loop.buckets import BucketStats
from controlplane.sim.arrivals import RequestTrace, Workload, materialize
from controlplane.sim.control import DecisionRecord, OnlineControl
from controlplane.sim.engine import SimEngine
from controlplane.sim.metrics import RunMetrics, summarize
from controlplane.sim.profiles import SimProfile
from controlplane.sim.schedulers import SchedulerSpec

DEFAULT_MAX_STEPS = 20_000_000


@dataclass(frozen=True, eq=False)
class RunResult:
    """One run: its metrics, the decisions put in force, the per-step log and per-request columns."""

    scenario: str
    scheduler: str
    profile: str
    seed: int
    metrics: RunMetrics
    timeline: tuple[DecisionRecord, ...]
    steps: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    wall_s: float
    max_kv_used_tokens: int
    kv_total_tokens: int
    num_fallback_steps: int
    pool_window: BucketStats | None = None  # online schedulers: the window a warm start would use (snapshot)


def run_scenario(workload: Workload, scheduler: SchedulerSpec, profile: SimProfile, *, seed: int = 0,
                 record_steps: bool = True, max_steps: int = DEFAULT_MAX_STEPS) -> RunResult:
    """Run `workload` to completion under `scheduler` on `profile`.

    Raises:
        ValueError: the scheduler's decision does not fit the engine.
        RuntimeError: more than `max_steps` steps (a runaway configuration).
    """
    started = time.perf_counter()
    shape = scheduler.shape_for(profile)
    engine = SimEngine(profile, shape=shape, record_steps=record_steps)
    control = scheduler.create_control(profile, shape)
    control.start(engine)
    trace = materialize(workload, seed=seed)
    if workload.is_closed:
        max_kv = _run_closed(engine, control, trace, max_steps)
    else:
        max_kv = _run_open(engine, control, trace, max_steps)
    metrics = summarize(engine.request_arrays(), num_preemptions=engine.num_preemptions,
                        num_steps=engine.num_steps)
    return RunResult(
        scenario=workload.name, scheduler=scheduler.name, profile=profile.name, seed=seed, metrics=metrics,
        timeline=tuple(control.timeline), steps=engine.log.arrays() if engine.log is not None else {},
        requests=engine.request_arrays(), wall_s=time.perf_counter() - started, max_kv_used_tokens=max_kv,
        kv_total_tokens=engine.kv_total_tokens, num_fallback_steps=engine.num_fallback_steps,
        pool_window=control.pool_window if isinstance(control, OnlineControl) else None)


def _cached(trace: RequestTrace, start: int, end: int) -> np.ndarray | None:
    return None if trace.cached_prompt_tokens is None else trace.cached_prompt_tokens[start:end]


def _run_closed(engine: SimEngine, control, trace: RequestTrace, max_steps: int) -> int:
    total = trace.num_requests
    caps = trace.concurrency
    issued = 0
    in_system = 0
    max_kv = 0

    def issue(now_s: float) -> None:
        nonlocal issued, in_system
        start = issued
        while issued < total and in_system < caps[issued]:
            issued += 1
            in_system += 1
        if issued > start:
            engine.add_requests(trace.prompt_tokens[start:issued], trace.output_tokens[start:issued], now_s,
                                cached_prompt_tokens=_cached(trace, start, issued))

    issue(engine.now_s)
    while in_system > 0:
        step = engine.step()
        if step is None:  # pragma: no cover - in_system > 0 means work exists
            raise RuntimeError("closed loop: requests in the system but the engine is idle")
        if engine.num_steps > max_steps:
            raise RuntimeError(f"run exceeded {max_steps} steps")
        max_kv = max(max_kv, engine.kv_used_tokens)
        if step.finished.size:
            in_system -= step.finished.size
            issue(step.end_s)
        control.after_step(engine, step)
    return max_kv


def _run_open(engine: SimEngine, control, trace: RequestTrace, max_steps: int) -> int:
    arrivals = trace.arrival_s
    total = trace.num_requests
    issued = 0
    max_kv = 0
    while issued < total or not engine.is_idle:
        if engine.is_idle and issued < total and arrivals[issued] > engine.now_s:
            engine.now_s = float(arrivals[issued])
        upto = int(np.searchsorted(arrivals, engine.now_s, side="right"))
        if upto > issued:
            engine.add_requests(trace.prompt_tokens[issued:upto], trace.output_tokens[issued:upto],
                                arrivals[issued:upto], cached_prompt_tokens=_cached(trace, issued, upto))
            issued = upto
        step = engine.step()
        if step is None:
            continue
        if engine.num_steps > max_steps:
            raise RuntimeError(f"run exceeded {max_steps} steps")
        max_kv = max(max_kv, engine.kv_used_tokens)
        control.after_step(engine, step)
    return max_kv
