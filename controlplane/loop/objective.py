"""Latency objectives: the feedback loop that moves a pool's δ and budget to meet the one it is under (which one
that is, and what makes one valid: `loop.objective_records`).

An objective (`LatencyObjective`, set like a δ override, at fleet or pool scope; the pool's own wins) asks
that a TTFT quantile and/or a TPOT quantile of the pool's finished requests stay under a target. δ is the
margin of the EB/MB crossover rule: raising it favours MB, lowering it favours EB; δ = 0 is the choice the cost
model predicts gives the most output tokens per second. The rule's decision is binary, so δ only matters where
it crosses the pool's LHS − RHS gap.

Each evaluation (at most every EVALUATE_EVERY_S) reads the quantiles over the pool's outcome window:
- a target exceeded beyond the window's sampling error (even the quantile MISS_CONFIDENCE_Z binomial standard
  errors down the ranks is above it: with 3,000 requests a p99 must clear the target at p98.7, with 200 at p97.8):
  δ moves one step towards the mode expected to lower that latency; exceeded within that error, it holds
  (adjusting, nothing moved: one noisy window does not start the levers);
- every target met with a HYSTERESIS margin: δ moves one step back towards 0 (throughput), never past it, and
  not at all while the other mode was measured missing a target (it would only cross back into it);
- otherwise (met, inside the margin): δ holds.
Which mode lowers a latency is not assumed. Per mode the loop keeps what it measured running that mode alone (a
whole latency window of it, DRAIN_S after it began, or a guarded rollout's canary or control group, `learn`), and
the model's prediction at the pool's load (`PoolView.predictions`, `core.latency_model`), corrected by the other
mode's measured / predicted ratio when only that one was measured. δ moves towards the mode whose estimate is lower
by PREDICTION_MARGIN; closer than that with a mode measured, deeper into the mode the pool runs (no switch on
noise); otherwise (no estimates, or neither finite) towards the usual one: MB for TTFT (it starts requests sooner
when prompts are short beside many decodes), EB for TPOT (its decode steps carry no prefill).
Steps start at FIRST_STEP_S_PER_TOKEN and grow ×STEP_GROWTH while they go the same way; when the pool's
crossings are known (`PoolView.crossing`: the δ past which every engine's rule leaves its hysteresis band for a
mode) a step goes at least just past it, so the whole pool changes mode at once; when the pool runs that mode
already and δ is past its crossing, deeper changes no engine's mode: δ goes to its bound at once, and the budget
lever is next. TTFT and TPOT exceeded at once pull opposite ways: δ moves for the one exceeded by more.

After the pool changes mode its window holds the old mode's requests for a while: the window is by completion,
and a request that finishes under the new mode may have had its first token under the old one, so for a window
plus DRAIN_S the loop holds, its state read from what the pool's guarded rollout measured of the new mode, when
one did. Within an evaluation of the switch, a window the old mode had to itself (run a window and a drain before
it) is the old mode's measurement when it has none (a pool's first fitted decision may move it off its cold-start
mode; a promoted rollout's groups measured it already, without the canaries' requests a window holds). While a
guarded rollout of the pool runs it holds too: the rollout judges the change on this objective first
(`loop.rollout`), and its verdict is the measurement.

With δ at the bound on the chosen side, the loop's second lever is P-PAS's budget under pressure, B_cap (the step
budget while prefills queue beside decodes): a TTFT target exceeded doubles it (more prompt tokens per step:
waiting prompts start sooner), a TPOT target exceeded halves it (shorter steps for the running decodes), as a scale
of the policy's own B_cap within [1/MAX_BUDGET_SCALE, MAX_BUDGET_SCALE]; each engine's policy clamps the scaled
B_cap to the objective's budget bounds, its B_max and the agent's floor, and a scale below 1 lowers MB's B_max too
(`core.policy`). Above 1 the scale steps once per evaluation; below 1 a step waits until the window has held
requests under the previous one for a whole window (meanwhile the window measures the previous budget); a step
after which the median engine's waiting requests grew by more than FALL_BEHIND_SHARE of the window's arrivals fell
behind the prompts' arrivals: it is undone, and the scale it returns to is the floor while the load holds. Met with
margin, the loop first brings the scale back towards 1 (never onto the scale that last exceeded a target), then δ
towards 0; it never steps back onto a δ or budget at which a target was exceeded until that is forgotten
(FORGET_VIOLATION_S), and a retry that misses again doubles how long the next is remembered (up to
MAX_VIOLATION_MEMORY_S), so a looser configuration that keeps failing is retried ever more rarely. With both
levers at their bounds and the other mode not yet measured, the loop tries the other mode (explores) before
anything else. Whenever the loop heads for a mode not yet measured (exploring it, or because its
estimate is the lower), if the running mode misses the target by EXPECTED_BEYOND and the other mode's prediction,
corrected by the running mode's measured / predicted ratio, does too, the pool is called infeasible as it heads
there, and stays so until a target is met (the other mode may prove otherwise) or the load moves. A
target still exceeded with both levers at their bounds, the other mode measured, for INFEASIBLE_AFTER evaluations
is infeasible: these engines cannot reach it at this load by scheduling alone (the pool needs more engines), and
the pool stays on the mode measured (or estimated) lowest with both levers at their bounds, the configuration with
the lowest latency the loop found. So is a target both modes were measured beyond by more than HYSTERESIS (a
running rollout's two groups so far count). Measurements are forgotten after MEASURED_TTL_S, or at once when the
arrival rate per engine moves by LOAD_CHANGE, so a pool whose load changed is explored again. An explicit δ
override or a pin in force for an engine wins over the objective (its δ and its budget).

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from controlplane.api.v1 import operator_pb2
from controlplane.core.latency_model import LatencyPrediction
from controlplane.core.types import OTHER_MODE, DeltaSource, Mode, ModePin, OperatorIntent
from controlplane.loop.objective_records import delta_bounds, objective_for
from controlplane.loop.objective_view import PoolView
from controlplane.loop.outcomes import LatencySet, objective_targets

MIN_REQUESTS = 200  # latencies in the window before a quantile is trusted
HYSTERESIS = 0.1  # loosen only while every quantile is at most (1 − HYSTERESIS) · its target
EVALUATE_EVERY_S = 5.0
MISS_CONFIDENCE_Z = 1.645  # a target counts as missed when even the quantile this many standard errors down misses
FIRST_STEP_S_PER_TOKEN = 1e-6
STEP_GROWTH = 4.0
INFEASIBLE_AFTER = 3
FORGET_VIOLATION_S = 600.0
# A target exceeded again within FORGET_VIOLATION_S of forgetting the previous violation (the retry of the looser
# δ or budget failed) doubles how long the next is remembered, up to this; a retry that holds resets it.
MAX_VIOLATION_MEMORY_S = 8 * FORGET_VIOLATION_S
MEASURED_TTL_S = 1800.0  # a mode's measurement is kept this long, unless the pool's load moves
LOAD_CHANGE = 0.25  # a change of the arrival rate per engine by this fraction forgets the modes' measurements
MAX_BUDGET_SCALE = 16.0  # B_cap moves by ×2 steps between 1/16 and 16 times the policy's own
# A mode's estimate (measured, else predicted) must be lower than the other's by this factor for δ to move towards
# it; closer than that δ goes deeper into the mode the pool runs (the estimates cannot tell them apart).
PREDICTION_MARGIN = 1.1
CROSSING_SLACK = 0.25  # a step across the pool's gaps goes past the farthest by this fraction of its size
DRAIN_S = 60.0  # after a switch of mode, and a window, the window holds the new mode's requests alone
# A budget step below the policy's falls behind the prompts' arrivals when, by the end of its settling window, the
# median engine's waiting requests grew by more than FALL_BEHIND_SHARE of the arrivals in that window (and by more
# than FALL_BEHIND_MIN_WAITING): it is undone, and the budget is not lowered past it while the load holds.
FALL_BEHIND_SHARE = 0.1
FALL_BEHIND_MIN_WAITING = 4.0
# A target the running mode misses by this factor, and the other mode's corrected prediction too, is called
# infeasible as the loop heads for that other mode (not after measuring it).
EXPECTED_BEYOND = 1.5
SETTLE_S = 20.0  # a guarded rollout's measurement this long before a switch still speaks for the new mode
_DEFAULT_DIRECTION = {"ttft": 1, "tpot": -1}  # MB starts prompts sooner, EB decodes faster
_MODE_OF_DIRECTION = {1: Mode.MB, -1: Mode.EB}


class Measured(NamedTuple):
    """The objective's quantiles measured running one mode alone (s, by latency name), when, at what load."""

    at_s: float
    quantiles: dict[str, float]
    rate_per_s: float = 0.0  # arrivals per engine per second then (0: not known)


_NOTHING = Measured(-math.inf, {})


class ObjectiveState(enum.IntEnum):
    """The wire values of `operator_pb2.ObjectiveState`."""

    NO_LATENCY_DATA = operator_pb2.OBJECTIVE_STATE_NO_LATENCY_DATA
    MEETING = operator_pb2.OBJECTIVE_STATE_MEETING
    ADJUSTING = operator_pb2.OBJECTIVE_STATE_ADJUSTING
    INFEASIBLE = operator_pb2.OBJECTIVE_STATE_INFEASIBLE


@dataclass(slots=True)
class ObjectiveTracker:
    """One pool's objective loop (see the module docstring).

    measured: per mode, the objective's quantiles the pool measured running it alone (a whole window of that
    mode, or a guarded rollout's group), with when and at what load; forgotten after MEASURED_TTL_S or when the
    load moves by LOAD_CHANGE. predicted: the model's latencies per mode at the latest evaluation (empty without
    a model).
    """

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
    # margin state then holds instead of cycling across the gap); forgotten after _violation_memory_s.
    _violated_delta: float | None = None
    _violated_at_s: float = -math.inf
    _violation_memory_s: float = FORGET_VIOLATION_S
    _forgot_violation_at_s: float = -math.inf  # the latest forgetting, while its retry is judged
    _violated_scale: float | None = None  # likewise for the budget scale
    _budget_changed_at_s: float = -math.inf  # its latest change: it moves again once a window has passed since
    _step_waiting: float = math.nan  # the median engine's waiting requests at the latest step below 1 (nan: judged)
    _budget_floor: float = 0.0  # the lowest scale that kept up with the arrivals, after one fell behind (0: none)
    # Set as the loop heads for a mode not measured yet: why the model expects it to miss the target too. The pool
    # is infeasible until a target is met or the load moves; "" when not expected.
    _expected_infeasible: str = ""
    measured_s: dict[str, float] = field(default_factory=dict)
    _missed_clearly: bool = False  # set by _excess
    measured: dict[Mode, Measured] = field(default_factory=dict)
    predicted: dict[Mode, LatencyPrediction] = field(default_factory=dict)
    _exploring: int = 0  # a direction tried because the other one's bound missed and its mode was not measured
    _seen_mode: Mode | None = None  # the pool's mode at the latest evaluation that saw one
    _rate_per_s: float = 0.0  # the pool's arrivals per engine at the latest evaluation

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

    def evaluate(self, now_s: float, latencies: LatencySet | None, *, force: bool = False,
                 view: PoolView | None = None) -> bool:
        """One step of the loop at now_s over the window's `latencies`, with what `view` shows of the pool (None:
        nothing, the model's default directions); True when δ or the B_cap scale changed. Does nothing before
        EVALUATE_EVERY_S since the last evaluation (unless force)."""
        if not force and now_s - self._evaluated_at_s < EVALUATE_EVERY_S:
            return False
        changed = self._evaluate(now_s, latencies, view)
        if self.state in (ObjectiveState.MEETING, ObjectiveState.NO_LATENCY_DATA):
            self._expected_infeasible = ""
        elif self.state == ObjectiveState.ADJUSTING and (self._expected_infeasible or self._hopeless()):
            self.state = ObjectiveState.INFEASIBLE  # until a target is met, or the load moves
            self.detail += f"; {self._expected_infeasible or f'both modes measured beyond it ({self._basis_all()})'}"
        return changed

    def _evaluate(self, now_s: float, latencies: LatencySet | None, view: PoolView | None) -> bool:
        self._evaluated_at_s = now_s
        view = view if view is not None else PoolView()
        self.predicted = dict(view.predictions)
        self._rate_per_s = view.rate_per_s
        self._forget(now_s)
        if view.rollout_active:
            excess = self._excess(latencies)
            met = bool(excess) and max(excess.values()) <= 1.0
            self.state = ObjectiveState.MEETING if met else ObjectiveState.ADJUSTING
            self.detail = (f"{'met; ' if met else ''}holding while a guarded rollout measures the pool's change (on "
                           f"this objective too)")
            so_far = view.rollout_measured
            if len(so_far) == 2 and all(self._beyond(quantiles) for quantiles in so_far.values()):
                self.state = ObjectiveState.INFEASIBLE
                self.detail = (f"both modes beyond the target in the guarded rollout so far ("
                               f"{', '.join(f'{m.value}{_quantiles_text(q)}' for m, q in so_far.items())}): these "
                               f"engines cannot reach it at this load; holding while it measures")
            return False
        clean = view.mode is not None and now_s - view.mode_since_s >= view.window_s + DRAIN_S
        if view.mode is not None and not clean and self._seen_mode not in (None, view.mode):
            fresh = self._measured_since(view.mode, view.mode_since_s - SETTLE_S)
            self.state = ObjectiveState.MEETING if fresh and not self._misses(view.mode) else ObjectiveState.ADJUSTING
            self.detail = (f"holding: the pool switched to {view.mode.value} {now_s - view.mode_since_s:.0f} s ago; "
                           f"its window holds {self._seen_mode.value}'s requests until "
                           f"{view.window_s + DRAIN_S:.0f} s after{self._measured_text(view.mode)}")
            if fresh and self._hopeless():
                self.state = ObjectiveState.INFEASIBLE
                self.detail = (f"both modes measured beyond the target ({self._basis_all()}): these engines cannot "
                               f"reach it at this load; holding {view.mode.value} while its window clears")
            return False
        excess = self._excess(latencies)
        if not excess:
            self.state, self.detail = ObjectiveState.NO_LATENCY_DATA, (
                f"fewer than {MIN_REQUESTS} requests with latency stamps in the window")
            return False
        self._seen_mode = view.mode if view.mode is not None else self._seen_mode
        # Within an evaluation of a switch from a mode run alone, the window is that mode's (when not measured).
        alone_s = view.mode_since_s - view.mode_before_since_s
        fresh = not clean and now_s - view.mode_since_s <= EVALUATE_EVERY_S and alone_s >= view.window_s + DRAIN_S
        just_left = view.mode_before if fresh and view.mode_before not in self.measured else None
        running = just_left if just_left is not None else view.mode
        if clean or just_left is not None:
            self.measured[running] = Measured(now_s, dict(self.measured_s), view.rate_per_s)
        if self._exploring and _MODE_OF_DIRECTION[self._exploring] in self.measured:
            self._exploring = 0
        worst_name, worst = max(excess.items(), key=lambda item: item[1])
        low, high = delta_bounds(self.objective)
        self._forget_violation(now_s)
        # Below the policy's budget the window must hold requests under the latest step before the next (a budget
        # too small for the prompts' arrivals falls behind, and the TPOT it measures is the old budget's meanwhile);
        # above it steps go at once (a larger B_cap lets the waiting prompts start sooner: overshooting costs TPOT).
        settling_s = view.window_s - (now_s - self._budget_changed_at_s) if self.budget_cap_scale < 1.0 else 0.0
        if settling_s <= 0.0 and self._fell_behind(view, now_s):
            return True
        if worst > 1.0 and not self._missed_clearly:
            self.state = ObjectiveState.ADJUSTING
            self.detail = f"{self._describe(worst_name)}: held (within the window's sampling error of the target)"
            return False
        if worst > 1.0:
            if now_s - self._forgot_violation_at_s <= FORGET_VIOLATION_S:  # the retry after forgetting failed
                self._violation_memory_s = min(MAX_VIOLATION_MEMORY_S, 2.0 * self._violation_memory_s)
                self._forgot_violation_at_s = -math.inf
            self._violated_delta = self.delta_s_per_token
            if settling_s <= 0.0:
                self._violated_scale = self.budget_cap_scale
            self._violated_at_s = now_s
            direction = self._direction_for(worst_name, view.mode)
            bound = high if direction > 0 else low
            if self.delta_s_per_token == bound:
                if settling_s > 0.0:
                    self.state = ObjectiveState.ADJUSTING
                    self.detail = (f"{self._describe(worst_name)}: δ at its bound, B_cap ×{self.budget_cap_scale:g} "
                                   f"of the policy's; held {settling_s:.0f} s more while the window fills with "
                                   f"requests under it")
                    return False
                if self._scale_budget(_DEFAULT_DIRECTION[worst_name], now_s, waiting=view.waiting_per_engine):
                    self._at_bound = 0
                    self.state = ObjectiveState.ADJUSTING
                    self.detail = (f"{self._describe(worst_name)}: δ at its bound, B_cap ×{self.budget_cap_scale:g} "
                                   f"of the policy's")
                    return True
                other = _MODE_OF_DIRECTION[-direction]
                if view.mode is not None and not self._exploring and other not in self.measured:
                    self._exploring, self._at_bound = -direction, 0
                    self._expected_infeasible = self._expected_beyond(other, worst_name, view.mode)
                    self.state = ObjectiveState.ADJUSTING
                    self.detail = (f"{self._describe(worst_name)}: not met at the "
                                   f"{_MODE_OF_DIRECTION[direction].value} bound; trying {other.value}, not measured "
                                   f"yet{self._basis(worst_name)}")
                    return self._step(-direction, low, high, crossing=view.crossing(-direction))
                self._at_bound += 1
                if self._at_bound >= INFEASIBLE_AFTER:
                    self.state = ObjectiveState.INFEASIBLE
                    self.detail = (f"{self._describe(worst_name)}: not met with δ at its bound {bound:+.3g} s/token "
                                   f"({'MB' if direction > 0 else 'EB'} favoured as far as allowed, the lower of the "
                                   f"two{self._basis(worst_name)}) and B_cap ×{self.budget_cap_scale:g}; these "
                                   f"engines cannot reach it at this load")
                else:
                    self.state, self.detail = ObjectiveState.ADJUSTING, f"{self._describe(worst_name)}: at the bound"
                return False
            self._at_bound = 0
            self.state = ObjectiveState.ADJUSTING
            self.detail = (f"{self._describe(worst_name)}: adjusting δ towards "
                           f"{_MODE_OF_DIRECTION[direction].value}{self._basis(worst_name)}")
            heading = _MODE_OF_DIRECTION[direction]
            if running is not None and heading != running and heading not in self.measured:
                self._expected_infeasible = self._expected_beyond(heading, worst_name, running)
            if self._hopeless():
                self.state = ObjectiveState.INFEASIBLE
                self.detail = (f"{self._describe(worst_name)}: both modes measured beyond the target "
                               f"({self._basis_all()}): these engines cannot reach it at this load; δ towards "
                               f"{_MODE_OF_DIRECTION[direction].value}, the lower")
            return self._step(direction, low, high, crossing=view.crossing(direction), in_force=view.mode == heading)
        self._at_bound = 0
        if worst <= 1.0 - HYSTERESIS and self.budget_cap_scale != 1.0:
            self.state = ObjectiveState.MEETING
            if settling_s > 0.0:
                self.detail = (f"{self._describe(worst_name)}: met (B_cap ×{self.budget_cap_scale:g} held "
                               f"{settling_s:.0f} s more while the window fills with requests under it)")
                return False
            if self._unscale_budget(now_s):
                self.detail = f"{self._describe(worst_name)}: met with margin, B_cap back towards the policy's"
                return True
            self.detail = f"{self._describe(worst_name)}: met (B_cap held: the next step would miss the target)"
            return False
        if worst <= 1.0 - HYSTERESIS and self.delta_s_per_token != 0.0:
            self.state = ObjectiveState.MEETING
            other = OTHER_MODE.get(view.mode)
            if other is not None and self._misses(other):
                self.detail = (f"{self._describe(worst_name)}: met (δ held: {other.value} misses the "
                               f"target{self._basis(worst_name)})")
                return False
            self.detail = f"{self._describe(worst_name)}: met with margin, δ back towards throughput"
            return self._loosen(low, high)
        self.state, self.detail = ObjectiveState.MEETING, f"{self._describe(worst_name)}: met"
        self._direction = 0
        return False

    def learn(self, mode: Mode, quantiles: Mapping[str, float], now_s: float, *, rolled_back: bool = False) -> None:
        """What a guarded rollout's group measured running `mode` (the objective's quantiles, those it had
        enough requests for); rolled_back: the canaries' mode missed the objective worse than the control's,
        so loosening never goes back onto the δ in force now."""
        if quantiles:
            self.measured[mode] = Measured(now_s, dict(quantiles), self._rate_per_s)
        if rolled_back:
            self._violated_delta, self._violated_at_s = self.delta_s_per_token, now_s

    def _forget_violation(self, now_s: float) -> None:
        """Forget the latest violation after _violation_memory_s; a retry that held FORGET_VIOLATION_S since
        resets the memory."""
        if self._violated_delta is not None and now_s - self._violated_at_s > self._violation_memory_s:
            self._violated_delta = self._violated_scale = None
            self._forgot_violation_at_s = now_s
        elif self._forgot_violation_at_s > -math.inf and now_s - self._forgot_violation_at_s > FORGET_VIOLATION_S:
            self._violation_memory_s, self._forgot_violation_at_s = FORGET_VIOLATION_S, -math.inf

    def _measured_since(self, mode: Mode, since_s: float) -> bool:
        measured = self.measured.get(mode)
        return measured is not None and measured.at_s >= since_s and bool(measured.quantiles)

    def _measured_text(self, mode: Mode) -> str:
        measured = self.measured.get(mode, _NOTHING).quantiles
        return f"; its rollout measured{_quantiles_text(measured)}" if measured else ""

    def _misses(self, mode: Mode, *, margin: float = 1.0) -> bool:
        """Whether `mode` was measured (recently) above margin × a target of the objective."""
        measured = self.measured.get(mode)
        return measured is not None and self._beyond(measured.quantiles, margin=margin)

    def _beyond(self, quantiles: Mapping[str, float], *, margin: float = 1.0 + HYSTERESIS) -> bool:
        """Whether any of `quantiles` (by latency name) is above margin × its target."""
        return any(value > margin * getattr(self.objective, f"{name}_target_s") for name, value in quantiles.items())

    def _expected_beyond(self, other: Mode, name: str, running: Mode) -> str:
        """Why `other` (not measured) is expected beyond the target of `name` by EXPECTED_BEYOND, in words; "" when
        it is not. Both the running mode's window and the other's estimate must be beyond it by that factor, the
        estimate being the model's prediction corrected by the running mode's measured / predicted ratio (without
        that correction the model alone is not trusted: its error reaches ×2.5 on long prompts)."""
        target = getattr(self.objective, f"{name}_target_s")
        measured, guess, prediction = self.measured_s.get(name), self.predicted.get(running), self.predicted.get(other)
        if measured is None or guess is None or prediction is None or measured <= EXPECTED_BEYOND * target:
            return ""
        guessed, predicted = guess.latency_s(name), prediction.latency_s(name)
        if not (math.isfinite(guessed) and guessed > 0.0 and math.isfinite(predicted)):
            return ""
        expected = predicted * measured / guessed
        if expected <= EXPECTED_BEYOND * target:
            return ""
        return (f"{other.value} expected at {expected:.3g} s ({running.value} measured {measured:.3g} s against its "
                f"predicted {guessed:.3g} s): these engines are not expected to reach it at this load")

    def _hopeless(self) -> bool:
        """Both modes measured beyond a target by more than HYSTERESIS: no mode reaches the objective."""
        return all(self._misses(mode, margin=1.0 + HYSTERESIS) for mode in (Mode.MB, Mode.EB))

    def _basis_all(self) -> str:
        """Every mode's measured quantiles, in words."""
        return ", ".join(f"{mode.value}{_quantiles_text(self.measured.get(mode, _NOTHING).quantiles)}"
                         for mode in (Mode.EB, Mode.MB))

    def _forget(self, now_s: float) -> None:
        rate = self._rate_per_s
        for mode, seen in list(self.measured.items()):
            moved = rate > 0.0 and seen.rate_per_s > 0.0 and abs(rate / seen.rate_per_s - 1.0) > LOAD_CHANGE
            if moved or now_s - seen.at_s > MEASURED_TTL_S:
                del self.measured[mode]
            if moved:
                self._expected_infeasible, self._budget_floor = "", 0.0

    def _estimate(self, mode: Mode, name: str) -> float | None:
        """The latency `name` running `mode`: measured when it was, else the model's prediction corrected by the
        other mode's measured/predicted ratio when that mode was measured; None without either."""
        measured = self.measured.get(mode)
        if measured is not None and name in measured.quantiles:
            return measured.quantiles[name]
        prediction = self.predicted.get(mode)
        if prediction is None:
            return None
        value = prediction.latency_s(name)
        other = OTHER_MODE[mode]
        seen, guess = self.measured.get(other), self.predicted.get(other)
        if math.isfinite(value) and seen is not None and name in seen.quantiles and guess is not None:
            guessed = guess.latency_s(name)
            if math.isfinite(guessed) and guessed > 0.0:
                value *= seen.quantiles[name] / guessed
        return value

    def _direction_for(self, name: str, running: Mode | None) -> int:
        """Which way δ moves for a missed `name`: the direction being explored, else towards the mode whose
        estimate is lower by PREDICTION_MARGIN, else (closer than that, a mode measured) towards the mode
        `running`, else the default (TTFT towards MB, TPOT towards EB; also when neither mode's estimate is
        finite: the model sees no stable mode at the measured load)."""
        if self._exploring:
            return self._exploring
        up, down = self._estimate(Mode.MB, name), self._estimate(Mode.EB, name)
        if up is not None and down is not None and (math.isfinite(up) or math.isfinite(down)):
            if up * PREDICTION_MARGIN < down:
                return 1
            if down * PREDICTION_MARGIN < up:
                return -1
            measured = any(name in self.measured.get(mode, _NOTHING).quantiles for mode in (Mode.MB, Mode.EB))
            if running is not None and measured:
                return 1 if running == Mode.MB else -1
        return _DEFAULT_DIRECTION[name]

    def _basis(self, name: str) -> str:
        """What the direction rests on, in words ("" without estimates)."""
        parts = []
        for mode in (Mode.EB, Mode.MB):
            value = self._estimate(mode, name)
            if value is not None:
                how = "measured" if name in self.measured.get(mode, _NOTHING).quantiles else "predicted"
                parts.append(f"{mode.value} {how} {value:.3g} s")
        return f" ({', '.join(parts)})" if parts else ""

    def _excess(self, latencies: LatencySet | None) -> dict[str, float]:
        """measured quantile / target per objective with enough data; sets measured_s, and _missed_clearly: some
        target exceeded beyond the window's sampling error (the quantile at the rank MISS_CONFIDENCE_Z binomial
        standard errors below the target's is above the target)."""
        excess: dict[str, float] = {}
        self.measured_s, self._missed_clearly = {}, False
        if latencies is None:
            return excess
        for name, quantile, target in objective_targets(self.objective):
            sketch = getattr(latencies, name)
            if sketch.count >= MIN_REQUESTS:
                measured = sketch.quantile(quantile)
                self.measured_s[name] = measured
                excess[name] = measured / target
                lower = quantile - MISS_CONFIDENCE_Z * math.sqrt(quantile * (1.0 - quantile) / sketch.count)
                self._missed_clearly |= measured > target and sketch.quantile(max(0.0, lower)) > target
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

    def _scale_budget(self, direction: int, now_s: float, *, waiting: float = math.nan) -> bool:
        """Double (direction +1: TTFT) or halve (−1: TPOT) the B_cap scale; False at its bound (for a halving, the
        floor a step that fell behind left too). `waiting`: the median engine's waiting requests now, against
        which a step below 1 is judged at the end of its settling window."""
        moved = min(MAX_BUDGET_SCALE, max(1.0 / MAX_BUDGET_SCALE, self.budget_cap_scale * 2.0 ** direction))
        if direction < 0 and moved < self._budget_floor:
            return False
        changed = moved != self.budget_cap_scale
        self.budget_cap_scale = moved
        if changed:
            self._budget_changed_at_s = now_s
            self._step_waiting = waiting if direction < 0 and moved < 1.0 else math.nan
        return changed

    def _fell_behind(self, view: PoolView, now_s: float) -> bool:
        """Once per step below 1, at the end of its settling window: whether the pool fell behind the prompts'
        arrivals under it (see FALL_BEHIND_SHARE); if so the step is undone and its scale's double becomes the
        budget's floor. True when the scale changed."""
        before, self._step_waiting = self._step_waiting, math.nan
        now = view.waiting_per_engine
        if not (math.isfinite(before) and math.isfinite(now)) or self.budget_cap_scale >= 1.0:
            return False
        allowed = max(FALL_BEHIND_MIN_WAITING, FALL_BEHIND_SHARE * view.rate_per_s * view.window_s)
        if now - before <= allowed:
            return False
        fell = self.budget_cap_scale
        self.budget_cap_scale = self._budget_floor = fell * 2.0
        self._budget_changed_at_s = now_s
        self.state = ObjectiveState.ADJUSTING
        self.detail = (f"B_cap ×{fell:g} fell behind the prompts' arrivals (waiting requests per engine {before:.0f} → "
                       f"{now:.0f} in {view.window_s:.0f} s): back to ×{self.budget_cap_scale:g}, not lowered past it "
                       f"while the load holds")
        return True

    def _unscale_budget(self, now_s: float) -> bool:
        """One ×2 step of the B_cap scale back towards 1, unless it lands on the scale that last exceeded a
        target (then held)."""
        moved = self.budget_cap_scale / 2.0 if self.budget_cap_scale > 1.0 else self.budget_cap_scale * 2.0
        if moved == self._violated_scale:
            return False
        self.budget_cap_scale = moved
        self._budget_changed_at_s = now_s
        return True

    def _step(self, direction: int, low: float, high: float, *, toward_zero: bool = False,
              crossing: float | None = None, in_force: bool = False) -> bool:
        """One step of δ in `direction` (growing ×STEP_GROWTH while the direction holds), at least to just past
        `crossing` (the δ that moves every engine of the pool to direction's mode) when it is ahead, and to the
        bound when the pool runs that mode already (in_force) and δ is past `crossing`; within the bounds, and not
        past 0 when toward_zero."""
        if direction == self._direction:
            self._step_s_per_token *= STEP_GROWTH
        else:
            self._step_s_per_token = FIRST_STEP_S_PER_TOKEN
        self._direction = direction
        moved = self.delta_s_per_token + direction * self._step_s_per_token
        if crossing is not None and math.isfinite(crossing) and (crossing - self.delta_s_per_token) * direction >= 0:
            past = crossing + direction * max(CROSSING_SLACK * abs(crossing), FIRST_STEP_S_PER_TOKEN)
            moved = max(moved, past) if direction > 0 else min(moved, past)
        elif in_force and crossing is not None and math.isfinite(crossing):
            moved = high if direction > 0 else low
        if toward_zero and (moved > 0) != (self.delta_s_per_token > 0):
            moved = 0.0
        moved = min(high, max(low, moved))
        changed = moved != self.delta_s_per_token
        self.delta_s_per_token = moved
        return changed


def _quantiles_text(quantiles: Mapping[str, float]) -> str:
    return "".join(f" {name.upper()} {value:.3g} s" for name, value in quantiles.items())


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
