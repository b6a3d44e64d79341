"""Who sets the engine's decision during a twin run: nobody (stock), a fixed decision, or the real core
policy online — the controller's loop without the network.

`OnlineControl` runs the controller's own fleet state machine (`controlplane.loop.FleetState`: engines,
pools, probation and judging, the calibration's precedence) on the simulated clock: every
`telemetry_interval_s` the completions since the last batch are fed as one batch (the agent's cadence) with
the running requests' output lengths so far, binned as the agent bins them (`agents.running_lengths`), the
pool's estimate is refreshed when a statistics bucket settles, and a decision due is computed with the
profile's CostModel as the pool calibration and, when the instruction changed, applied with
`Enforcer.apply` at the current simulated time (no network latency). Every applied decision is recorded as a
`DecisionRecord` (the timeline).

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
from controlplane.loop.buckets import BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.engine import EngineLoop
from controlplane.loop.fleet import Effects, FleetState
from controlplane.loop.ingest import EngineHello, Latencies, ValidatedBatch
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.protocol import KvRole
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
    flags: tuple[str, ...] = ()


def record_of(decision: common_pb2.Decision, at_s: float) -> DecisionRecord:
    d = decision.diagnostics
    return DecisionRecord(
        at_s=at_s, mode=common_pb2.Mode.Name(decision.mode).removeprefix("MODE_").lower(), k=decision.k,
        n=decision.n, b_max_tokens=decision.budget.b_max_tokens, b_cap_tokens=decision.budget.b_cap_tokens,
        reason=decision.reason, theta_star=d.theta_star, n_star=d.n_star, lhs_s_per_token=d.lhs_s_per_token,
        rhs_s_per_token=d.rhs_s_per_token, n_obs=d.n_obs, flags=tuple(decision.flags))


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
    the telemetry cadence (seconds of simulated time), an optional P-PAS budget sweep, an optional
    persisted pool window to start from (warm start, as the controller seeds a pool from its snapshot), the
    engine's role in disaggregated prefill/decode (its Hello's: the pool key and what the policy steers), and
    whether its mode changes are guarded (a switchback, `loop.rollout`; off by default: the twin's one engine
    follows EB+ at once, as the papers' runs it reproduces)."""

    loop: DecisionLoopConfig = field(default_factory=DecisionLoopConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    intent: OperatorIntent = field(default_factory=OperatorIntent)
    telemetry_interval_s: float = 1.0
    budget_sweep: Sequence[SweepPoint] = ()
    warm_start: BucketStats | None = None
    kv_role: KvRole = KvRole.NONE
    guard_rollouts: bool = False


_EMPTY = np.zeros(0)


def latencies_of(engine: SimEngine, ids: np.ndarray, finish_s: np.ndarray) -> Latencies:
    """The latencies an agent's stamps give for the twin's finished requests `ids` (finished at `finish_s`):
    time to first token, time per output token after the first (requests of two or more tokens), queue wait."""
    arrival, first = engine.stamps_of(ids)
    outputs = engine.lengths_of(ids)[1].astype(np.float64)
    several = outputs >= 2
    return Latencies(ttft_s=first - arrival, tpot_s=(finish_s - first)[several] / (outputs[several] - 1.0),
                     queue_s=engine.admitted_of(ids) - arrival, num_dropped=0)


class OnlineControl:
    """The controller's fleet state machine for one engine, run on the twin's clock (see the module docstring).

    It drives the same object the controller does — a `loop.FleetState` holding the engine and its
    (one-engine) pool — with the same events in the same order: each telemetry interval the pool's due
    bucket closes and its estimate is refreshed when its end bucket advanced, then one batch (the
    completions and steps since the last one, the running count and lengths, the preemption counter) goes
    to `FleetState.batch`, which judges it, adds it to the pool and decides when due. The profile's CostModel
    is the pool's calibration.
    """

    def __init__(self, costs: CostModel, settings: OnlineSettings | None = None) -> None:
        self._costs = costs
        self._settings = settings = settings or OnlineSettings()
        self._fleet: FleetState | None = None
        self._hello: EngineHello | None = None
        self._stream = object()  # the twin's one stream
        self._next_telemetry_s = 0.0
        self._seq = 0
        self._prompts: list[np.ndarray] = []
        self._outputs: list[np.ndarray] = []
        self._admitted: list[np.ndarray] = []  # when each completion was first scheduled
        self._latencies: list[Latencies] = []  # each finished step's completions' latencies, as the agent stamps them
        self.num_decisions = 0
        self.timeline: list[DecisionRecord] = []
        self.pool_window: BucketStats | None = None  # the window a warm start would seed (see _refresh)

    def start(self, engine: SimEngine) -> None:
        shape = engine.shape
        limits = EngineLimits(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                              kv_capacity_tokens=engine.kv_total_tokens,
                              max_model_len_tokens=shape.max_model_len_tokens)
        self.start_with(EngineHello(engine_id="twin", model="twin", accelerator="twin", vllm_version="",
                                    agent_version="", limits=limits, block_size_tokens=0,
                                    kv_role=self._settings.kv_role))
        self._apply(engine, self.connect(now_s=engine.now_s), engine.now_s)
        self._next_telemetry_s = engine.now_s + self._settings.telemetry_interval_s

    def start_with(self, hello: EngineHello) -> None:
        """Set up the machine for an engine described by `hello` (a replay feeds `on_telemetry` itself)."""
        settings = self._settings
        self._hello = hello
        self._fleet = FleetState(settings.loop, settings.policy, replica_id="twin", budget_sweep=settings.budget_sweep,
                                 default_intent=settings.intent, guard_rollouts=settings.guard_rollouts)
        self._fleet.set_calibration(hello.pool_key, self._costs, 0.0, refresh=False)

    @property
    def pool(self) -> PoolStatistics | None:
        """The pool statistics."""
        pool = self._fleet.pool(self._hello.pool_key) if self._fleet is not None else None
        return pool.stats if pool is not None else None

    @property
    def loop(self) -> EngineLoop | None:
        """The engine's decision loop."""
        record = self._fleet.engine(self._hello.engine_id) if self._fleet is not None else None
        return record.loop if record is not None else None

    def _refresh(self, now_s: float) -> None:
        """Refresh the pool's estimate when its end bucket advanced, as the controller's pool sync does (the
        refresh closes the due bucket itself); keep the window the controller would persist for a warm start
        (the latest fitted from at least min_samples completions): `pool_window`."""
        fleet, key = self._fleet, self._hello.pool_key
        if fleet.refresh_due(key, now_s) is None:
            return
        estimate = fleet.refresh_pool(key, now_s)
        if estimate.num_samples >= self._settings.policy.min_samples and not estimate.fit_held:
            self.pool_window = fleet.pool(key).stats.last_window

    def after_step(self, engine: SimEngine, step: SimStep) -> None:
        finished = step.finished
        if finished.size:
            prompts, outputs = engine.lengths_of(finished)
            self._prompts.append(np.asarray(prompts, dtype=np.float64))
            self._outputs.append(np.asarray(outputs, dtype=np.float64))
            self._admitted.append(engine.admitted_of(finished))
            self._latencies.append(latencies_of(engine, finished, np.full(finished.size, step.end_s)))
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
        latencies = Latencies(*(np.concatenate([getattr(x, name) for x in self._latencies]) if self._latencies
                                else _EMPTY for name in ("ttft_s", "tpot_s", "queue_s")), num_dropped=0)
        self._latencies.clear()
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
            admitted_age_s=now_s - admitted, running_admitted_age_s=now_s - np.asarray(running_admitted),
            latencies=latencies)
        self._apply(engine, self.on_telemetry(batch, now_s=now_s), now_s)

    def _machine(self) -> FleetState:
        if self._fleet is None:
            raise RuntimeError("OnlineControl.start() was not called")
        return self._fleet

    def connect(self, *, now_s: float) -> Effects:
        """The engine's stream opens (before any telemetry): the decision the controller pushes then."""
        fleet, hello = self._machine(), self._hello
        fleet.attach(hello, identity="twin", epoch=0, stream=self._stream, now_s=now_s)
        if fleet.pool(hello.pool_key).stats.estimate is None:
            fleet.seed_pool(hello.pool_key, self._settings.warm_start, now_s)
            self._refresh(now_s)
        effects = fleet.first_decision(hello.engine_id, self._stream, now_s)
        self.num_decisions += effects.num_computed
        return effects

    def on_telemetry(self, batch: ValidatedBatch, *, now_s: float) -> Effects:
        """The machine's work for one telemetry batch at now_s, in the controller's order (the pool sync,
        then the batch). `Effects.decided` holds the new version, if any."""
        fleet = self._machine()
        self._refresh(now_s)
        effects = fleet.batch(self._hello.engine_id, self._stream, batch, now_s)
        self.num_decisions += effects.num_computed
        return effects

    def _apply(self, engine: SimEngine, effects: Effects, now_s: float) -> None:
        loop = self.loop
        if not effects.num_computed:
            return
        if not effects.decided or loop is None or loop.current is None:
            engine.enforcer.touch(now_s)
            return
        applied, reason = engine.enforcer.apply(loop.current, now_s=now_s)
        if not applied:  # pragma: no cover - decide() guarantees 1 ≤ k ≤ N ≤ max_num_seqs
            raise RuntimeError(f"the engine refused the core's decision: {reason}")
        self.timeline.append(record_of(loop.current, now_s))
