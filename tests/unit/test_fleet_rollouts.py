"""Guarded rollouts through the fleet state machine: a pool of engines whose measured throughput depends on the
mode they run. A stale calibration that makes the model ask for the mode that is worse on these engines is
tried on one canary engine, measured worse, rolled back within three minutes and not retried during the
cooldown; a change that is as good is promoted to the whole pool; an operator's pin bypasses the guard."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.rollout import COOLDOWN_S
from controlplane.sim.profiles import H200_QWEN3_8B
from testbench.fleet_drive import POOL_KEY, START_S, attach_engines, run_rates

ENGINES = [f"e{i}" for i in range(6)]
# Output tokens per busy second each mode delivers on these engines (the truth the model may get wrong).
RATE = {common_pb2.MODE_MB: 10_000.0, common_pb2.MODE_EB: 10_000.0}


def _fleet(costs) -> tuple[FleetState, dict[str, object]]:
    loop = DecisionLoopConfig(recompute_completions=1_000_000, interval_s=2.0, ttl_s=60.0)
    fleet = FleetState(loop, PolicyConfig(min_samples=400, cooldown_s=0.0), replica_id="rollouts")
    fleet.set_calibration(POOL_KEY, costs, START_S, refresh=False)
    return fleet, attach_engines(fleet, ENGINES, START_S)


def _run(fleet: FleetState, streams: dict[str, object], first_s: int, last_s: int, rates: dict[int, float],
         rng: np.random.Generator, events: list) -> None:
    """Seconds first_s..last_s: every engine sends a batch whose steps deliver its mode's rate (5% noise)."""
    run_rates(fleet, streams, first_s, last_s, rates, rng, events)


def _modes(fleet: FleetState) -> dict[str, int]:
    return {e: fleet.engine(e).loop.current.mode for e in ENGINES}


def _mb_favouring():
    """A calibration under which these workloads run MB (slow prefill: EB's prefill-only steps cost more)."""
    return replace(H200_QWEN3_8B, beta_p_s_per_token=H200_QWEN3_8B.beta_p_s_per_token * 4)


def test_a_stale_calibration_asking_for_the_worse_mode_is_rolled_back_on_its_canary() -> None:
    rng = np.random.default_rng(0)
    fleet, streams = _fleet(_mb_favouring())
    events: list = []
    rates = {common_pb2.MODE_MB: 10_000.0, common_pb2.MODE_EB: 8_500.0}  # EB is 15% worse here
    _run(fleet, streams, 1, 30, rates, rng, events)
    assert set(_modes(fleet).values()) == {common_pb2.MODE_MB} and not events
    stale = fleet.set_calibration(POOL_KEY, H200_QWEN3_8B, START_S + 30)  # the model now asks for EB
    events += [(30, e) for e in stale.rollouts]
    _run(fleet, streams, 31, 31 + 240, rates, rng, events)
    started = [(t, e) for t, e in events if e.event == "started"]
    ended = [(t, e) for t, e in events if e.event != "started"]
    assert started and started[0][1].to_mode == "eb", events
    assert ended[0][1].event == "rolled_back" and ended[0][0] - started[0][0] <= 180, events
    modes = _modes(fleet)
    assert set(modes.values()) == {common_pb2.MODE_MB}  # back on the established mode
    assert {fleet.engine(e).loop.current.reason for e in ENGINES} == {"rollout_hold"}
    assert len(started) == 1  # not retried during the cooldown
    assert COOLDOWN_S > 240


def test_a_change_that_is_as_good_is_promoted_to_the_pool() -> None:
    rng = np.random.default_rng(1)
    fleet, streams = _fleet(_mb_favouring())
    events: list = []
    _run(fleet, streams, 1, 30, RATE, rng, events)
    events += [(30, e) for e in fleet.set_calibration(POOL_KEY, H200_QWEN3_8B, START_S + 30).rollouts]
    during: set[tuple[str, int]] = set()
    for t in range(31, 31 + 240):
        _run(fleet, streams, t, t, RATE, rng, events)
        if fleet.pool(POOL_KEY).rollouts.active is not None:
            during |= set(_modes(fleet).items())
    assert [e.event for _, e in events] == ["started", "promoted"], events
    assert {mode for _, mode in during} == {common_pb2.MODE_MB, common_pb2.MODE_EB}  # canary and control
    assert set(_modes(fleet).values()) == {common_pb2.MODE_EB}
    assert fleet.pool(POOL_KEY).rollouts.active is None


def test_an_operators_pin_bypasses_the_guard() -> None:
    rng = np.random.default_rng(2)
    fleet, streams = _fleet(_mb_favouring())
    events: list = []
    _run(fleet, streams, 1, 30, RATE, rng, events)
    pin = operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_PIN, mode=operator_pb2.PINNED_MODE_EB,
                                      scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET))
    fleet.set_overrides([pin], START_S + 30)
    assert set(_modes(fleet).values()) == {common_pb2.MODE_EB} and fleet.pool(POOL_KEY).rollouts.active is None
