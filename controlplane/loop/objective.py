"""Latency objectives: which one a pool is under, and the feedback loop that moves the pool's δ to meet it.

An objective (`LatencyObjective`, set like a δ override, at fleet or pool scope; the pool's own wins) asks
that a TTFT quantile and/or a TPOT quantile of the pool's finished requests stay under a target. δ is the
margin of the EB/MB crossover rule: raising it favours MB, which starts new requests sooner (lower TTFT);
lowering it favours EB, whose decode-only steps are not slowed by prefills (lower TPOT); δ = 0 is the choice
the cost model predicts gives the most output tokens per second. The rule's decision is binary, so δ only
matters where it crosses the pool's LHS − RHS gap, whose scale the loop does not assume.

Each evaluation (at most every EVALUATE_EVERY_S) reads the quantiles over the pool's outcome window:
- a target exceeded: δ moves one step in the direction that lowers that latency;
- every target met with a HYSTERESIS margin: δ moves one step back towards 0 (throughput), never past it;
- otherwise (met, inside the margin): δ holds.
Steps start at FIRST_STEP_S_PER_TOKEN and grow ×STEP_GROWTH while they go the same way, and fall back to the
first step when the direction turns (so a gap of any scale is crossed in a few evaluations, and the loop
settles instead of oscillating: the margin separates the state that tightens from the one that loosens).
TTFT and TPOT exceeded at once pull opposite ways: δ moves for the one exceeded by more.

With δ at the bound on the exceeded target's side, the loop's second lever is P-PAS's budget under pressure,
B_cap (the step budget while prefills queue beside decodes): a TTFT target exceeded doubles it (more prompt
tokens per step: waiting prompts start sooner), a TPOT target exceeded halves it (shorter steps for the running
decodes), one step per evaluation, as a scale of the policy's own B_cap within [1/MAX_BUDGET_SCALE,
MAX_BUDGET_SCALE]; each engine's policy clamps the scaled B_cap to the objective's budget bounds, its B_max
and the agent's floor (`core.policy`). Met with margin, the loop first brings the scale back towards 1 (never
onto the scale that last exceeded a target), then δ towards 0. A target still exceeded with both levers at
their bounds for INFEASIBLE_AFTER evaluations is infeasible: these engines cannot reach it at this load by
scheduling alone (the pool needs more engines), and both stay at their bounds, the configuration with the
lowest latency the loop can reach. An explicit δ override or a pin in force for an engine wins over the
objective (its δ and its budget).

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, DeltaSource, ModePin, OperatorIntent
from controlplane.loop.outcomes import LatencySet
from controlplane.protocol import pool_key_of_message

MIN_REQUESTS = 200  # latencies in the window before a quantile is trusted
HYSTERESIS = 0.1  # loosen only while every quantile is at most (1 − HYSTERESIS) · its target
EVALUATE_EVERY_S = 5.0
FIRST_STEP_S_PER_TOKEN = 1e-6
STEP_GROWTH = 4.0
INFEASIBLE_AFTER = 3
FORGET_VIOLATION_S = 600.0
MIN_QUANTILE, MAX_QUANTILE = 0.5, 0.9999
MAX_TARGET_S = 3600.0
MAX_BUDGET_SCALE = 16.0  # B_cap moves by ×2 steps between 1/16 and 16 times the policy's own


class ObjectiveState(enum.IntEnum):
    """The wire values of `operator_pb2.ObjectiveState`."""

    NO_LATENCY_DATA = operator_pb2.OBJECTIVE_STATE_NO_LATENCY_DATA
    MEETING = operator_pb2.OBJECTIVE_STATE_MEETING
    ADJUSTING = operator_pb2.OBJECTIVE_STATE_ADJUSTING
    INFEASIBLE = operator_pb2.OBJECTIVE_STATE_INFEASIBLE


def delta_bounds(objective: operator_pb2.LatencyObjective) -> tuple[float, float]:
    """(lowest, highest) δ the loop may set, s/token (both 0 in the message: the whole ±limit)."""
    if objective.delta_min_s_per_token == 0.0 and objective.delta_max_s_per_token == 0.0:
        return -DELTA_LIMIT_S_PER_TOKEN, DELTA_LIMIT_S_PER_TOKEN
    return objective.delta_min_s_per_token, objective.delta_max_s_per_token


def objective_problem(objective: operator_pb2.LatencyObjective) -> str | None:
    """What makes an objective invalid, in words; None when it is valid."""
    targets = 0
    for name in ("ttft", "tpot"):
        quantile, target = getattr(objective, f"{name}_quantile"), getattr(objective, f"{name}_target_s")
        if quantile == 0.0 and target == 0.0:
            continue
        targets += 1
        if not MIN_QUANTILE <= quantile <= MAX_QUANTILE:
            return f"{name}_quantile must be in [{MIN_QUANTILE}, {MAX_QUANTILE}], got {quantile}"
        if not (math.isfinite(target) and 0.0 < target <= MAX_TARGET_S):
            return f"{name}_target_s must be in (0, {MAX_TARGET_S:.0f}] seconds, got {target}"
    if not targets:
        return "an objective needs a TTFT or a TPOT target (quantile and target_s)"
    low, high = delta_bounds(objective)
    if not (math.isfinite(low) and math.isfinite(high) and -DELTA_LIMIT_S_PER_TOKEN <= low <= 0.0 <= high
            <= DELTA_LIMIT_S_PER_TOKEN):
        return (f"delta bounds must satisfy -{DELTA_LIMIT_S_PER_TOKEN} <= delta_min_s_per_token <= 0 <= "
                f"delta_max_s_per_token <= {DELTA_LIMIT_S_PER_TOKEN}, got [{low}, {high}]")
    budget_min, budget_max = objective.budget_min_tokens, objective.budget_max_tokens
    if budget_max and budget_min > budget_max:
        return f"budget_min_tokens {budget_min} exceeds budget_max_tokens {budget_max}"
    return None


@dataclass(slots=True)
class ObjectiveTracker:
    """One pool's objective loop (see the module docstring)."""

    objective: operator_pb2.LatencyObjective
    delta_s_per_token: float = 0.0
    budget_cap_scale: float = 1.0  # × the policy's B_cap (a power of 2)
    state: ObjectiveState = ObjectiveState.NO_LATENCY_DATA
    detail: str = "no latency data yet"
    _evaluated_at_s: float = -math.inf
    _direction: int = 0
    _step_s_per_token: float = FIRST_STEP_S_PER_TOKEN
    _at_bound: int = 0
    # The latest δ at which a target was exceeded: loosening approaches it by halves and never reaches it (the
    # margin state then holds instead of cycling across the gap); forgotten after FORGET_VIOLATION_S.
    _violated_delta: float | None = None
    _violated_at_s: float = -math.inf
    _violated_scale: float | None = None  # likewise for the budget scale
    measured_s: dict[str, float] = field(default_factory=dict)

    def intent(self, *, pin: ModePin) -> OperatorIntent:
        """What an engine of the pool is decided with: the loop's δ and B_cap scale within the objective's
        budget bounds, and the pin in force (`pin`)."""
        return OperatorIntent(delta_s_per_token=self.delta_s_per_token, delta_source=DeltaSource.OBJECTIVE, pin=pin,
                              budget_cap_scale=self.budget_cap_scale,
                              budget_min_tokens=self.objective.budget_min_tokens,
                              budget_max_tokens=self.objective.budget_max_tokens)

    def follows(self, objective: operator_pb2.LatencyObjective) -> bool:
        """Whether this loop runs `objective` (the same fields): a changed objective starts a new loop."""
        return self.objective.SerializeToString(deterministic=True) == objective.SerializeToString(deterministic=True)

    @property
    def evaluated(self) -> bool:
        """Whether the loop has run once (a new objective is evaluated as soon as it is set)."""
        return self._evaluated_at_s > -math.inf

    def evaluate(self, now_s: float, latencies: LatencySet | None, *, force: bool = False) -> bool:
        """One step of the loop at now_s over the window's `latencies`; True when δ or the B_cap scale
        changed. Does nothing before EVALUATE_EVERY_S since the last evaluation (unless force)."""
        if not force and now_s - self._evaluated_at_s < EVALUATE_EVERY_S:
            return False
        self._evaluated_at_s = now_s
        excess = self._excess(latencies)
        if not excess:
            self.state, self.detail = ObjectiveState.NO_LATENCY_DATA, (
                f"fewer than {MIN_REQUESTS} requests with latency stamps in the window")
            return False
        worst_name, worst = max(excess.items(), key=lambda item: item[1])
        low, high = delta_bounds(self.objective)
        if now_s - self._violated_at_s > FORGET_VIOLATION_S:
            self._violated_delta = self._violated_scale = None
        if worst > 1.0:
            self._violated_delta, self._violated_scale = self.delta_s_per_token, self.budget_cap_scale
            self._violated_at_s = now_s
            direction = 1 if worst_name == "ttft" else -1
            bound = high if direction > 0 else low
            if self.delta_s_per_token == bound:
                if self._scale_budget(direction):
                    self._at_bound = 0
                    self.state = ObjectiveState.ADJUSTING
                    self.detail = (f"{self._describe(worst_name)}: δ at its bound, B_cap ×{self.budget_cap_scale:g} "
                                   f"of the policy's")
                    return True
                self._at_bound += 1
                if self._at_bound >= INFEASIBLE_AFTER:
                    self.state = ObjectiveState.INFEASIBLE
                    self.detail = (f"{self._describe(worst_name)}: not met with δ at its bound {bound:+.3g} s/token "
                                   f"({'MB' if direction > 0 else 'EB'} favoured as far as allowed) and B_cap "
                                   f"×{self.budget_cap_scale:g}; these engines cannot reach it at this load")
                else:
                    self.state, self.detail = ObjectiveState.ADJUSTING, f"{self._describe(worst_name)}: at the bound"
                return False
            self._at_bound = 0
            self.state, self.detail = ObjectiveState.ADJUSTING, f"{self._describe(worst_name)}: adjusting δ"
            return self._step(direction, low, high)
        self._at_bound = 0
        if worst <= 1.0 - HYSTERESIS and self.budget_cap_scale != 1.0:
            self.state = ObjectiveState.MEETING
            if self._unscale_budget():
                self.detail = f"{self._describe(worst_name)}: met with margin, B_cap back towards the policy's"
                return True
            self.detail = f"{self._describe(worst_name)}: met (B_cap held: the next step would miss the target)"
            return False
        if worst <= 1.0 - HYSTERESIS and self.delta_s_per_token != 0.0:
            self.state = ObjectiveState.MEETING
            self.detail = f"{self._describe(worst_name)}: met with margin, δ back towards throughput"
            return self._loosen(low, high)
        self.state, self.detail = ObjectiveState.MEETING, f"{self._describe(worst_name)}: met"
        self._direction = 0
        return False

    def _excess(self, latencies: LatencySet | None) -> dict[str, float]:
        """measured quantile / target per objective with enough data."""
        excess: dict[str, float] = {}
        self.measured_s = {}
        if latencies is None:
            return excess
        for name in ("ttft", "tpot"):
            quantile = getattr(self.objective, f"{name}_quantile")
            target = getattr(self.objective, f"{name}_target_s")
            sketch = getattr(latencies, name)
            if quantile and target and sketch.count >= MIN_REQUESTS:
                measured = sketch.quantile(quantile)
                self.measured_s[name] = measured
                excess[name] = measured / target
        return excess

    def _describe(self, name: str) -> str:
        quantile = getattr(self.objective, f"{name}_quantile")
        return (f"{name.upper()} p{_percent(quantile)} {self.measured_s[name]:.3g} s against "
                f"{getattr(self.objective, f'{name}_target_s'):.3g} s")

    def _loosen(self, low: float, high: float) -> bool:
        """One step of δ back towards 0, but never onto the δ that last exceeded a target: halfway to it when
        a step would reach it, and not at all once within FIRST_STEP_S_PER_TOKEN of it."""
        current, violated = self.delta_s_per_token, self._violated_delta
        direction = -1 if current > 0 else 1
        before = self._direction, self._step_s_per_token
        changed = self._step(direction, low, high, toward_zero=True)
        if violated is not None and (self.delta_s_per_token - violated) * direction >= 0 \
                and (current - violated) * direction < 0:
            self._direction, self._step_s_per_token = before
            if abs(current - violated) <= FIRST_STEP_S_PER_TOKEN:
                self.delta_s_per_token = current
                self.detail += " (held: the next step would miss the target)"
                return False
            self.delta_s_per_token = (current + violated) / 2.0
            return True
        return changed

    def _scale_budget(self, direction: int) -> bool:
        """Double (direction +1: TTFT) or halve (−1: TPOT) the B_cap scale; False at its bound."""
        moved = min(MAX_BUDGET_SCALE, max(1.0 / MAX_BUDGET_SCALE, self.budget_cap_scale * 2.0 ** direction))
        changed = moved != self.budget_cap_scale
        self.budget_cap_scale = moved
        return changed

    def _unscale_budget(self) -> bool:
        """One ×2 step of the B_cap scale back towards 1, unless it lands on the scale that last exceeded a
        target (then held)."""
        moved = self.budget_cap_scale / 2.0 if self.budget_cap_scale > 1.0 else self.budget_cap_scale * 2.0
        if moved == self._violated_scale:
            return False
        self.budget_cap_scale = moved
        return True

    def _step(self, direction: int, low: float, high: float, *, toward_zero: bool = False) -> bool:
        if direction == self._direction:
            self._step_s_per_token *= STEP_GROWTH
        else:
            self._step_s_per_token = FIRST_STEP_S_PER_TOKEN
        self._direction = direction
        moved = self.delta_s_per_token + direction * self._step_s_per_token
        if toward_zero and (moved > 0) != (self.delta_s_per_token > 0):
            moved = 0.0
        moved = min(high, max(low, moved))
        changed = moved != self.delta_s_per_token
        self.delta_s_per_token = moved
        return changed


def _percent(quantile: float) -> str:
    return f"{100 * quantile:g}"


def sync_tracker(trackers: dict[str, ObjectiveTracker], records: list[operator_pb2.OverrideRecord], pool_key: str,
                 now_s: float) -> ObjectiveTracker | None:
    """The pool's tracker in `trackers`, created, kept (same objective: its δ and state go on) or dropped as
    the objective records in force say."""
    record = objective_for(records, pool_key, now_s=now_s)
    if record is None:
        trackers.pop(pool_key, None)
        return None
    tracker = trackers.get(pool_key)
    if tracker is None or not tracker.follows(record.objective):
        tracker = trackers[pool_key] = ObjectiveTracker(objective=record.objective)
    return tracker


def objective_for(records: list[operator_pb2.OverrideRecord], pool_key: str, *,
                  now_s: float) -> operator_pb2.OverrideRecord | None:
    """The objective record in force for a pool: its pool-scope one, else the fleet's; None when neither."""
    best = None
    for record in records:
        if record.kind != operator_pb2.OVERRIDE_KIND_OBJECTIVE or record.cleared:
            continue
        if record.expires_at_s > 0 and record.expires_at_s <= now_s:
            continue
        kind = record.scope.kind
        if (kind == operator_pb2.SCOPE_KIND_POOL
                and pool_key_of_message(record.scope.pool) == pool_key):
            return record
        if kind == operator_pb2.SCOPE_KIND_FLEET:
            best = record
    return best
