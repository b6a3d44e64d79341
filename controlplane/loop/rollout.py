"""Guarded rollouts: a pool's change of mode goes to a canary subset first, and is promoted or rolled back on
measured throughput.

In a pool of MIN_ENGINES or more connected engines each engine has an established mode: the mode of its first
data-driven verdict, then of each change it was let through (engines of one pool may differ: the crossover
depends on each engine's occupancy). When the model (the crossover rule, δ included) asks an engine for another
mode, a rollout of that change starts among the pool's engines of the same established mode (the
participants): a canary subset of them (CANARY_FRACTION, at least one, at most all but one, chosen by a hash of
the engine ids and the rollout's start, so replicas and restarts pick alike) runs the new mode, the other
participants (the control) hold theirs. One change is under test per pool at a time; other changes wait, held.
Operators' pins and explicit δ overrides bypass it.

Both groups are measured on what they deliver: per engine and per SLICE_S seconds, output (decode) tokens per
busy second (the sum of its steps' decode tokens over the sum of their durations), after WARMUP_S seconds for
the new mode to take hold (engines that report no steps cannot be measured: their change is promoted after
WARMUP_S + 2 · SLICE_S). At each evaluation, once each group has MIN_SLICES slices, the canary's mean rate is
compared with the control's (Welch's statistic over the slices, its bound Z_BOUND taken as the same tail of
Student's t at Welch's degrees of freedom): a canary whose upper bound (mean difference + bound standard
errors) is below −TOLERANCE is rolled back (it is worse by more than the tolerance, with confidence); one whose
lower bound (mean difference − bound standard errors) is above −TOLERANCE after MIN_OBSERVE_S,
or which is not beyond the bound after MAX_OBSERVE_S, is promoted. With Z_BOUND = 3.5 (one-sided 0.023% per look)
and at most MAX_OBSERVE_S / SLICE_S = 36 looks, a change that makes no difference is rolled back with
probability at most 36 × 0.023% ≈ 0.84% (Bonferroni; looks are correlated, so the real rate is lower). A
rolled-back (or aborted) change is not tried again for COOLDOWN_S: the model asking for it meanwhile is
answered by holding the established mode (reason rollout_hold); a promoted one is let through at once for
COOLDOWN_S (the control engines, and any other engine asking for the same change, switch).

A pool under a latency objective also judges its rollouts on the objective's attainment, first: both groups'
finished requests (after WARMUP_S) fill a latency set per group (each engine weighed at most its fair share of its
group's requests, as in the pool's buckets, so no engine's volume decides its group's quantile; its values still
count: a one-engine canary group is what that engine reports), and each quantile q the objective names (TTFT
and/or TPOT) is compared between the groups (`compare_quantile`): the share of each group's requests above the
two groups' pooled q-quantile, by a two-proportion z statistic (the test of Mood's median test, at q; under no
difference both shares are 1 − q). A canary worse by LATENCY_Z on a latency whose target its own quantile misses
is rolled back; one better by LATENCY_Z on a latency whose target the control misses is promoted, at once (the
objective is the constraint under which throughput is maximised, so a change that meets it where the old mode
does not is not held back by the throughput test). While the control misses a target, nothing else promotes the
change: not found better on the objective by MAX_OBSERVE_S, it is rolled back (it did not help the objective);
a throughput loss still rolls it back at once. Otherwise (both groups meet the targets) the throughput rules above
decide. Each latency is tested once LATENCY_MIN_TAIL requests of each
group lie beyond the quantile; LATENCY_Z = Z_BOUND, so a change that makes no difference is rolled back (or
promoted) on a latency with probability at most 36 × 0.023% ≈ 0.84% per latency, as on throughput.

A change asked of the only engine of its established mode (a one-engine pool, say) cannot be compared across
engines: it is tested by a switchback instead. The engine alternates between the two modes in periods of
SWITCH_PERIOD_S, in the order new, old, old, new (repeated: ABBA, so a steady drift of the load weighs on both
modes alike), the first SWITCH_SETTLE_S of each period not measured (the mode takes hold, the requests of the
other mode's period drain); the new mode's periods are the canary group, the old mode's the control, and the
same tests decide, over up to SWITCHBACK_MAX_OBSERVE_S (half of it on each mode; at least SWITCHBACK_MIN_OBSERVE_S
before a promotion on throughput). A challenge's switchback (below) alternates in longer periods, CHALLENGE_PERIOD_S
with CHALLENGE_SETTLE_S not measured: a mode's throughput takes over a minute to leave the other mode's state behind
(in the twin, a one-engine pool whose EB delivers 5.7% more than MB measured +3–4% in 30-second periods, +4.6–5.8%
in 120-second ones), so short periods understate a difference, which a challenge must show; a change the model asks
for keeps the short periods, whose rollback of a worse mode is due within minutes. Its false-rollback rate is
stated as the canary's, with up to SWITCHBACK_MAX_OBSERVE_S / SLICE_S = 72 looks: at most 72 × 0.023% ≈ 1.7% per
test; slices of one engine share its load's swings, which the alternation spreads over both groups but does not
remove.

A model can also be wrong from a pool's start (a calibration that was never right, step costs the linear model
cannot represent): the change it never asks for is never tested. So a pool's established mode is challenged: a
CHALLENGE_AFTER_S after the pool's first data-driven verdict, and then every CHALLENGE_EVERY_S after the last
verdict, a rollout of the other mode starts among the engines of the pool's most common established mode (a
canary subset, or a switchback on a lone engine), though the model does not ask for it (`PoolRollouts.challenge`;
pools without a latency objective, whose own loop explores the modes). A challenge is promoted only when the
other mode is better by more than TOLERANCE with confidence: its lower bound above +TOLERANCE after the minimum
observation, looked at once every CHALLENGE_LOOK_S (not every slice) with the bound Z_CHALLENGE = 3.1 (one-sided
0.097% per look; at most LONGEST_OBSERVE_S / CHALLENGE_LOOK_S = 18 looks for a switchback, 9 for a canary subset:
a mode exactly TOLERANCE better is promoted with probability at most 18 × 0.097% ≈ 1.7%, resp. 0.9%, and one that
makes no difference far less). It is rolled back as soon as it cannot be better (upper bound, at Z_BOUND, below
+TOLERANCE), or at the longest observation unless it is promising then (its measured difference above
+TOLERANCE): a promising challenge runs on, up to CHALLENGE_EXTENSION times the longest observation, while it stays
promising (one engine's slices are noisy: a mode 5% better is seldom shown better by 1% with confidence within a
switchback's usual six minutes). A rollback holds nothing off: should the model later ask for that mode, the change
is tested then.
Promoted, every participant's established mode becomes the other one, held there while the model still asks for
its own (reason rollout_hold), whose change back is held off for CHALLENGE_EVERY_S (the next challenge tests that
very change). Its cost is the canaries' share of the difference for about a minute per CHALLENGE_EVERY_S (a lone
engine's: half the difference, while it runs, up to LONGEST_OBSERVE_S).

Replicas holding engines of one pool agree on its rollout: one owns it, and its verdict holds on all of them
(`loop.rollout_peers`).

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from controlplane.api.v1 import operator_pb2
from controlplane.core.latency_sketch import LatencySketch, bucket_indices
from controlplane.core.types import OTHER_MODE, DeltaSource, Mode, ModePin, OperatorIntent, Reason
from controlplane.loop.buckets import fair_share_cap
from controlplane.loop.outcomes import LatencySet, objective_targets

MIN_ENGINES = 2
CANARY_FRACTION = 0.1
SLICE_S = 5.0
WARMUP_S = 10.0
MIN_SLICES = 8  # per group before any verdict
MIN_OBSERVE_S = 60.0
MAX_OBSERVE_S = 180.0
TOLERANCE = 0.01
Z_BOUND = 3.5
COOLDOWN_S = 600.0
MIN_BUSY_S = 0.5  # a slice with less stepping says nothing about throughput
LATENCY_Z = Z_BOUND
LATENCY_MIN_TAIL = 5  # requests beyond the quantile, per group, before its interval is trusted
SWITCH_PERIOD_S = 30.0  # a switchback's period: its engine runs one mode throughout
SWITCH_SETTLE_S = WARMUP_S  # the start of each period, not measured
CHALLENGE_PERIOD_S = 120.0  # a challenge's switchback period (not time-critical: less carry-over, `Rollout`)
CHALLENGE_SETTLE_S = 15.0
SWITCHBACK_MIN_OBSERVE_S = 2 * MIN_OBSERVE_S
SWITCHBACK_MAX_OBSERVE_S = 2 * MAX_OBSERVE_S
_NEW_PERIODS = (0, 3)  # of each four periods, those a switchback runs the new mode in (ABBA)
CHALLENGE_AFTER_S = 300.0  # a pool's established mode is first challenged this long after its first verdict
CHALLENGE_EVERY_S = 1800.0  # and then this long after the pool's latest rollout verdict
CHALLENGE_LOOK_S = 60.0  # a challenge's promotion is looked at this often
Z_CHALLENGE = 3.1  # the bound of a challenge's promotion (fewer looks than a change's: `Rollout.evaluate`)
CHALLENGE_EXTENSION = 3  # a promising challenge runs on up to this many times its longest observation
LONGEST_CHANGE_S = max(MAX_OBSERVE_S, SWITCHBACK_MAX_OBSERVE_S)  # no rollout of a change the model asked runs longer
LONGEST_OBSERVE_S = CHALLENGE_EXTENSION * LONGEST_CHANGE_S  # no rollout runs longer (a promising challenge)


# Where δ may come from in a guarded pool: an operator's explicit δ override bypasses the guard.
UNGUIDED_SOURCES = (DeltaSource.DEFAULT, DeltaSource.OBJECTIVE)


def held_intent(intent: OperatorIntent, mode: Mode | None) -> OperatorIntent:
    """The intent holding an engine on `mode` for a guarded rollout (unchanged when None): a pin that applies
    only where the model asks for another mode, with reason rollout_hold."""
    if mode is None:
        return intent
    return replace(intent, pin=ModePin(mode=mode, reason=Reason.ROLLOUT_HOLD))


class Verdict(enum.StrEnum):
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"  # the model stopped asking for the change (or an operator aborted it)
    YIELDED = "yielded"  # another replica owns the pool's rollout (`loop.rollout_peers`): neither let through nor held


def canaries(engine_ids: list[str], started_at_s: float) -> frozenset[str]:
    """The canary subset: the first ⌈CANARY_FRACTION · n⌉ (at least 1, at most n − 1) engines in an order
    hashed from their ids and the start time."""
    count = min(len(engine_ids) - 1, max(1, math.ceil(CANARY_FRACTION * len(engine_ids))))
    salt = repr(started_at_s).encode()
    ordered = sorted(engine_ids, key=lambda e: hashlib.blake2b(salt + e.encode(), digest_size=8).digest())
    return frozenset(ordered[:count])


@dataclass(slots=True)
class _Slices:
    """One engine's current slice and its finished slices' rates."""

    start_s: float
    tokens: float = 0.0
    busy_s: float = 0.0
    rates: list[float] = field(default_factory=list)

    def add(self, now_s: float, tokens: float, busy_s: float) -> None:
        if now_s - self.start_s >= SLICE_S:
            if self.busy_s >= MIN_BUSY_S:
                self.rates.append(self.tokens / self.busy_s)
            self.start_s, self.tokens, self.busy_s = now_s, 0.0, 0.0
        self.tokens += tokens
        self.busy_s += busy_s


@dataclass(slots=True)
class Comparison:
    """Canary against control: relative difference of the mean rates and its standard error."""

    canary_rate: float
    control_rate: float
    relative: float
    relative_se: float
    num_canary: int
    num_control: int
    df: float  # Welch–Satterthwaite degrees of freedom

    @property
    def z(self) -> float:
        return self.relative / self.relative_se if self.relative_se > 0 else 0.0

    def bound(self, z: float = Z_BOUND) -> float:
        """`z` as a quantile of Student's t with `df` degrees of freedom (the Cornish–Fisher expansion's first
        two terms; ≈ 5.0 at df 9 for Z_BOUND 3.5): few slices widen the bound."""
        df = max(self.df, 1.0)
        return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def compare(canary: list[float], control: list[float]) -> Comparison | None:
    """Welch's comparison of the two groups' slice rates; None below MIN_SLICES in a group."""
    if len(canary) < MIN_SLICES or len(control) < MIN_SLICES:
        return None
    mean_a, mean_b = sum(canary) / len(canary), sum(control) / len(control)
    if mean_b <= 0:
        return None
    var_a = sum((x - mean_a) ** 2 for x in canary) / (len(canary) - 1)
    var_b = sum((x - mean_b) ** 2 for x in control) / (len(control) - 1)
    part_a, part_b = var_a / len(canary), var_b / len(control)
    se = math.sqrt(part_a + part_b)
    df = ((part_a + part_b) ** 2 / (part_a ** 2 / (len(canary) - 1) + part_b ** 2 / (len(control) - 1))
          if part_a + part_b > 0 else math.inf)
    return Comparison(mean_a, mean_b, (mean_a - mean_b) / mean_b, se / mean_b, len(canary), len(control), df)


@dataclass(frozen=True, slots=True)
class LatencyComparison:
    """One latency's quantile in both groups (s), the objective's target, and the test statistic: z > 0 when
    more of the control's requests than of the canary's lie above the two groups' pooled quantile."""

    name: str
    quantile: float
    target_s: float
    canary_s: float
    control_s: float
    z: float

    @property
    def better(self) -> bool:
        return self.z >= LATENCY_Z

    @property
    def worse(self) -> bool:
        return self.z <= -LATENCY_Z

    def describe(self) -> str:
        return (f"{self.name.upper()} p{100 * self.quantile:g} {self.canary_s:.3g} s against {self.control_s:.3g} s "
                f"(target {self.target_s:.3g} s{', better' if self.better else ', worse' if self.worse else ''})")


def compare_quantile(name: str, quantile: float, target_s: float, canary: LatencySet, control: LatencySet
                     ) -> LatencyComparison | None:
    """The two groups' `name` latency at `quantile`, tested by the share of each group above their pooled
    quantile (a two-proportion z statistic; equal shares, 1 − quantile each, when the distributions are the
    same); None while a group has fewer than LATENCY_MIN_TAIL requests beyond the quantile."""
    mine, theirs = getattr(canary, name), getattr(control, name)
    if not (_tail_is_enough(mine, quantile) and _tail_is_enough(theirs, quantile)):
        return None
    pooled = mine.copy()
    pooled.merge(theirs)
    threshold = int(bucket_indices(np.array([pooled.quantile(quantile)]))[0])
    share_mine, share_theirs = _share_above(mine, threshold), _share_above(theirs, threshold)
    share = (share_mine * mine.count + share_theirs * theirs.count) / (mine.count + theirs.count)
    se = math.sqrt(share * (1.0 - share) * (1.0 / mine.count + 1.0 / theirs.count))
    z = (share_theirs - share_mine) / se if se > 0.0 else 0.0
    return LatencyComparison(name, quantile, target_s, mine.quantile(quantile), theirs.quantile(quantile), z)


def _tail_is_enough(sketch: LatencySketch, quantile: float) -> bool:
    """Whether LATENCY_MIN_TAIL of the sketch's values lie beyond `quantile`: its quantile can be trusted."""
    return sketch.count * (1.0 - quantile) >= LATENCY_MIN_TAIL


def _share_above(sketch: LatencySketch, index: int) -> float:
    indices, counts = sketch.buckets()
    return float(counts[indices > index].sum()) / sketch.count


def latency_comparisons(objective: operator_pb2.LatencyObjective, canary: LatencySet, control: LatencySet
                        ) -> list[LatencyComparison]:
    """Each latency the objective names that both groups have enough requests to compare."""
    compared = [compare_quantile(name, quantile, target, canary, control)
                for name, quantile, target in objective_targets(objective)]
    return [c for c in compared if c is not None]


def latency_verdict(compared: list[LatencyComparison]) -> Verdict | None:
    """ROLLED_BACK when the canary is worse with confidence on a latency whose target it misses; PROMOTED when it
    is better with confidence on one whose target the control misses (and not rolled back); else None."""
    if any(c.worse and c.canary_s > c.target_s for c in compared):
        return Verdict.ROLLED_BACK
    if any(c.better and c.control_s > c.target_s for c in compared):
        return Verdict.PROMOTED
    return None


@dataclass(slots=True)
class Rollout:
    """One change under test in a pool. objective: the pool's latency objective at the start (None: judged on
    throughput alone); latencies: each group's finished requests since the warm-up by engine, while it has one;
    switchback: its one engine (the only canary) alternates between the modes, the groups are its periods on
    each."""

    from_mode: Mode
    to_mode: Mode
    started_at_s: float
    canary_ids: frozenset[str]
    participants: frozenset[str] = frozenset()  # the engines of the change's established mode at its start
    slices: dict[tuple[str, int], _Slices] = field(default_factory=dict)  # (engine, group 0 canary / 1 control)
    last: Comparison | None = None
    objective: operator_pb2.LatencyObjective | None = None
    latencies: tuple[dict[str, LatencySet], dict[str, LatencySet]] = field(default_factory=lambda: ({}, {}))
    last_latency: list[LatencyComparison] = field(default_factory=list)
    switchback: bool = False
    challenge: bool = False  # the model did not ask for it: a periodic challenge of the pool's established mode
    decided_period: int = 0  # the switchback period its engine was last decided for (`loop.fleet`)
    challenge_looks: int = 0  # a challenge's promotion looks made so far (one per CHALLENGE_LOOK_S)
    merged: tuple[LatencySet, LatencySet] | None = field(default=None, repr=False)  # the groups' at the last evaluate

    def period(self, now_s: float) -> int:
        """The switchback period at `now_s` (0 from the start)."""
        return max(0, int((now_s - self.started_at_s) // self.period_s))

    @property
    def period_s(self) -> float:
        """A switchback's period: CHALLENGE_PERIOD_S for a challenge, else SWITCH_PERIOD_S."""
        return CHALLENGE_PERIOD_S if self.challenge else SWITCH_PERIOD_S

    @property
    def settle_s(self) -> float:
        return CHALLENGE_SETTLE_S if self.challenge else SWITCH_SETTLE_S

    def runs_new(self, engine_id: str, now_s: float) -> bool:
        """Whether `engine_id` runs the new mode now: a canary (in a switchback, during the new mode's periods)."""
        if engine_id not in self.canary_ids:
            return False
        return not self.switchback or self.period(now_s) % 4 in _NEW_PERIODS

    def group(self, engine_id: str, now_s: float) -> int | None:
        """Where an engine's data at `now_s` counts: 0 (canary), 1 (control), or None (not a participant, the
        warm-up, a switchback period's settling time)."""
        if now_s - self.started_at_s < WARMUP_S or (self.participants and engine_id not in self.participants):
            return None
        if self.switchback and (now_s - self.started_at_s) % self.period_s < self.settle_s:
            return None
        return 0 if self.runs_new(engine_id, now_s) else 1

    @property
    def min_observe_s(self) -> float:
        return SWITCHBACK_MIN_OBSERVE_S if self.switchback else MIN_OBSERVE_S

    @property
    def max_observe_s(self) -> float:
        return SWITCHBACK_MAX_OBSERVE_S if self.switchback else MAX_OBSERVE_S

    def observe(self, engine_id: str, now_s: float, tokens: float, busy_s: float) -> None:
        group = self.group(engine_id, now_s)
        if group is not None:
            self.slices.setdefault((engine_id, group), _Slices(start_s=now_s)).add(now_s, tokens, busy_s)

    def observe_latencies(self, engine_id: str, now_s: float, latencies: LatencySet) -> None:
        """A participant's finished requests of one batch (ignored without an objective or outside its group)."""
        group = self.group(engine_id, now_s) if self.objective is not None else None
        if group is not None:
            self.latencies[group].setdefault(engine_id, LatencySet.empty()).merge(latencies)

    def group_latencies(self, group: int) -> LatencySet:
        """A group's finished requests (0: canary, 1: control), each engine weighed at most its fair share of the
        group's (`buckets.fair_share_cap`, as in the pool's buckets): an engine's volume is not its vote."""
        per_engine = self.latencies[group]
        cap = fair_share_cap([latencies.count for latencies in per_engine.values()])
        merged = LatencySet.empty()
        for latencies in per_engine.values():
            merged.merge(latencies.thinned(cap) if cap is not None else latencies)
        return merged

    def measured(self, group: int) -> dict[str, float]:
        """The objective's quantiles a group measured (0: canary, 1: control), those it had enough requests for (as
        of the last evaluation, when there was one)."""
        if self.objective is None:
            return {}
        found, latencies = {}, self.merged[group] if self.merged is not None else self.group_latencies(group)
        for name, quantile, _ in objective_targets(self.objective):
            sketch = getattr(latencies, name)
            if _tail_is_enough(sketch, quantile):
                found[name] = sketch.quantile(quantile)
        return found

    def evaluate(self, now_s: float) -> Verdict | None:
        missed = False  # the control misses a target of the pool's objective: only a latency verdict promotes
        if self.objective is not None:
            self.merged = (self.group_latencies(0), self.group_latencies(1))
            self.last_latency = latency_comparisons(self.objective, *self.merged)
            verdict = latency_verdict(self.last_latency)
            if verdict is not None:
                return verdict
            missed = any(c.control_s > c.target_s for c in self.last_latency)
        canary = [r for (_, g), s in self.slices.items() if g == 0 for r in s.rates]
        control = [r for (_, g), s in self.slices.items() if g == 1 for r in s.rates]
        self.last = compare(canary, control)
        elapsed_s = now_s - self.started_at_s
        # The verdict at the longest observation: a challenge never found better keeps the model's mode.
        settled = Verdict.ROLLED_BACK if missed or self.challenge else Verdict.PROMOTED
        if self.last is None:  # too few slices: none at all (the engines report no steps) cannot be measured
            unmeasured = not self.slices and elapsed_s >= max(WARMUP_S, self.settle_s) + 2 * SLICE_S
            return settled if unmeasured or elapsed_s >= self.max_observe_s else None
        c = self.last
        bar = TOLERANCE if self.challenge else -TOLERANCE  # a challenge must be better, a change not worse
        if c.relative + c.bound() * c.relative_se < bar:
            return Verdict.ROLLED_BACK
        if not missed and elapsed_s >= self.min_observe_s and self._shown_better(c, elapsed_s, bar):
            return Verdict.PROMOTED
        if elapsed_s >= self.max_observe_s and not self._runs_on(c, elapsed_s):
            return settled
        return None

    def _shown_better(self, c: Comparison, elapsed_s: float, bar: float) -> bool:
        """Whether the comparison's lower bound clears `bar`: at every evaluation for a change the model asked
        for (Z_BOUND), at a challenge's looks only, one per CHALLENGE_LOOK_S (Z_CHALLENGE)."""
        if not self.challenge:
            return c.relative - c.bound() * c.relative_se > bar
        if elapsed_s < (self.challenge_looks + 1) * CHALLENGE_LOOK_S:
            return False
        self.challenge_looks = int(elapsed_s // CHALLENGE_LOOK_S)
        return c.relative - c.bound(Z_CHALLENGE) * c.relative_se > bar

    def _runs_on(self, c: Comparison, elapsed_s: float) -> bool:
        """A challenge still promising past its longest observation (its measured difference above
        +TOLERANCE) runs on, up to CHALLENGE_EXTENSION times that."""
        return (self.challenge and c.relative > TOLERANCE
                and elapsed_s < CHALLENGE_EXTENSION * self.max_observe_s)

    def describe(self, num_engines: int) -> str:
        """In words (a switchback's period: the one its engine was last decided for)."""
        if self.switchback:
            mode = self.to_mode if self.decided_period % 4 in _NEW_PERIODS else self.from_mode
            head = (f"switchback {self.from_mode.value}→{self.to_mode.value} since {self.started_at_s:.0f} s on "
                    f"engine {min(self.canary_ids)}, periods of {self.period_s:g} s, period "
                    f"{self.decided_period + 1} runs {mode.value}")
        else:
            head = (f"canary {self.from_mode.value}→{self.to_mode.value} since {self.started_at_s:.0f} s, "
                    f"{len(self.canary_ids)} of {num_engines} engines")
        if self.challenge:
            head = "challenge of the established mode: " + head
        latency = "".join(f", {c.describe()}" for c in self.last_latency)
        c = self.last
        if c is None:
            return head + latency + ", measuring"
        return (f"{head}{latency}, tokens/s per busy second {100 * c.relative:+.1f}% ± {100 * c.relative_se:.1f}% "
                f"({c.num_canary} / {c.num_control} slices)")


class Asked(enum.Enum):
    """What an engine's data-driven verdict asks of the pool's guard (`PoolRollouts.asked`)."""

    NOTHING = "nothing"  # its established mode, a change held (blocked, or another rollout running), or too few
    SWITCH = "switch"  # a change promoted recently: it runs it now (its established mode follows)
    CANARY = "canary"  # a rollout of its change runs (or just started) with this engine as a canary


@dataclass(slots=True)
class PoolRollouts:
    """Each engine's established mode (the mode of its first data-driven verdict, then of each change it was
    let through), the pool's rollout in progress, and the changes rolled back or promoted recently."""

    established: dict[str, Mode] = field(default_factory=dict)
    active: Rollout | None = None
    blocked_until_s: dict[tuple[Mode, Mode], float] = field(default_factory=dict)
    approved_until_s: dict[tuple[Mode, Mode], float] = field(default_factory=dict)
    history: list[Ended] = field(default_factory=list)  # the latest verdicts, oldest first (at most 16)
    peer_owner: str | None = None  # another replica whose rollout of this pool is in progress (`loop.rollout_peers`)
    peer_verdicts_applied: dict[tuple[str, float], float] = field(default_factory=dict)  # (replica, start) → end
    challenge_due_s: float = math.inf  # when the established mode is next challenged (set at the first verdict)
    checked_s: float = 0.0  # when the rollout in progress was last evaluated

    def hold_for(self, engine_id: str, now_s: float) -> Mode | None:
        """The mode an engine is held on (only where the model asks for another): a canary's new mode (a
        switchback's in its new mode's periods), else the engine's established mode; None before its first
        data-driven verdict."""
        active = self.active
        if active is not None and active.runs_new(engine_id, now_s):
            return active.to_mode
        return self.established.get(engine_id)

    def asked(self, engine_id: str, wanted: Mode, engines: Callable[[], list[str]], now_s: float, *,
              objective: operator_pb2.LatencyObjective | None = None) -> tuple[Asked, Rollout | None]:
        """The model asked `engine_id` for `wanted` (a data-driven verdict). A change from the engine's
        established mode is let through when promoted within COOLDOWN_S, held when rolled back within
        COOLDOWN_S or while another change is under test (here, or by another replica: `peer_owner`), and
        otherwise starts a rollout among the pool's engines (`engines()`, called only then) of the same
        established mode, judged also on `objective` (the pool's latency objective, if any): a canary rollout
        among MIN_ENGINES or more, a switchback when the engine is the only one. Returns what the engine runs now
        and the rollout started (None when none started)."""
        established = self.established.setdefault(engine_id, wanted)
        if self.challenge_due_s == math.inf:
            self.challenge_due_s = now_s + CHALLENGE_AFTER_S
        if wanted == established:
            return Asked.NOTHING, None
        change = (established, wanted)
        if self.approved_until_s.get(change, -math.inf) > now_s:
            self.established[engine_id] = wanted
            return Asked.SWITCH, None
        active = self.active
        if active is not None:
            same = (active.from_mode, active.to_mode) == change and active.runs_new(engine_id, now_s)
            return (Asked.CANARY if same else Asked.NOTHING), None
        if self.peer_owner is not None or self.blocked_until_s.get(change, -math.inf) > now_s:
            return Asked.NOTHING, None
        participants = [e for e in engines() if self.established.get(e) == established]
        if engine_id not in participants:
            return Asked.NOTHING, None
        switchback = len(participants) < MIN_ENGINES
        chosen = frozenset(participants) if switchback else canaries(participants, now_s)
        self.active = Rollout(established, wanted, now_s, chosen, frozenset(participants), objective=objective,
                              switchback=switchback)
        return (Asked.CANARY if self.active.runs_new(engine_id, now_s) else Asked.NOTHING), self.active

    def challenge(self, engines: Callable[[], list[str]], now_s: float) -> Rollout | None:
        """Start a challenge of the established mode of most of `engines()` (the pool's engines here; called only
        when one is due and nothing else runs here or at a peer); None otherwise."""
        if self.active is not None or self.peer_owner is not None or now_s < self.challenge_due_s:
            return None
        held = engines()
        modes = [self.established[e] for e in held if self.established.get(e) in OTHER_MODE]
        if not modes:
            return None
        mode = max(OTHER_MODE, key=modes.count)
        change = (mode, OTHER_MODE[mode])
        if max(self.blocked_until_s.get(change, -math.inf), self.approved_until_s.get(change, -math.inf)) > now_s:
            self.challenge_due_s = now_s + CHALLENGE_EVERY_S  # just tested: not again before its cooldown's end
            return None
        participants = [e for e in held if self.established.get(e) == mode]
        switchback = len(participants) < MIN_ENGINES
        chosen = frozenset(participants) if switchback else canaries(participants, now_s)
        self.active = Rollout(*change, now_s, chosen, frozenset(participants), switchback=switchback, challenge=True)
        return self.active

    def tick(self, engines: Callable[[], list[str]], num_connected: int, now_s: float, *, challenge: bool
             ) -> tuple[Rollout | None, bool, Verdict | None]:
        """What the pool's rollouts ask for at now_s, with its `num_connected` engines, those here `engines()`:
        (the challenge started, when `challenge` allows one and it is due; whether to re-decide the pool's
        engines: a challenge started or a switchback's new period; the verdict of the evaluation due every
        SLICE_S, ABORTED with fewer engines connected than the rollout needs). The caller finishes a verdict."""
        started = self.challenge(engines, now_s) if challenge else None
        rollout = self.active
        if rollout is None:
            return None, False, None
        redecide = started is not None
        if rollout.switchback and rollout.period(now_s) != rollout.decided_period:
            rollout.decided_period, redecide = rollout.period(now_s), True
        if now_s - self.checked_s < SLICE_S:
            return started, redecide, None
        self.checked_s = now_s
        enough = num_connected >= (1 if rollout.switchback else MIN_ENGINES)
        return started, redecide, rollout.evaluate(now_s) if enough else Verdict.ABORTED

    def finish(self, verdict: Verdict, now_s: float, *, detail: str = "") -> None:
        """End the rollout in progress: promoted (its change is let through for COOLDOWN_S, its canaries'
        established mode is the new one: `promote`), rolled back or aborted (the change is held off for COOLDOWN_S,
        unless it was a challenge, which the model did not ask for: should it ask later, that change is tested
        then), or yielded to another replica's (neither). The next challenge is due CHALLENGE_EVERY_S after a
        verdict."""
        rollout = self.active
        if rollout is None:
            return
        change = (rollout.from_mode, rollout.to_mode)
        if verdict == Verdict.YIELDED:
            pass
        elif verdict == Verdict.PROMOTED:
            self.promote(change, now_s, challenge=rollout.challenge, engines=rollout.canary_ids)
        elif not rollout.challenge:
            self.blocked_until_s[change] = now_s + COOLDOWN_S
            self.approved_until_s.pop(change, None)
        if verdict != Verdict.YIELDED:
            self.challenge_due_s = now_s + CHALLENGE_EVERY_S
        self.history.append(Ended(rollout, verdict, now_s, detail))
        del self.history[:-16]
        self.active = None

    def promote(self, change: tuple[Mode, Mode], ended_at_s: float, *, challenge: bool,
                engines: Iterable[str] = ()) -> None:
        """A change promoted (here or by a peer) at `ended_at_s`: `engines` (here) take its new mode as
        established, and engines asking for it are let through for COOLDOWN_S. A promoted challenge moves every
        engine here established on its old mode, and holds off the change back (the model, shown wrong with
        confidence, still asks for it) for CHALLENGE_EVERY_S: until the pool's next challenge, which tests that
        very change."""
        self.approved_until_s[change] = ended_at_s + COOLDOWN_S
        self.blocked_until_s.pop(change, None)
        moved = [e for e, mode in self.established.items() if mode == change[0]] if challenge else list(engines)
        for engine_id in moved:
            self.established[engine_id] = change[1]
        if challenge:
            back = (change[1], change[0])
            self.blocked_until_s[back] = ended_at_s + CHALLENGE_EVERY_S
            self.approved_until_s.pop(back, None)

    def forget(self, engine_id: str) -> None:
        """An engine left the pool here."""
        self.established.pop(engine_id, None)


@dataclass(frozen=True, slots=True)
class Ended:
    """A rollout's verdict: `detail` is its comparison in words when it ended."""

    rollout: Rollout
    verdict: Verdict
    ended_at_s: float
    detail: str
