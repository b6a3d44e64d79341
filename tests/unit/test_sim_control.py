"""The twin's online control: the real core policy decides, the real Enforcer applies, the timeline records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.core.types import PolicyConfig
from controlplane.sim.arrivals import closed_loop
from controlplane.sim.lengths import synthetic_shape
from controlplane.sim.profiles import get_profile
from controlplane.sim.runner import run_scenario
from controlplane.sim.schedulers import parse_scheduler

H200 = get_profile("h200-qwen3-8b")
WORKLOAD = closed_loop(synthetic_shape(256, 128), concurrency=512, num_requests=2500)


def test_eb_kstar_is_pinned_to_eb_and_follows_the_core_decisions() -> None:
    result = run_scenario(WORKLOAD, parse_scheduler("eb-kstar"), H200, seed=0)
    timeline = result.timeline
    assert timeline[0].at_s == 0.0 and timeline[0].reason == "operator_pin"
    assert all(d.mode == "eb" for d in timeline)
    assert all(1 <= d.k <= d.n <= H200.shape.max_num_seqs for d in timeline)
    # Once the window holds min_samples completions, k = ⌊θ̂*·N̂*⌋ from the fit.
    fitted = [d for d in timeline if d.n_star > 0]
    assert fitted and all(d.k == max(1, int(d.theta_star * d.n)) for d in fitted)
    # The cap in force on the engine is the decision's N.
    assert set(result.steps["num_seqs_cap"].tolist()) <= {d.n for d in timeline}


def test_eb_plus_starts_in_mb_for_lack_of_data_then_follows_the_crossover() -> None:
    """MB first; EB by the cold-start rule once the occupancy and the outputs seen so far rule MB out at
    every length (512 requests on the H200); then the rule on the fit."""
    result = run_scenario(WORKLOAD, parse_scheduler("eb+"), H200, seed=0)
    assert result.timeline[0].mode == "mb" and result.timeline[0].reason == "insufficient_data"
    reasons = [d.reason for d in result.timeline[1:]]
    fitted = [i for i, reason in enumerate(reasons) if reason != "cold_start_eb"]
    assert fitted and set(reasons[fitted[0]:]) <= {"crossover_eb", "crossover_mb", "hysteresis_hold",
                                                   "cooldown_hold"}
    assert all(d.n_star > 0 for d in result.timeline[1 + fitted[0]:])
    assert result.metrics.num_completed == 2500


def test_a_large_delta_keeps_eb_plus_in_mb() -> None:
    result = run_scenario(WORKLOAD, parse_scheduler("eb+:0.005"), H200, seed=0)
    assert {d.mode for d in result.timeline} == {"mb"}


def test_eb_plus_warm_started_from_an_earlier_runs_snapshot_decides_by_the_rule_from_the_start() -> None:
    """A pool with history: the window the controller would have persisted (fitted from ≥ min_samples
    completions) seeds the next run, whose first decision is the crossover rule's, not the cold-start MB."""
    earlier = run_scenario(WORKLOAD, parse_scheduler("eb+"), H200, seed=1)
    snapshot = earlier.pool_window
    assert snapshot is not None and snapshot.outputs.count >= PolicyConfig().min_samples
    assert snapshot.outputs.mean() == pytest.approx(128.0, rel=0.15)
    warm = run_scenario(WORKLOAD, replace(parse_scheduler("eb+"), warm_start=snapshot), H200, seed=0)
    first = warm.timeline[0]
    assert first.at_s == 0.0 and first.reason in ("crossover_eb", "crossover_mb") and first.n_star > 0
    assert warm.metrics.num_completed == 2500
    # Static schedulers have no pool.
    assert run_scenario(WORKLOAD, parse_scheduler("v1"), H200, seed=0).pool_window is None
