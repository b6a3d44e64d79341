"""Guarded rollouts, on seeded synthetic throughput: a worse canary is rolled back within minutes, a change
that makes no difference is promoted (rolled back in at most a few percent of runs), a better one promoted
after the minimum observation, and a rolled-back change is not retried during its cooldown."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.types import Mode
from controlplane.loop.rollout import (
    COOLDOWN_S,
    MAX_OBSERVE_S,
    MIN_OBSERVE_S,
    Asked,
    PoolRollouts,
    Verdict,
    canaries,
)

ENGINES = [f"engine-{i}" for i in range(10)]


def _run(rollouts: PoolRollouts, rng: np.random.Generator, *, canary_factor: float, start_s: float = 0.0,
         noise: float = 0.05) -> tuple[Verdict | None, float]:
    """Feed one batch per engine per second (rate 1,000 tokens per busy second, the canaries' × canary_factor,
    each with `noise` relative noise) until a verdict; returns it and its time since the start."""
    asked, rollout = rollouts.asked(ENGINES[0], Mode.EB, lambda: ENGINES, start_s)
    assert rollout is not None and asked == (Asked.CANARY if ENGINES[0] in rollout.canary_ids else Asked.NOTHING)
    for second in range(1, int(2 * MAX_OBSERVE_S) + 2):
        now_s = start_s + second
        for engine in ENGINES:
            rate = 1000.0 * (canary_factor if engine in rollout.canary_ids else 1.0)
            busy_s = 0.8
            rollout.observe(engine, now_s, rate * busy_s * (1 + noise * rng.standard_normal()), busy_s)
        verdict = rollout.evaluate(now_s)
        if verdict is not None:
            rollouts.finish(verdict, now_s)
            return verdict, now_s - start_s
    return None, 2 * MAX_OBSERVE_S


def _established(mode: Mode = Mode.MB) -> PoolRollouts:
    rollouts = PoolRollouts()
    for engine in ENGINES:  # each engine's first data-driven verdict establishes its mode
        assert rollouts.asked(engine, mode, lambda: ENGINES, 0.0) == (Asked.NOTHING, None)
    return rollouts


def test_a_worse_canary_is_rolled_back_within_three_minutes_and_not_retried_during_the_cooldown() -> None:
    rollouts = _established()
    verdict, after_s = _run(rollouts, np.random.default_rng(0), canary_factor=0.9)
    assert verdict == Verdict.ROLLED_BACK and after_s <= 180
    assert rollouts.hold_for("engine-3", after_s) == Mode.MB and set(rollouts.established.values()) == {Mode.MB}
    assert rollouts.asked("engine-1", Mode.EB, lambda: ENGINES, after_s + 10) == (Asked.NOTHING, None)  # blocked
    _, again = rollouts.asked("engine-1", Mode.EB, lambda: ENGINES, after_s + COOLDOWN_S + 1)
    assert again is not None  # tried again later


def test_a_better_canary_is_promoted_after_the_minimum_observation_and_the_others_follow() -> None:
    rollouts = _established()
    verdict, after_s = _run(rollouts, np.random.default_rng(1), canary_factor=1.1)
    assert verdict == Verdict.PROMOTED and MIN_OBSERVE_S <= after_s <= MAX_OBSERVE_S
    control = next(e for e in ENGINES if rollouts.established[e] == Mode.MB)
    assert rollouts.asked(control, Mode.EB, lambda: ENGINES, after_s + 1) == (Asked.SWITCH, None)
    assert rollouts.established[control] == Mode.EB and rollouts.hold_for(control, after_s + 1) == Mode.EB


@pytest.mark.parametrize("seed", range(20))
def test_a_change_that_makes_no_difference_is_not_rolled_back(seed: int) -> None:
    rollouts = _established()
    verdict, _ = _run(rollouts, np.random.default_rng(100 + seed), canary_factor=1.0)
    assert verdict == Verdict.PROMOTED


def test_canaries_are_a_tenth_at_least_one_and_never_the_whole_pool() -> None:
    assert len(canaries(ENGINES, 5.0)) == 1
    assert len(canaries([f"e{i}" for i in range(35)], 5.0)) == 4
    assert len(canaries(["a", "b"], 5.0)) == 1
    assert canaries(ENGINES, 5.0) == canaries(list(reversed(ENGINES)), 5.0)  # order-independent


def test_while_a_rollout_runs_canaries_hold_the_new_mode_and_the_others_their_own() -> None:
    rollouts = _established(Mode.EB)
    rollouts.established["busy"] = Mode.MB  # an engine whose own verdict differs is not a participant
    _, rollout = rollouts.asked("engine-0", Mode.MB, lambda: [*ENGINES, "busy"], 100.0)
    assert rollout is not None and "busy" not in rollout.participants and "busy" not in rollout.canary_ids
    assert rollouts.asked("engine-1", Mode.MB, lambda: ENGINES, 101.0)[1] is None  # one at a time
    for engine in ENGINES:
        assert rollouts.hold_for(engine, 101.0) == (Mode.MB if engine in rollout.canary_ids else Mode.EB)
    assert "canary eb→mb" in rollout.describe(len(ENGINES))
    lone = PoolRollouts()
    lone.asked("only", Mode.MB, lambda: ["only"], 0.0)
    asked, switchback = lone.asked("only", Mode.EB, lambda: ["only"], 1.0)  # one engine: a switchback
    assert asked == Asked.CANARY and switchback is not None and switchback.switchback
