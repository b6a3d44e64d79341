"""The fleet state machine's tick (`loop.fleet.FleetState.tick`): it decides at most MAX_TICK_DECISIONS due engines
per call, so a tick of a large fleet whose engines fall due together cannot hold the event loop for long; the
others are decided by the following ticks (or at their own batches), none left behind."""

from __future__ import annotations

from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import MAX_TICK_DECISIONS, FleetState
from testbench.fleet_drive import attach_engines

ENGINES = 3 * MAX_TICK_DECISIONS + 10
INTERVAL_S = 5.0


def test_a_tick_decides_at_most_its_budget_and_the_next_ticks_the_rest() -> None:
    fleet = FleetState(DecisionLoopConfig(interval_s=INTERVAL_S, ttl_s=60.0), PolicyConfig(),
                       replica_id="tick", guard_rollouts=False)
    attach_engines(fleet, [f"e{i:04d}" for i in range(ENGINES)], now_s=0.0)
    ids = [f"e{i:04d}" for i in range(ENGINES)]
    decided: list[int] = []
    now_s = INTERVAL_S  # all of them due at once (their first recompute is dephased within the interval)
    while sum(decided) < ENGINES:
        fleet.tick(now_s)  # an unchanged decision is not pushed again: count the decide() calls by their time
        decided.append(sum(fleet.engine(e).loop.last_decided_s == now_s for e in ids))
        now_s += 0.25
        assert len(decided) < 10, decided
    assert decided == [MAX_TICK_DECISIONS] * 3 + [10]
    fleet.tick(now_s)
    assert not any(fleet.engine(e).loop.last_decided_s == now_s for e in ids)  # nothing due any more
