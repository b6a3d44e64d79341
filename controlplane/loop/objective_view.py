"""What a pool's objective loop sees of the pool besides its latencies (`PoolView`, which `loop.objective` reads):
the mode its engines run and since when, its arrival rate, and the model's latencies per mode at that load.

The mode is the one every connected engine of the pool here was last decided to run (None while they differ,
e.g. during a guarded rollout), since the latest of their changes to it: never, when each still runs the mode it
was first decided with, so a pool that has run one mode from its start is measured at once, its window holding
that mode's requests alone (after a change, the loop waits for the window to hold the new mode's). The arrival
rate per engine is the lower median of this replica's engines of the pool of the requests each finished a second
over about RATE_WINDOW_S (an open-loop pool finishes what arrives; the median, so that one engine's volume cannot
move it). The predictions (`core.latency_model`) use the cost model the pool's steps identify (its online fit, the
calibration for the phases the steps do not cover: a stale calibration must not decide which mode is faster where
the steps measured it), the window's mean prompt and output lengths, and the admission cap N, threshold k and
budgets of one of its engines' current decision. The crossings are where every engine's crossover rule, read from
its current decision's LHS and RHS, leaves its hysteresis band for each mode.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.latency_model import EngineLoad, LatencyPrediction, load_problem, predict
from controlplane.core.types import Mode, PolicyConfig
from controlplane.loop.estimate import PoolEstimate
from controlplane.protocol import MODE_FROM_PROTO

if TYPE_CHECKING:
    from controlplane.loop.records import EngineRecord, PoolRecord
    from controlplane.loop.rollout import Rollout

RATE_WINDOW_S = 60.0
DEFAULT_QUANTILE = 0.99  # a TTFT quantile predicted when the objective names only TPOT


@dataclass(frozen=True, slots=True)
class PoolView:
    """What the loop sees of its pool besides the latencies.

    mode: the mode every engine of the pool runs (None: they differ, or it is not known); mode_since_s: since
    when (controller clock); window_s: the latency window's length (the window holds the mode's requests alone
    `loop.objective`'s DRAIN_S after a window has passed since it began).
    rollout_active: a guarded rollout measures a change of the pool now (the loop holds: its verdict, on the
    objective too, is the measurement); rollout_measured: what its groups measured so far, per mode (both beyond
    the target by HYSTERESIS: infeasible already). predictions: the model's latencies per mode at the pool's load
    (`core.latency_model`; empty: no model); rate_per_s: that load's arrivals per engine (a change by LOAD_CHANGE
    forgets what was measured at the old one). crossing_s_per_token: per mode, the δ beyond which the crossover
    rule of every engine of the pool picks it past its hysteresis band (the largest LHS − RHS + band for MB, the
    smallest LHS − RHS − band for EB), so a step towards a mode crosses the whole pool at once instead of leaving
    engines on both sides of their gaps. waiting_per_engine: how a budget step below the policy's is judged to fall
    behind the prompts' arrivals.
    """

    mode: Mode | None = None
    mode_since_s: float = math.inf
    mode_before: Mode | None = None  # the mode every engine ran before that change (None: not one), and since when
    mode_before_since_s: float = math.inf
    window_s: float = 60.0
    rollout_active: bool = False
    predictions: Mapping[Mode, LatencyPrediction] = field(default_factory=dict)
    rate_per_s: float = 0.0  # arrivals per engine per second (0: not known)
    rollout_measured: Mapping[Mode, Mapping[str, float]] = field(default_factory=dict)
    crossing_s_per_token: Mapping[Mode, float] = field(default_factory=dict)
    waiting_per_engine: float = math.nan  # the median engine's waiting requests, as last reported (nan: unknown)

    def crossing(self, direction: int) -> float | None:
        """The δ past which every engine's rule leaves its hysteresis band for direction's mode (None: unknown)."""
        return self.crossing_s_per_token.get(Mode.MB if direction > 0 else Mode.EB)


@dataclass(slots=True)
class RecentRate:
    """Events a second, exponentially weighted over RATE_WINDOW_S (controller clock): each event adds
    1/RATE_WINDOW_S and the sum decays by e^(−Δt/RATE_WINDOW_S), so a steady rate λ reads λ. A young series is
    read without its bias: the first batch dates the series (its count is not counted: the time it covers is not
    known) and the sum is divided by 1 − e^(−age/RATE_WINDOW_S), so λ reads λ from the second batch on, not
    λ·(1 − e^(−age/RATE_WINDOW_S)) (which moved the pool's rate by LOAD_CHANGE in its first minutes and made the
    objective loop forget what it had measured). Three floats."""

    value_per_s: float = 0.0
    at_s: float = -math.inf
    since_s: float = math.inf  # the first batch's time (inf: none yet)

    def add(self, now_s: float, count: int) -> None:
        if self.since_s == math.inf:
            self.since_s = self.at_s = now_s
            return
        self.value_per_s = self._decayed(now_s) + max(0, count) / RATE_WINDOW_S
        self.at_s = max(self.at_s, now_s)

    def rate_per_s(self, now_s: float) -> float:
        age_s = now_s - self.since_s
        if not age_s > 0.0:  # no batch yet, or only the first
            return 0.0
        return self._decayed(now_s) / -math.expm1(-age_s / RATE_WINDOW_S)

    def _decayed(self, now_s: float) -> float:
        return self.value_per_s * math.exp(-max(0.0, now_s - self.at_s) / RATE_WINDOW_S)


def typical_rate_per_s(rates: list[float]) -> float:
    """The lower median of the engines' rates (0 without engines): one engine's volume cannot move it."""
    return sorted(rates)[(len(rates) - 1) // 2] if rates else 0.0


def unanimous_mode(engines: Iterable[tuple[int | None, float]]) -> tuple[Mode | None, float]:
    """The mode every engine names, of (its wire mode, None or MODE_UNSPECIFIED when undecided; since when it has
    been in force: `EngineLoop.mode_since_s`) pairs, and since when they all have run it (the latest of their
    changes to it; −inf when each runs the mode it was first decided with); (None, inf) when they differ, one is
    undecided or there are none."""
    modes, since_s = set(), -math.inf
    for wire_mode, mode_since_s in engines:
        modes.add(MODE_FROM_PROTO.get(wire_mode))
        since_s = max(since_s, mode_since_s)
    mode = modes.pop() if len(modes) == 1 else None
    return (mode, since_s) if mode in (Mode.MB, Mode.EB) else (None, math.inf)


def predictions(estimate: PoolEstimate | None, decision: common_pb2.Decision | None, rate_per_engine_s: float,
                *, quantile: float) -> dict[Mode, LatencyPrediction]:
    """The model's latencies for EB and MB at the pool's load; empty when something it needs is missing (no
    costs, no lengths yet, no decision, or a load `core.latency_model` refuses)."""
    if estimate is None or decision is None or estimate.costs is None or not decision.HasField("diagnostics"):
        return {}
    costs = estimate.cost_fit.to_cost_model(fallback=estimate.costs) or estimate.costs
    diagnostics = decision.diagnostics
    n = max(1, decision.n)
    load = EngineLoad(arrival_rate_per_s=rate_per_engine_s, mu_l_tokens=diagnostics.mu_l_tokens,
                      mu_o_tokens=diagnostics.mu_o_tokens, max_running=n, k=min(max(1, decision.k), n),
                      b_max_tokens=decision.budget.b_max_tokens, b_cap_tokens=decision.budget.b_cap_tokens)
    if load_problem(load) is not None:
        return {}
    return {mode: predict(mode, costs, load, quantile=quantile) for mode in (Mode.EB, Mode.MB)}


def crossings(decisions: Iterable[common_pb2.Decision | None], policy: PolicyConfig) -> dict[Mode, float]:
    """Per mode, the δ beyond which every data-driven decision's crossover rule picks it past the hysteresis band
    (`core.crossover.select_mode`): max(LHS − RHS + band) for MB, min(LHS − RHS − band) for EB; empty without
    one."""
    to_mb, to_eb = -math.inf, math.inf
    for decision in decisions:
        if decision is None or decision.diagnostics.theta0 <= 0.0:
            continue
        lhs, rhs = decision.diagnostics.lhs_s_per_token, decision.diagnostics.rhs_s_per_token
        band = policy.hysteresis_rel * (abs(lhs) + abs(rhs)) + policy.hysteresis_abs_s_per_token
        to_mb, to_eb = max(to_mb, lhs - rhs + band), min(to_eb, lhs - rhs - band)
    return {Mode.MB: to_mb, Mode.EB: to_eb} if math.isfinite(to_mb) and math.isfinite(to_eb) else {}


def rollout_measured(active: Rollout | None) -> dict[Mode, Mapping[str, float]]:
    """What a rollout's groups measured so far, per mode (those with any quantile)."""
    if active is None:
        return {}
    so_far = {active.to_mode: active.measured(0), active.from_mode: active.measured(1)}
    return {mode: quantiles for mode, quantiles in so_far.items() if quantiles}


def pool_view(pool: PoolRecord, held: list[EngineRecord], objective: operator_pb2.LatencyObjective, now_s: float,
              policy: PolicyConfig) -> PoolView:
    """The objective loop's view of `pool`, whose connected engines here are `held`, decided under `policy`."""
    decisions = [record.loop.current for record in held]
    mode, since_s = unanimous_mode((decision.mode if decision is not None else None, record.loop.mode_since_s)
                                   for decision, record in zip(decisions, held, strict=True))
    before, before_s = unanimous_mode((record.loop.mode_before, record.loop.mode_before_since_s) for record in held)
    rate_s = typical_rate_per_s([record.finished.rate_per_s(now_s) for record in held])
    decision = next((d for d in decisions if d is not None), None)
    active = pool.rollouts.active
    waiting = float(statistics.median(record.loop.num_waiting for record in held)) if held else math.nan
    return PoolView(mode=mode, mode_since_s=since_s, mode_before=before, mode_before_since_s=before_s,
                    window_s=pool.stats.outcomes.window_s,
                    rollout_active=active is not None, rate_per_s=rate_s, rollout_measured=rollout_measured(active),
                    waiting_per_engine=waiting,
                    crossing_s_per_token=crossings(decisions, policy),
                    predictions=predictions(pool.stats.estimate, decision, rate_s,
                                            quantile=objective.ttft_quantile or DEFAULT_QUANTILE))
