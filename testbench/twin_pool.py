"""A pool of twin engines driven by the fleet state machine in simulated time, under a fixed configuration or a
latency objective, with open-loop Poisson arrivals: what `benchmarks/twin_objectives.py` measures and the seeded
objective tests run.

`run` builds `engines` twin engines (`controlplane.sim.engine.SimEngine`, the profile's step times as the truth)
in one pool, each fed its own open-loop Poisson arrivals at `rate_per_s` (so TTFT includes queueing), all driven
by one `FleetState` with the profile's calibration: every simulated second each engine's completions, steps and
latency stamps (arrival and first-token times, hence TTFT, TPOT and queue wait) go to `FleetState.batch` as the
agent sends them, the pool is refreshed when due (which evaluates its objective loop), `FleetState.tick` runs,
and every decision pushed is applied to its engine's enforcer. Guarded rollouts are on unless `guard` is False.
Workloads: ShareGPT-like (log-normal prompts of mean 400 tokens, log-normal outputs of mean 250) and
LongBench-like (log-normal prompts of mean 5,000 tokens, 1,000 to 16,000, outputs of mean 150).

Deterministic for a seed. No I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from controlplane.api.v1 import operator_pb2
from controlplane.core.budget import DEFAULT_B_CAP_TOKENS, SweepPoint
from controlplane.core.types import EngineLimits, OperatorIntent, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.loop.objective import ObjectiveState, ObjectiveTracker
from controlplane.protocol import pool_key_of
from controlplane.sim.control import latencies_of
from controlplane.sim.engine import SimEngine
from controlplane.sim.lengths import ClippedLogNormalLengths
from controlplane.sim.profiles import SimProfile
from controlplane.sim.schedulers import parse_scheduler
from testbench.twin_batch import twin_batch

MODEL, ACCELERATOR = "twin", "twin"
POOL_KEY = pool_key_of(MODEL, ACCELERATOR)
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
WINDOW_S = 60.0
_EMPTY = np.zeros(0)

# name → (prompt, output) length distributions; prompts are capped to the profile's max_model_len at draw time.
WORKLOADS = {
    "sharegpt": (ClippedLogNormalLengths(400.0, 1.0, 4, 8192), ClippedLogNormalLengths(250.0, 1.0, 1, 2048)),
    "longbench": (ClippedLogNormalLengths(5000.0, 0.5, 1000, 16000), ClippedLogNormalLengths(150.0, 0.5, 1, 512)),
}

# (profile, workload) → arrivals per second per engine: where EB's and MB's TTFT p99 differ clearly and both
# keep up, chosen with --rate runs (MB/EB p99 about 2.0, 1.3, 2.2 and 1.6 over 10 minutes; at 30/s on H200
# ShareGPT-like MB ×1 falls behind, its p99 growing minute by minute).
CASES = {
    ("h200-qwen3-8b", "sharegpt"): 27.0,
    ("h200-qwen3-8b", "longbench"): 4.0,
    ("rtx-pro-6000-qwen3-8b", "sharegpt"): 11.0,
    ("rtx-pro-6000-qwen3-8b", "longbench"): 2.2,
}


@dataclass(frozen=True)
class Config:
    """One run's controls: a pin ("mb"/"eb"), a fixed δ (None: the objective's or 0), a static B_cap scale,
    an objective's TTFT p99 target and/or TPOT p99 target (None: none) and the engine it is set on (None: the
    fleet)."""

    label: str
    pin: str | None = None
    delta_s_per_token: float | None = None
    budget_scale: float = 1.0
    target_s: float | None = None
    objective_engine: str | None = None
    tpot_target_s: float | None = None

    def tracker(self, fleet: FleetState) -> ObjectiveTracker | None:
        """The objective loop this run's objective runs in (None: none in force)."""
        if self.objective_engine is not None:
            return fleet.objective_for_engine(self.objective_engine)
        return fleet.objective_of(POOL_KEY)


@dataclass
class Result:
    ttft_p99_s: float  # all requests finishing after the warm-up
    tpot_p99_s: float
    window_p99_s: list[float]  # per one-minute window after the warm-up
    tokens_per_s: float  # decode tokens after the warm-up, the pool's
    mb_step_share: float
    trace: list[tuple[int, str, float, float]] = field(default_factory=list)  # (minute, state, δ, B_cap scale)
    infeasible_at_s: float | None = None
    infeasible_detail: str = ""
    data_at_s: float | None = None  # the first evaluation over MIN_REQUESTS latencies
    rollouts: list[tuple[int, str]] = field(default_factory=list)  # (second, "event from→to")
    tpot_mean_s: float = math.nan  # requests finishing after the warm-up
    fleet: FleetState | None = None  # the state machine at the end of the run

    def windows_met(self, target_s: float) -> float:
        return float(np.mean([p <= target_s for p in self.window_p99_s])) if self.window_p99_s else math.nan


@dataclass
class _Engine:
    engine_id: str
    sim: SimEngine
    stream: object
    arrival_s: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    issued: int = 0
    done: list = field(default_factory=list)  # (finished request ids, step end) per step, since the last batch
    steps: list = field(default_factory=list)
    next_telemetry_s: float = 1.0
    seq: int = 0
    counted_tokens: float = 0.0
    mb_steps: int = 0
    num_steps: int = 0

    def clock_s(self) -> float:
        """When this engine next does something: now, or its next arrival while idle (inf: nothing left)."""
        if not self.sim.is_idle:
            return self.sim.now_s
        if self.issued < self.arrival_s.size:
            return max(self.sim.now_s, float(self.arrival_s[self.issued]))
        return math.inf


def _budget_sweep(scale: float, b_max_tokens: int) -> tuple[SweepPoint, ...]:
    """A static sweep whose optimum is B_max = b_max_tokens without pressure and B_cap = scale × the policy's
    default B_cap under pressure (scale 1: no sweep, the policy's own)."""
    if scale == 1.0:
        return ()
    cap = min(b_max_tokens, round(DEFAULT_B_CAP_TOKENS * scale))
    if cap == b_max_tokens:
        return (SweepPoint(b_max_tokens, 0.0, 0.0),)
    return SweepPoint(b_max_tokens, 0.0, 1.0), SweepPoint(cap, 1.0, 0.0)


def _trace(profile: SimProfile, workload: str, rate_per_s: float, minutes: float, seed: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Poisson arrival times and (prompt, output) lengths of one engine's requests."""
    rng = np.random.default_rng(seed)
    count = int(rate_per_s * minutes * 60.0 * 1.2) + 16
    arrival_s = np.cumsum(rng.exponential(1.0 / rate_per_s, count))
    arrival_s = arrival_s[arrival_s < minutes * 60.0]
    prompt_dist, output_dist = WORKLOADS[workload]
    prompts = np.minimum(prompt_dist.sample(rng, arrival_s.size), profile.shape.max_model_len_tokens - 2)
    return arrival_s, prompts, output_dist.sample(rng, arrival_s.size)


def run(profile: SimProfile, workload: str, config: Config, *, rate_per_s: float, engines: int, minutes: float,
        seed: int, warmup_s: float, guard: bool) -> Result:
    """One pool of `engines` twin engines under `config` for `minutes` simulated minutes (see the docstring)."""
    shape = parse_scheduler("eb+").shape_for(profile)
    sweep = _budget_sweep(config.budget_scale, shape.max_num_batched_tokens)
    intent = OperatorIntent(delta_s_per_token=config.delta_s_per_token)
    fleet = FleetState(DecisionLoopConfig(), PolicyConfig(), replica_id="twin-objectives", guard_rollouts=guard,
                       budget_sweep=sweep, default_intent=intent)
    fleet.set_calibration(POOL_KEY, profile.costs, 0.0, refresh=False)
    records = []
    if config.pin is not None:
        mode = {"mb": operator_pb2.PINNED_MODE_MB, "eb": operator_pb2.PINNED_MODE_EB}[config.pin]
        records.append(operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_PIN, mode=mode, scope=FLEET))
    if config.target_s is not None or config.tpot_target_s is not None:
        scope = FLEET if config.objective_engine is None else operator_pb2.Scope(
            kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=config.objective_engine)
        objective = operator_pb2.LatencyObjective()
        if config.target_s is not None:
            objective.ttft_quantile, objective.ttft_target_s = 0.99, config.target_s
        if config.tpot_target_s is not None:
            objective.tpot_quantile, objective.tpot_target_s = 0.99, config.tpot_target_s
        records.append(operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, scope=scope,
                                                   objective=objective))
    pool: list[_Engine] = []
    for i in range(engines):
        sim = SimEngine(profile, shape=shape, record_steps=False, seed=seed * 1000 + i)
        engine = _Engine(f"e{i}", sim, object(), *_trace(profile, workload, rate_per_s, minutes, seed * 1000 + i))
        limits = EngineLimits(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                              kv_capacity_tokens=sim.kv_total_tokens, max_model_len_tokens=shape.max_model_len_tokens)
        fleet.attach(EngineHello(engine_id=engine.engine_id, model=MODEL, accelerator=ACCELERATOR, vllm_version="",
                                 agent_version="", limits=limits, block_size_tokens=16),
                     identity="twin", epoch=1, stream=engine.stream, now_s=0.0)
        pool.append(engine)
    if records:
        fleet.set_overrides(records, 0.0)
    result = Result(math.nan, math.nan, [], 0.0, 0.0)
    for engine in pool:
        _apply(pool, fleet.first_decision(engine.engine_id, engine.stream, 0.0), 0.0, result)
    end_s = minutes * 60.0
    next_tick_s, next_minute_s = 1.0, WINDOW_S
    while True:
        engine = min(pool, key=_Engine.clock_s)
        now_s = engine.clock_s()
        if now_s >= end_s:
            break
        if now_s >= next_tick_s:
            if fleet.refresh_due(POOL_KEY, now_s) is not None:
                fleet.refresh_pool(POOL_KEY, now_s)
            _apply(pool, fleet.tick(now_s), now_s, result)
            _observe(fleet, config, result, now_s)
            next_tick_s += 1.0
            if now_s >= next_minute_s:
                tracker = config.tracker(fleet)
                if tracker is not None:
                    result.trace.append((round(next_minute_s / 60.0), tracker.state.name,
                                         tracker.delta_s_per_token, tracker.budget_cap_scale))
                next_minute_s += WINDOW_S
        sim = engine.sim
        if sim.is_idle:
            sim.now_s = now_s
        upto = int(np.searchsorted(engine.arrival_s, sim.now_s, side="right"))
        if upto > engine.issued:
            sim.add_requests(engine.prompts[engine.issued:upto], engine.outputs[engine.issued:upto],
                             engine.arrival_s[engine.issued:upto])
            engine.issued = upto
        step = sim.step()
        if step is not None:
            engine.steps.append((step.prefill_tokens, step.num_decodes, step.duration_s))
            engine.num_steps += 1
            engine.mb_steps += step.kind.name == "STOCK"
            if step.end_s > warmup_s:
                engine.counted_tokens += step.num_decodes
            if step.finished.size:
                engine.done.append((step.finished, step.end_s))
        if sim.now_s >= engine.next_telemetry_s:
            effects = fleet.batch(engine.engine_id, engine.stream, _batch(engine), sim.now_s)
            _apply(pool, effects, sim.now_s, result)
    _measure(pool, result, warmup_s=warmup_s, end_s=end_s)
    result.fleet = fleet
    return result


def _observe(fleet: FleetState, config: Config, result: Result, now_s: float) -> None:
    tracker = config.tracker(fleet)
    if tracker is not None and tracker.state != ObjectiveState.NO_LATENCY_DATA and result.data_at_s is None:
        result.data_at_s = now_s
    if tracker is not None and tracker.state == ObjectiveState.INFEASIBLE and result.infeasible_at_s is None:
        result.infeasible_at_s = now_s
        result.infeasible_detail = tracker.detail


def _measure(pool: list[_Engine], result: Result, *, warmup_s: float, end_s: float) -> None:
    finish, ttft, tpot = [], [], []
    for engine in pool:
        columns = engine.sim.request_arrays()
        done = ~np.isnan(columns["finish_s"])
        finish.append(columns["finish_s"][done])
        ttft.append((columns["first_token_s"] - columns["arrival_s"])[done])
        outputs = columns["output_tokens"][done]
        per_token = (columns["finish_s"] - columns["first_token_s"])[done] / np.maximum(outputs - 1, 1)
        tpot.append(np.where(outputs >= 2, per_token, np.nan))
    finish_s, ttft_s, tpot_s = np.concatenate(finish), np.concatenate(ttft), np.concatenate(tpot)
    after = finish_s >= warmup_s
    result.ttft_p99_s = _p99(ttft_s[after])
    result.tpot_p99_s = _p99(tpot_s[after & ~np.isnan(tpot_s)])
    result.tpot_mean_s = float(np.mean(tpot_s[after & ~np.isnan(tpot_s)])) if after.any() else math.nan
    for start_s in np.arange(warmup_s, end_s - WINDOW_S / 2, WINDOW_S):
        inside = (finish_s >= start_s) & (finish_s < start_s + WINDOW_S)
        result.window_p99_s.append(_p99(ttft_s[inside]))
    result.tokens_per_s = sum(e.counted_tokens for e in pool) / (end_s - warmup_s)
    result.mb_step_share = sum(e.mb_steps for e in pool) / max(1, sum(e.num_steps for e in pool))


def _p99(values: np.ndarray) -> float:
    return float(np.quantile(values, 0.99)) if values.size else math.inf


def _batch(engine: _Engine) -> ValidatedBatch:
    """What the agent sends for the second just ended: completions with their latency stamps, steps, and the
    running requests' lengths."""
    sim = engine.sim
    engine.next_telemetry_s = max(engine.next_telemetry_s + 1.0, sim.now_s)
    engine.seq += 1
    ids = np.concatenate([ids for ids, _ in engine.done]) if engine.done else np.zeros(0, dtype=np.int64)
    finish = np.concatenate([np.full(ids.size, end_s) for ids, end_s in engine.done]) if engine.done else _EMPTY
    engine.done.clear()
    prompts, outputs = (column.astype(np.float64) for column in sim.lengths_of(ids))
    batch = twin_batch(sim, seq=engine.seq, prompts=prompts, outputs=outputs, admitted_s=sim.admitted_of(ids),
                       steps=engine.steps, latencies=latencies_of(sim, ids, finish))
    engine.steps.clear()
    return batch


def _apply(pool: list[_Engine], effects, now_s: float, result: Result | None = None) -> None:
    if effects is None:
        return
    if result is not None:
        result.rollouts += [(round(now_s), f"{e.event} {e.from_mode}→{e.to_mode}") for e in effects.rollouts]
    by_id = {e.engine_id: e for e in pool}
    for push in effects.pushes:
        engine = by_id.get(push.engine_id)
        if engine is not None:
            engine.sim.enforcer.apply(push.decision, now_s=now_s)


def run_seeds(profile: SimProfile, workload: str, config: Config, seeds: list[int], **kw) -> Result:
    """`run` over each seed: windows pooled, p99s and throughput averaged, the first seed's trace."""
    results = [run(profile, workload, config, seed=seed, **kw) for seed in seeds]
    first = results[0]
    infeasible = [r.infeasible_at_s for r in results]
    return Result(
        ttft_p99_s=float(np.mean([r.ttft_p99_s for r in results])),
        tpot_p99_s=float(np.mean([r.tpot_p99_s for r in results])),
        window_p99_s=[p for r in results for p in r.window_p99_s],
        tokens_per_s=float(np.mean([r.tokens_per_s for r in results])),
        mb_step_share=float(np.mean([r.mb_step_share for r in results])), trace=first.trace,
        infeasible_at_s=None if None in infeasible else max(infeasible), infeasible_detail=first.infeasible_detail,
        rollouts=first.rollouts, data_at_s=first.data_at_s)
