"""Who sets the engine's decision during a twin run: nobody (stock), a fixed decision, or the real core
policy online — the controller's loop without the network.

`OnlineControl` does what `controlplane.service.controller` does for one engine: completions (prompt and
output lengths) go into a `LengthWindow` as they finish; every `telemetry_interval_s` of simulated time the
N_obs EMA takes the running count (the agent's batch cadence); a decision is recomputed after
`recompute_completions` completions or every `interval_s`, by `core.policy.decide` with the profile's
CostModel as the calibrated costs; it is converted with `service.convert.decision_to_proto` and, when the
instruction changed, applied with `Enforcer.apply` at the current simulated time (no latency: the twin's
controller is local). Every applied decision is recorded as a `DecisionRecord` (the timeline).

No I/O, no clock: time is the engine's simulated clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.api.v1 import common_pb2
from controlplane.core.budget import SweepPoint
from controlplane.core.hazard import LengthWindow
from controlplane.core.policy import decide, ema_update
from controlplane.core.types import CostModel, EngineLimits, Observations, OperatorIntent, PolicyConfig, PolicyState
from controlplane.service.config import DecisionLoopConfig
from controlplane.service.convert import decision_to_proto, same_instruction
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
    the telemetry cadence (seconds of simulated time) and an optional P-PAS budget sweep."""

    loop: DecisionLoopConfig = field(default_factory=DecisionLoopConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    intent: OperatorIntent = field(default_factory=OperatorIntent)
    telemetry_interval_s: float = 1.0
    budget_sweep: Sequence[SweepPoint] = ()


class OnlineControl:
    """The controller's decision loop for one engine, run on the twin's clock (see the module docstring)."""

    def __init__(self, costs: CostModel, settings: OnlineSettings | None = None) -> None:
        self._costs = costs
        self._settings = settings = settings or OnlineSettings()
        self._window = LengthWindow(output_window=settings.loop.output_window,
                                    prompt_window=settings.loop.prompt_window)
        self._state = PolicyState()
        self._limits: EngineLimits | None = None
        self._n_obs = 0.0
        self._n_obs_at_s = -1.0
        self._next_telemetry_s = 0.0
        self._last_decided_s = float("-inf")
        self._completions_since = 0
        self._preemptions_at_decision = 0
        self._version = 0
        self._current: common_pb2.Decision | None = None
        self.num_decisions = 0
        self.timeline: list[DecisionRecord] = []

    def start(self, engine: SimEngine) -> None:
        shape = engine.shape
        self._limits = EngineLimits(max_num_seqs=shape.max_num_seqs,
                                    max_num_batched_tokens=shape.max_num_batched_tokens,
                                    kv_capacity_tokens=engine.kv_total_tokens,
                                    max_model_len_tokens=shape.max_model_len_tokens)
        self._next_telemetry_s = engine.now_s
        self._telemetry(engine)

    def after_step(self, engine: SimEngine, step: SimStep) -> None:
        finished = step.finished
        if finished.size:
            prompts, outputs = engine.lengths_of(finished)
            self._window.add_completions(prompts, outputs)
            self._completions_since += finished.size
        if engine.now_s >= self._next_telemetry_s:
            self._telemetry(engine)

    def _telemetry(self, engine: SimEngine) -> None:
        now_s = engine.now_s
        interval = self._settings.telemetry_interval_s
        self._next_telemetry_s = max(self._next_telemetry_s + interval, now_s)
        running = float(engine.num_running)
        if self._n_obs_at_s < 0.0:
            self._n_obs = running
        else:
            self._n_obs = ema_update(self._n_obs, running, dt_s=now_s - self._n_obs_at_s,
                                     time_constant_s=self._settings.loop.n_obs_time_constant_s)
        self._n_obs_at_s = now_s
        loop = self._settings.loop
        if self._completions_since >= loop.recompute_completions or now_s - self._last_decided_s >= loop.interval_s:
            self._decide(engine)

    def _decide(self, engine: SimEngine) -> None:
        now_s = engine.now_s
        settings = self._settings
        assert self._limits is not None
        observations = Observations(
            output_lengths_tokens=self._window.output_lengths(), prompt_lengths_tokens=self._window.prompt_lengths(),
            costs=self._costs, limits=self._limits, n_obs=self._n_obs,
            num_preemptions=engine.num_preemptions - self._preemptions_at_decision)
        self._preemptions_at_decision = engine.num_preemptions
        decision, self._state = decide(observations, self._state, now_s, intent=settings.intent,
                                       config=settings.policy, budget_sweep=settings.budget_sweep)
        self._last_decided_s = now_s
        self._completions_since = 0
        self.num_decisions += 1
        candidate = decision_to_proto(decision, version=self._version + 1, ttl_s=settings.loop.ttl_s,
                                      decided_at_s=now_s, trace_id="")
        if self._current is not None and same_instruction(self._current, candidate):
            engine.enforcer.touch(now_s)
            return
        applied, reason = engine.enforcer.apply(candidate, now_s=now_s)
        if not applied:  # pragma: no cover - decide() guarantees 1 ≤ k ≤ N ≤ max_num_seqs
            raise RuntimeError(f"the engine refused the core's decision: {reason}")
        self._version += 1
        self._current = candidate
        self.timeline.append(record_of(candidate, now_s))

