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

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from controlplane.core.types import DeltaSource, Mode, ModePin, OperatorIntent, Reason

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

    @property
    def bound(self) -> float:
        """Z_BOUND as a quantile of Student's t with `df` degrees of freedom (the Cornish–Fisher expansion's
        first two terms; ≈ 5.0 at df 9 for Z_BOUND 3.5): few slices widen the bound."""
        z, df = Z_BOUND, max(self.df, 1.0)
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


@dataclass(slots=True)
class Rollout:
    """One change under test in a pool."""

    from_mode: Mode
    to_mode: Mode
    started_at_s: float
    canary_ids: frozenset[str]
    participants: frozenset[str] = frozenset()  # the engines of the change's established mode at its start
    slices: dict[str, _Slices] = field(default_factory=dict)
    last: Comparison | None = None

    def observe(self, engine_id: str, now_s: float, tokens: float, busy_s: float) -> None:
        if now_s - self.started_at_s < WARMUP_S or (self.participants and engine_id not in self.participants):
            return
        self.slices.setdefault(engine_id, _Slices(start_s=now_s)).add(now_s, tokens, busy_s)

    def evaluate(self, now_s: float) -> Verdict | None:
        canary = [r for e, s in self.slices.items() if e in self.canary_ids for r in s.rates]
        control = [r for e, s in self.slices.items() if e not in self.canary_ids for r in s.rates]
        self.last = compare(canary, control)
        elapsed_s = now_s - self.started_at_s
        if self.last is None:  # too few slices: none at all (the engines report no steps) cannot be measured
            unmeasured = not self.slices and elapsed_s >= WARMUP_S + 2 * SLICE_S
            return Verdict.PROMOTED if unmeasured or elapsed_s >= MAX_OBSERVE_S else None
        c = self.last
        if c.relative + c.bound * c.relative_se < -TOLERANCE:
            return Verdict.ROLLED_BACK
        if elapsed_s >= MIN_OBSERVE_S and c.relative - c.bound * c.relative_se > -TOLERANCE:
            return Verdict.PROMOTED
        if elapsed_s >= MAX_OBSERVE_S:
            return Verdict.PROMOTED
        return None

    def describe(self, num_engines: int) -> str:
        head = (f"canary {self.from_mode.value}→{self.to_mode.value} since {self.started_at_s:.0f} s, "
                f"{len(self.canary_ids)} of {num_engines} engines")
        c = self.last
        if c is None:
            return head + ", measuring"
        return (f"{head}, tokens/s per busy second {100 * c.relative:+.1f}% ± {100 * c.relative_se:.1f}% "
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

    def hold_for(self, engine_id: str) -> Mode | None:
        """The mode an engine is held on (only where the model asks for another): a canary's new mode, else
        the engine's established mode; None before its first data-driven verdict."""
        active = self.active
        if active is not None and engine_id in active.canary_ids:
            return active.to_mode
        return self.established.get(engine_id)

    def asked(self, engine_id: str, wanted: Mode, engines: Callable[[], list[str]], now_s: float
              ) -> tuple[Asked, Rollout | None]:
        """The model asked `engine_id` for `wanted` (a data-driven verdict). A change from the engine's
        established mode is let through when promoted within COOLDOWN_S, held when rolled back within
        COOLDOWN_S or while another change is under test, and otherwise starts a rollout among the pool's
        engines (`engines()`, called only then) of the same established mode. Returns what the engine runs now
        and the rollout started (None when none started)."""
        established = self.established.setdefault(engine_id, wanted)
        if wanted == established:
            return Asked.NOTHING, None
        change = (established, wanted)
        if self.approved_until_s.get(change, -math.inf) > now_s:
            self.established[engine_id] = wanted
            return Asked.SWITCH, None
        active = self.active
        if active is not None:
            same = (active.from_mode, active.to_mode) == change and engine_id in active.canary_ids
            return (Asked.CANARY if same else Asked.NOTHING), None
        if self.blocked_until_s.get(change, -math.inf) > now_s:
            return Asked.NOTHING, None
        participants = [e for e in engines() if self.established.get(e) == established]
        if len(participants) < MIN_ENGINES:
            return Asked.NOTHING, None
        self.active = Rollout(established, wanted, now_s, canaries(participants, now_s), frozenset(participants))
        return (Asked.CANARY if engine_id in self.active.canary_ids else Asked.NOTHING), self.active

    def finish(self, verdict: Verdict, now_s: float, *, detail: str = "") -> None:
        """End the rollout in progress: promoted (its change is let through for COOLDOWN_S, its canaries'
        established mode is the new one), rolled back or aborted (the change is held off for COOLDOWN_S)."""
        rollout = self.active
        if rollout is None:
            return
        change = (rollout.from_mode, rollout.to_mode)
        if verdict == Verdict.PROMOTED:
            self.approved_until_s[change] = now_s + COOLDOWN_S
            self.blocked_until_s.pop(change, None)
            for engine_id in rollout.canary_ids:
                self.established[engine_id] = rollout.to_mode
        else:
            self.blocked_until_s[change] = now_s + COOLDOWN_S
            self.approved_until_s.pop(change, None)
        self.history.append(Ended(rollout, verdict, now_s, detail))
        del self.history[:-16]
        self.active = None

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
