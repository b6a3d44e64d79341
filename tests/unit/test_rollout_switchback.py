"""Switchbacks: a change asked of the only engine of its mode alternates the engine between the two modes in
periods (new, old, old, new, ...), leaves each period's settling time out, and is promoted or rolled back on the
same tests as a canary; through the fleet state machine, a one-engine pool's stale calibration asking for the
worse mode is rolled back and the engine's pushed mode follows the periods."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2
from controlplane.core.types import Mode, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.rollout import (
    SWITCH_PERIOD_S,
    SWITCH_SETTLE_S,
    SWITCHBACK_MAX_OBSERVE_S,
    SWITCHBACK_MIN_OBSERVE_S,
    WARMUP_S,
    Asked,
    PoolRollouts,
    Verdict,
)
from controlplane.loop.rollout_peers import PeerRollout, is_plausible
from controlplane.sim.profiles import H200_QWEN3_8B
from testbench.fleet_drive import POOL_KEY, START_S, attach_engines, run_rates


def _lone(start_s: float = 0.0) -> tuple[PoolRollouts, object]:
    rollouts = PoolRollouts()
    assert rollouts.asked("only", Mode.MB, lambda: ["only"], start_s - 1.0) == (Asked.NOTHING, None)
    asked, rollout = rollouts.asked("only", Mode.EB, lambda: ["only"], start_s)
    assert asked == Asked.CANARY and rollout is not None and rollout.switchback
    return rollouts, rollout


def test_the_engine_alternates_new_old_old_new_and_settling_time_is_not_measured() -> None:
    rollouts, rollout = _lone()
    half = SWITCH_PERIOD_S / 2
    held = [rollouts.hold_for("only", p * SWITCH_PERIOD_S + half) for p in range(8)]
    assert held == [Mode.EB, Mode.MB, Mode.MB, Mode.EB] * 2
    assert [rollouts.asked("only", Mode.EB, lambda: ["only"], p * SWITCH_PERIOD_S + half)[0]
            for p in range(4)] == [Asked.CANARY, Asked.NOTHING, Asked.NOTHING, Asked.CANARY]
    assert rollout.group("only", WARMUP_S - 1) is None  # the warm-up
    assert rollout.group("only", SWITCH_PERIOD_S + SWITCH_SETTLE_S - 1) is None  # a period's settling time
    assert rollout.group("only", SWITCH_PERIOD_S + SWITCH_SETTLE_S + 1) == 1  # the old mode: control
    assert rollout.group("only", 3 * SWITCH_PERIOD_S + SWITCH_SETTLE_S + 1) == 0  # the new mode: canary
    assert rollout.group("other", SWITCH_PERIOD_S + SWITCH_SETTLE_S + 1) is None  # not a participant
    assert "switchback mb→eb" in rollout.describe(1) and "engine only" in rollout.describe(1)


def _run(rollouts: PoolRollouts, rollout, rng: np.random.Generator, *, new_factor: float, noise: float = 0.05
         ) -> tuple[Verdict | None, float]:
    """One batch a second; the engine delivers 1,000 tokens per busy second in the old mode and × new_factor
    in the new one (with `noise`); a step's mode lags a period's start by up to 1 s, as a pushed decision's."""
    for now_s in range(1, int(SWITCHBACK_MAX_OBSERVE_S) + 30):
        mode = rollouts.hold_for("only", now_s - 1.0)
        rate = 1000.0 * (new_factor if mode == Mode.EB else 1.0)
        rollout.observe("only", float(now_s), rate * 0.8 * (1 + noise * rng.standard_normal()), 0.8)
        if now_s % 5 == 0:
            verdict = rollout.evaluate(float(now_s))
            if verdict is not None:
                rollouts.finish(verdict, float(now_s))
                return verdict, float(now_s)
    return None, SWITCHBACK_MAX_OBSERVE_S


def test_a_worse_new_mode_is_rolled_back_and_its_engine_held_on_the_old() -> None:
    rollouts, rollout = _lone()
    verdict, after_s = _run(rollouts, rollout, np.random.default_rng(0), new_factor=0.9)
    assert verdict == Verdict.ROLLED_BACK and after_s <= SWITCHBACK_MAX_OBSERVE_S
    assert rollouts.hold_for("only", after_s + 1) == Mode.MB
    assert rollouts.asked("only", Mode.EB, lambda: ["only"], after_s + 1) == (Asked.NOTHING, None)  # cooldown


def test_a_better_new_mode_is_promoted_after_the_minimum_observation() -> None:
    rollouts, rollout = _lone()
    verdict, after_s = _run(rollouts, rollout, np.random.default_rng(1), new_factor=1.1)
    assert verdict == Verdict.PROMOTED and SWITCHBACK_MIN_OBSERVE_S <= after_s <= SWITCHBACK_MAX_OBSERVE_S
    assert rollouts.established["only"] == Mode.EB and rollouts.hold_for("only", after_s + 40) == Mode.EB


@pytest.mark.parametrize("seed", range(10))
def test_a_new_mode_that_makes_no_difference_is_not_rolled_back(seed: int) -> None:
    rollouts, rollout = _lone()
    verdict, _ = _run(rollouts, rollout, np.random.default_rng(200 + seed), new_factor=1.0)
    assert verdict == Verdict.PROMOTED


def test_a_peer_switchback_in_progress_is_believed_for_its_whole_length() -> None:
    peer = PeerRollout(POOL_KEY, "replica-b", Mode.MB, Mode.EB, started_at_s=1000.0)
    assert is_plausible(peer, 1000.0 + SWITCHBACK_MAX_OBSERVE_S - 1)


def test_a_one_engine_pool_rolls_back_a_stale_calibrations_worse_mode_through_the_fleet() -> None:
    """One engine whose EB delivers 15% less than MB: a calibration that makes the model ask for EB starts a
    switchback; the pushed mode follows the periods, and the change is rolled back (then held)."""
    rng = np.random.default_rng(3)
    loop = DecisionLoopConfig(recompute_completions=1_000_000, interval_s=2.0, ttl_s=60.0)
    fleet = FleetState(loop, PolicyConfig(min_samples=400, cooldown_s=0.0), replica_id="switchback")
    mb_favouring = replace(H200_QWEN3_8B, beta_p_s_per_token=H200_QWEN3_8B.beta_p_s_per_token * 4)
    fleet.set_calibration(POOL_KEY, mb_favouring, START_S, refresh=False)
    streams = attach_engines(fleet, ["only"], START_S)
    rates = {common_pb2.MODE_MB: 10_000.0, common_pb2.MODE_EB: 8_500.0}
    events: list = []
    modes = []
    for t in range(1, 30 + int(SWITCHBACK_MAX_OBSERVE_S) + 60):
        if t == 30:
            events += [(t, e) for e in fleet.set_calibration(POOL_KEY, H200_QWEN3_8B, START_S + t).rollouts]
        modes.append((t, fleet.engine("only").loop.current.mode))
        run_rates(fleet, streams, t, t, rates, rng, events)
    assert all(mode == common_pb2.MODE_MB for t, mode in modes if t < 30)
    started = [(t, e) for t, e in events if e.event == "started"]
    ended = [(t, e) for t, e in events if e.event != "started"]
    assert len(started) == 1 and started[0][1].to_mode == "eb" and "switchback" in started[0][1].detail, events
    assert ended and ended[0][1].event == "rolled_back", events
    start, end = started[0][0], ended[0][0]
    assert end - start <= SWITCHBACK_MAX_OBSERVE_S
    during = [(t - start, mode) for t, mode in modes if start < t <= end]
    eb_share = sum(mode == common_pb2.MODE_EB for _, mode in during) / len(during)
    assert 0.3 <= eb_share <= 0.7, during  # both modes ran, in periods
    assert {mode for t, mode in during if 2 <= t % (4 * SWITCH_PERIOD_S) < SWITCH_PERIOD_S} == {common_pb2.MODE_EB}
    assert {mode for t, mode in during if SWITCH_PERIOD_S + 2 <= t < 3 * SWITCH_PERIOD_S} == {common_pb2.MODE_MB}
    assert all(mode == common_pb2.MODE_MB for t, mode in modes if t > end + 1)  # held on MB afterwards
    assert fleet.engine("only").loop.current.reason == "rollout_hold"
