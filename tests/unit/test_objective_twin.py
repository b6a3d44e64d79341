"""The objective loop and guarded rollouts together, on seeded twin pools (`testbench.twin_pool`): H200 twin
engines under ShareGPT-like open-loop load, where EB gives the lower TTFT p99 (about 0.13 s against MB's 0.26 s)
although the pool starts on MB. A TTFT p99 target between the two is reached through one canary promoted on the
objective and then held without oscillating; a target nothing reaches is called infeasible with the pool on EB,
the mode measured lowest; an engine objective on a lone engine finds EB from its own windows."""

from __future__ import annotations

import pytest

from controlplane.core.types import Mode
from controlplane.sim.profiles import get_profile
from testbench.twin_pool import POOL_KEY, Config, run

pytestmark = pytest.mark.sim

RATE_PER_S = 27.0
MINUTES = 7.0


def _run(target_s: float, seed: int = 0):
    return run(get_profile("h200-qwen3-8b"), "sharegpt", Config("objective", target_s=target_s),
               rate_per_s=RATE_PER_S, engines=2, minutes=MINUTES, seed=seed, warmup_s=180.0, guard=True)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_target_between_eb_and_mb_is_met_through_a_promoted_canary_and_held(seed: int) -> None:
    result = _run(0.165, seed)
    # From minute 5 on every window meets the target, or is within 2% of what EB pinned (the lowest) gives on the
    # same arrivals: in seed 0's minute 7 EB pinned itself reads 0.167 s.
    eb = run(get_profile("h200-qwen3-8b"), "sharegpt", Config("EB", pin="eb"), rate_per_s=RATE_PER_S, engines=2,
             minutes=MINUTES, seed=seed, warmup_s=180.0, guard=True)
    lowest = [max(0.165, 1.02 * p99) for p99 in eb.window_p99_s]
    assert all(p99 <= bound for p99, bound in list(zip(result.window_p99_s, lowest, strict=True))[2:]), (
        result.window_p99_s, eb.window_p99_s)
    events = [what for _, what in result.rollouts]
    assert "promoted mb→eb" in events and events.count("started mb→eb") == 1
    assert len(events) <= 4  # at most one more canary (back to MB), rolled back
    states = [state for _, state, _, _ in result.trace]
    assert states[-2:] == ["MEETING"] * 2
    # Settled after minute 3: δ stays on EB's side and moves, if at all, only deeper into it (a window of EB's at the
    # target nudges it; nothing lower exists), never back.
    deltas = [delta for _, _, delta, _ in result.trace[3:]]
    assert all(d < 0.0 for d in deltas) and deltas == sorted(deltas, reverse=True)


def test_a_target_nothing_reaches_is_infeasible_on_eb() -> None:
    # Called as the loop heads for EB (MB misses it by ×2 and the model, corrected by MB's measured / predicted
    # ratio, puts EB there too), within the first minute; then on what both modes measured.
    result = _run(0.066)
    assert result.infeasible_at_s is not None and result.infeasible_at_s <= 60.0
    assert "towards eb" in result.infeasible_detail and "eb expected at" in result.infeasible_detail
    assert all(state == "INFEASIBLE" for _, state, _, _ in result.trace[1:])  # no flapping once called
    detail = result.fleet.objective_of(POOL_KEY).detail
    assert "cannot reach it" in detail and "eb measured" in detail and "mb measured" in detail
    assert result.trace[-1][2] < 0.0  # held on the EB side, the lower


def test_an_engine_objective_on_a_lone_engine_learns_eb_from_its_own_windows() -> None:
    # One engine: its change of mode is tested by a switchback, judged on the engine's objective (EB's TTFT
    # better where MB's misses: promoted), whose groups' quantiles its loop learns.
    result = run(get_profile("h200-qwen3-8b"), "sharegpt", Config("engine", target_s=0.165, objective_engine="e0"),
                 rate_per_s=RATE_PER_S, engines=1, minutes=12.0, seed=0, warmup_s=180.0, guard=True)
    assert [text for _, text in result.rollouts] == ["started mb→eb", "promoted mb→eb"]
    ended = result.fleet.pool(POOL_KEY).rollouts.history[-1]
    assert "switchback" in ended.detail and "TTFT p99" in ended.detail and "better" in ended.detail
    assert result.fleet.objective_for_engine("e0").measured.keys() == {Mode.MB, Mode.EB}  # learned from its groups
    met = [p99 <= 0.165 for p99 in result.window_p99_s]
    # 7 of the 9 windows after minute 3: the first holds the switchback's MB periods (it ends at 220 s).
    assert sum(met) >= len(met) - 2, result.window_p99_s
    assert all(delta < 0.0 for _, _, delta, _ in result.trace[2:])  # on EB's side from minute 2 on
    assert result.trace[-1][1] == "MEETING"
