"""Who sets the engine's decision during a twin run: nobody (stock), a fixed decision, or the real core
policy online — the controller's loop without the network.

`OnlineControl` runs the controller's own decision loop (`controlplane.loop`: `EngineLoop` per engine,
`PoolStatistics` per pool) on the simulated clock: every `telemetry_interval_s` the completions since the
last batch are fed as one batch (the agent's cadence) with the running requests' output lengths so far, binned
as the agent bins them (`agents.running_lengths`), the pool's estimate is refreshed when a statistics
bucket settles, and a decision due is computed with the profile's CostModel as the pool calibration and,
when the instruction changed, applied with `Enforcer.apply` at the current simulated time (no network
latency). Every applied decision is recorded as a `DecisionRecord` (the timeline).

No I/O, no clock: time is the engine's simulated clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agents.running_lengths import running_length_entries
from controlplane.api.v1 import common_pb2
from controlplane.core.budget import SweepPoint
from controlplane.core.types import CostModel, EngineLimits, OperatorIntent, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.engine import EngineLoop, LoopOutcome
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.loop.pool_stats import BucketStats, PoolStatistics
from controlplane.sim.engine import SimEngine, SimStep


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision put in force at `at_s` (simulated seconds). Diagnostics are 0 when not computed."""

    at_s: float
    mode: str
    k: int
    n: int
    b_max_tokens: int
    b_cap_tokens: int
    reason: str
    theta_star: float = 0.0
    n_star: int = 0
    lhs_s_per_token: float = 0.0
    rhs_s_per_token: float = 0.0
    n_obs: float = 0.0


def record_of(decision: common_pb2.Decision, at_s: float) -> DecisionRecord:
    d = decision.diagnostics
    return DecisionRecord(
        at_s=at_s, mode=common_pb2.Mode.Name(decision.mode).removeprefix("MODE_").lower(), k=decision.k,
        n=decision.n, b_max_tokens=decision.budget.b_max_tokens, b_cap_tokens=decision.budget.b_cap_tokens,
        reason=decision.reason, theta_star=d.theta_star, n_star=d.n_star, lhs_s_per_token=d.lhs_s_per_token,
        rhs_s_per_token=d.rhs_s_per_token, n_obs=d.n_obs)


class StaticControl:
    """Applies one fixed decision at the start (None: stock vLLM all run long)."""

    def __init__(self, decision: common_pb2.Decision | None) -> None:
        self._decision = decision
        self.timeline: list[DecisionRecord] = []

    def start(self, engine: SimEngine) -> None:
        """Raises ValueError when the engine refuses the decision (a scheduler spec that does not fit)."""
        if self._decision is None:
            return
        applied, reason = engine.enforcer.apply(self._decision, now_s=engine.now_s)
        if not applied:
            raise ValueError(f"the engine refused the decision: {reason}")
        self.timeline.append(record_of(self._decision, engine.now_s))

    def after_step(self, engine: SimEngine, step: SimStep) -> None:
        """Nothing changes during the run."""


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """How the online loop runs: the controller's loop config, the policy config, the operator's intent,
    the telemetry cadence (seconds of simulated time), an optional P-PAS budget sweep, and an optional
    persisted pool window to start from (warm start, as the controller seeds a pool from its snapshot)."""

    loop: DecisionLoopConfig = field(default_factory=DecisionLoopConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    intent: OperatorIntent = field(default_factory=OperatorIntent)
    telemetry_interval_s: float = 1.0
    budget_sweep: Sequence[SweepPoint] = ()
    warm_start: BucketStats | None = None


_EMPTY = np.zeros(0)


class OnlineControl:
    """The controller's decision loop for one engine, run on the twin's clock (see the module docstring).

    It feeds the same objects the controller does — a `loop.EngineLoop` for the engine and a
    `loop.PoolStatistics` for its (one-engine) pool — in the same order: every telemetry interval one
    batch (the completions and steps since the last one, the running count and lengths, the preemption
    counter) goes to `EngineLoop.on_batch` and `PoolStatistics.add`; the pool estimate is refreshed when its
    end bucket advances; the engine is decided when it is due. The profile's CostModel stands in for the
    pool's calibration.
    """

    def __init__(self, costs: CostModel, settings: OnlineSettings | None = None) -> None:
        self._costs = costs
        self._settings = settings = settings or OnlineSettings()
        self._loop: EngineLoop | None = None
        self._pool: PoolStatistics | None = None
        self._next_telemetry_s = 0.0
        self._seq = 0
        self._prompts: list[np.ndarray] = []
        self._outputs: list[np.ndarray] = []
        self._admitted: list[np.ndarray] = []  # when each completion was first scheduled
        self.num_decisions = 0
        self.timeline: list[DecisionRecord] = []
        self.pool_window: BucketStats | None = None  # the window a warm start would seed (see _refresh)

    def start(self, engine: SimEngine) -> None:
        shape = engine.shape
        limits = EngineLimits(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                              kv_capacity_tokens=engine.kv_total_tokens,
                              max_model_len_tokens=shape.max_model_len_tokens)
        self.start_with(EngineHello(engine_id="twin", model="twin", accelerator="twin", vllm_version="",
                                    agent_version="", limits=limits, block_size_tokens=0))
        self._apply(engine, self.connect(now_s=engine.now_s), engine.now_s)
        self._next_telemetry_s = engine.now_s + self._settings.telemetry_interval_s

    def start_with(self, hello: EngineHello) -> None:
        """Set up the loop for an engine described by `hello` (a replay feeds `on_telemetry` itself)."""
        settings = self._settings
        self._loop = EngineLoop(hello=hello, config=settings.loop, policy=settings.policy,
                                budget_sweep=settings.budget_sweep, epoch=0)
        self._pool = PoolStatistics(hello.pool_key, settings.loop, replica_id="twin")

    @property
    def pool(self) -> PoolStatistics | None:
        """The pool statistics."""
        return self._pool

    def _refresh(self, pool: PoolStatistics, now_s: float) -> None:
        """Refresh the pool estimate and keep the window the controller would persist for a warm start (the
        latest fitted from at least min_samples completions): `pool_window`."""
        estimate = pool.refresh(now_s, calibration=self._costs)
        if estimate.num_samples >= self._settings.policy.min_samples and not estimate.fit_held:
            self.pool_window = pool.last_window

    def after_step(self, engine: SimEngine, step: SimStep) -> None:
        finished = step.finished
        if finished.size:
            prompts, outputs = engine.lengths_of(finished)
            self._prompts.append(np.asarray(prompts, dtype=np.float64))
            self._outputs.append(np.asarray(outputs, dtype=np.float64))
            self._admitted.append(engine.admitted_of(finished))
        if engine.now_s >= self._next_telemetry_s:
            self._telemetry(engine)

    def _telemetry(self, engine: SimEngine) -> None:
        now_s = engine.now_s
        self._next_telemetry_s = max(self._next_telemetry_s + self._settings.telemetry_interval_s, now_s)
        prompts = np.concatenate(self._prompts) if self._prompts else _EMPTY
        outputs = np.concatenate(self._outputs) if self._outputs else _EMPTY
        admitted = np.concatenate(self._admitted) if self._admitted else _EMPTY
        self._prompts.clear()
        self._outputs.clear()
        self._admitted.clear()
        self._seq += 1
        running_lengths, running_counts, running_admitted = running_length_entries(
            engine.running_output_tokens().tolist(), engine.running_admitted_s().tolist())
        batch = ValidatedBatch(
            seq=self._seq, prompt_tokens=prompts, output_tokens=outputs, prefill_tokens=_EMPTY, decode_tokens=_EMPTY,
            decode_requests=_EMPTY, duration_s=_EMPTY, num_aborted=0, num_dropped=0,
            kv_used_tokens=int(engine.kv_used_tokens), kv_total_tokens=engine.kv_total_tokens,
            num_running=int(engine.num_running), num_waiting=int(engine.num_waiting),
            num_preemptions=int(engine.num_preemptions), num_events_dropped=0, traceparent="",
            running_lengths=np.asarray(running_lengths, dtype=np.int64),
            running_counts=np.asarray(running_counts, dtype=np.int64),
            admitted_age_s=now_s - admitted, running_admitted_age_s=now_s - np.asarray(running_admitted))
        outcome = self.on_telemetry(batch, now_s=now_s)
        if outcome is not None:
            self._apply(engine, outcome, now_s)

    def connect(self, *, now_s: float) -> LoopOutcome:
        """The decision the controller computes when an engine's stream opens (before any telemetry)."""
        loop, pool = self._loop, self._pool
        if loop is None or pool is None:
            raise RuntimeError("OnlineControl.start() was not called")
        if self._settings.warm_start is not None and pool.estimate is None:
            pool.seed(self._settings.warm_start, now_s=now_s)
            self._refresh(pool, now_s)
        self.num_decisions += 1
        return loop.decide(pool.estimate, intent=self._settings.intent, now_s=now_s, force_push=True)

    def on_telemetry(self, batch: ValidatedBatch, *, now_s: float) -> LoopOutcome | None:
        """The loop's work for one telemetry batch at now_s (what the controller does for one engine, in
        the same order: the pool estimate is refreshed when its end bucket advanced, then the engine is
        decided if due). Returns the computation, or None when nothing was due."""
        loop, pool = self._loop, self._pool
        if loop is None or pool is None:
            raise RuntimeError("OnlineControl.start() was not called")
        if pool.estimate is None or pool.estimate_bucket(now_s) > pool.estimate.end_bucket:
            self._refresh(pool, now_s)
        loop.on_batch(batch, now_s=now_s)
        pool.add(now_s, prompts=batch.prompt_tokens, outputs=batch.output_tokens, steps=None,
                 engine_id=loop.hello.engine_id, running_lengths=batch.running_lengths,
                 running_counts=batch.running_counts, admitted_age_s=batch.admitted_age_s,
                 running_admitted_age_s=batch.running_admitted_age_s)
        if not loop.is_due(now_s):
            return None
        self.num_decisions += 1
        return loop.decide(pool.estimate, intent=self._settings.intent, now_s=now_s)

    def _apply(self, engine: SimEngine, outcome: LoopOutcome, now_s: float) -> None:
        loop = self._loop
        if not outcome.changed or loop is None or loop.current is None:
            engine.enforcer.touch(now_s)
            return
        applied, reason = engine.enforcer.apply(loop.current, now_s=now_s)
        if not applied:  # pragma: no cover - decide() guarantees 1 ≤ k ≤ N ≤ max_num_seqs
            raise RuntimeError(f"the engine refused the core's decision: {reason}")
        self.timeline.append(record_of(loop.current, now_s))
