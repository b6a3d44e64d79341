"""Twin workloads, shapes, scenario and scheduler spellings, metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.sim.arrivals import Phase, Workload, bursty, closed_loop, materialize
from controlplane.sim.lengths import DATASET_SHAPES, ClippedLogNormalLengths, UniformRangeLengths, synthetic_shape
from controlplane.sim.metrics import geometric_mean_ratio, summarize
from controlplane.sim.profiles import get_profile
from controlplane.sim.runner import run_scenario
from controlplane.sim.scenarios import concurrency_shift, distribution_shift, parse_scenario
from controlplane.sim.schedulers import parse_scheduler


@pytest.mark.parametrize("dist", [ClippedLogNormalLengths(105.0, 1.0, 4, 2048),
                                  ClippedLogNormalLengths(600.0, 0.9, 1, 2048), UniformRangeLengths(800, 4000)],
                         ids=str)
def test_new_distributions_match_their_exact_means(dist) -> None:
    samples = dist.sample(np.random.default_rng(3), 200_000)
    assert samples.dtype == np.int64 and samples.min() >= 1
    assert samples.mean() == pytest.approx(dist.mean_tokens, rel=0.01)


def test_dataset_shapes_have_the_published_decode_ratios() -> None:
    ratios = {name: shape.decode_ratio for name, shape in DATASET_SHAPES.items()}
    assert ratios["longbench"] < 0.02
    assert 0.5 <= ratios["sharegpt"] <= 0.75 and 0.5 <= ratios["wildchat"] <= 0.7
    assert ratios["numinamath"] > 0.85
    assert ratios["balanced"] == pytest.approx(0.5)
    assert DATASET_SHAPES["ppas-long-context"].prompt.mean_tokens == 25_000


def test_bursty_trace_alternates_steady_and_burst_phases() -> None:
    workload = bursty(DATASET_SHAPES["ppas-long-context"], burst_rate_per_s=4.0)
    assert [p.rate_per_s for p in workload.phases] == [0.2, 4.0, 0.2, 4.0, 0.2]
    counts = np.zeros(5)
    for seed in range(40):
        arrivals = materialize(workload, seed=seed).arrival_s
        counts += np.histogram(arrivals, bins=[0, 10, 20, 30, 40, 50])[0]
    per_phase = counts / 40
    assert per_phase[[1, 3]] == pytest.approx([40.0, 40.0], rel=0.1)
    assert per_phase[[0, 2, 4]].max() < 4.0


def test_materialize_is_deterministic_per_seed() -> None:
    workload = distribution_shift()
    a, b, c = materialize(workload, seed=1), materialize(workload, seed=1), materialize(workload, seed=2)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens) and np.array_equal(a.output_tokens, b.output_tokens)
    assert not np.array_equal(a.output_tokens, c.output_tokens)
    means = [a.output_tokens[i * 2000:(i + 1) * 2000].mean() for i in range(3)]
    assert means == pytest.approx([128, 512, 1024], rel=0.05)


def test_closed_loop_never_exceeds_the_phase_concurrency() -> None:
    workload = Workload("shift", (Phase(synthetic_shape(64, 32), num_requests=300, concurrency=40),
                                  Phase(synthetic_shape(64, 32), num_requests=300, concurrency=8)))
    result = run_scenario(workload, parse_scheduler("v1"), get_profile("h200-qwen3-8b"), seed=0)
    in_system = result.steps["num_running"] + result.steps["num_waiting"]
    assert in_system.max() <= 40
    assert in_system[-50:].max() <= 8
    assert result.metrics.num_completed == 600


def test_concurrency_shift_levels() -> None:
    assert [p.concurrency for p in concurrency_shift().phases] == [32, 512, 1024, 256, 2048]


@pytest.mark.parametrize(
    ("text", "message"),
    [("closed:balanced", "c=<concurrency>"), ("closed:nope:c=3", "unknown length shape"),
     ("poisson:balanced:rate=1", "rate=<req/s> and for"), ("bursty:balanced:burst=x", "must be a number"),
     ("warp:balanced", "unknown scenario")],
)
def test_scenario_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scenario(text)


def test_scenario_spellings() -> None:
    assert parse_scenario("closed:uniform-300-100:c=7:n=50").phases[0].concurrency == 7
    assert parse_scenario("poisson:fixed:100,geometric:50:rate=2:for=30").phases[0].rate_per_s == 2
    assert len(parse_scenario("bursty:ppas-long-context:burst=1.2").phases) == 5


@pytest.mark.parametrize(
    ("text", "message"),
    [("eb:0", "≥ 1"), ("ppas:100:200", "B_cap must be ≤ B_max"), ("v2", "unknown scheduler"),
     ("v1@x=3", "options are"), ("v1@tmin=0.2", "eb-kstar and eb\\+ only"), ("eb+:nan", "finite"),
     ("eb-kstar@tmin=0.9", "theta_min"), ("eb-kstar@guard=maybe", "on or off"), ("eb:4@guard=off", "only"),
     ("eb+@tmin=x", "must be a number")],
)
def test_scheduler_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scheduler(text)


def test_scheduler_overrides_change_the_engine_shape() -> None:
    profile = get_profile("h200-qwen3-8b")
    spec = parse_scheduler("v1@n=128@b=2048")
    assert (spec.shape_for(profile).max_num_seqs, spec.shape_for(profile).max_num_batched_tokens) == (128, 2048)
    assert parse_scheduler("ppas:4096:512").shape_for(profile).max_num_batched_tokens == 4096
    assert parse_scheduler("eb-kstar@tmin=0.25").policy.theta_min == 0.25
    both = parse_scheduler("eb+@tmin=0.05@guard=off").policy
    assert (both.theta_min, both.memory_guard) == (0.05, False)
    assert parse_scheduler("eb-kstar").policy is None  # PolicyConfig(), whose memory guard is on
    with pytest.raises(ValueError, match="k ≤ N"):
        parse_scheduler("eb:64:32").create_control(profile, profile.shape)


def test_metrics_of_hand_made_requests() -> None:
    requests = {"prompt_tokens": np.array([10, 20]), "output_tokens": np.array([5, 1]),
                "arrival_s": np.array([0.0, 1.0]), "first_token_s": np.array([1.0, 3.0]),
                "finish_s": np.array([5.0, 3.0])}
    m = summarize(requests)
    assert m.makespan_s == 5.0 and m.num_completed == 2
    assert m.throughput_tokens_per_s == pytest.approx(36 / 5)
    assert m.ttft_mean_s == pytest.approx(1.5) and m.e2e_mean_s == pytest.approx(3.5)
    assert m.tpot_mean_s == pytest.approx(1.0)  # only the request with > 1 output token
    assert geometric_mean_ratio([1.0, 4.0], [2.0, 2.0]) == pytest.approx(math.sqrt(0.5 * 2.0))


def test_closed_loop_helper_names() -> None:
    assert closed_loop(synthetic_shape(8, 8), concurrency=2, num_requests=3).name.endswith("closed:2/n:3")
