"""The real-world workloads from data/workloads.json, multi-turn prefixes served from the prefix cache, and
prompts beyond max_model_len refused instead of cut."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.sim.arrivals import closed_loop, materialize
from controlplane.sim.engine import SimEngine
from controlplane.sim.lengths import (
    DATASET_SHAPES,
    ClippedLogNormalLengths,
    ConversationHistoryLengths,
    FixedLengths,
    LengthShape,
    dataset_shapes_from_json,
    upper_bound_tokens,
)
from controlplane.sim.profiles import EngineShape, get_profile
from controlplane.sim.runner import run_scenario
from controlplane.sim.scenarios import check_fits, parse_scenario
from controlplane.sim.schedulers import parse_scheduler

H200 = get_profile("h200-qwen3-8b")
REAL_WORLD = ("sharegpt", "wildchat", "wildchat-full-history", "longbench", "numinamath")


def test_real_world_shapes_load_with_their_sources_and_fits() -> None:
    for name in REAL_WORLD:
        shape = DATASET_SHAPES[name]
        assert "EB paper" in shape.source
        assert shape.prompt.mean_tokens >= 1 and shape.output.mean_tokens >= 1
    # The published coarse statistics (EB paper §4.1, §4.3.2).
    assert DATASET_SHAPES["sharegpt"].prompt.mean_tokens == pytest.approx(105, rel=0.02)
    assert upper_bound_tokens(DATASET_SHAPES["sharegpt"].output) == 500
    assert DATASET_SHAPES["longbench"].decode_ratio < 0.01
    assert DATASET_SHAPES["numinamath"].decode_ratio > 0.85
    assert 0.5 <= DATASET_SHAPES["wildchat"].decode_ratio <= 0.7


def test_a_workload_entry_must_say_what_it_was_fitted_to() -> None:
    entry = {"source": "s", "prompt": {"kind": "fixed", "tokens": 5}, "output": {"kind": "fixed", "tokens": 5,
                                                                                  "fit": "f"}}
    with pytest.raises(ValueError, match=r"datasets.x.prompt must say what it was fitted to"):
        dataset_shapes_from_json({"datasets": {"x": entry}})
    entry["prompt"]["fit"] = "f"
    entry["output"] = {"kind": "weibull", "fit": "f"}
    with pytest.raises(ValueError, match=r"datasets.x.output: unknown kind 'weibull'"):
        dataset_shapes_from_json({"datasets": {"x": entry}})


@pytest.mark.sim
def test_conversation_history_has_its_exact_mean_and_carries_at_most_the_kept_turns() -> None:
    user, reply = ClippedLogNormalLengths(300.0, 1.0, 1, 4096), ClippedLogNormalLengths(440.0, 0.8, 1, 2048)
    full = ConversationHistoryLengths(6, 9.3, user, reply, 1 << 20)
    last = ConversationHistoryLengths(6, 9.3, user, reply, 1 << 20, kept_turns=1)
    rng = np.random.default_rng(0)
    for dist in (full, last):
        draws = dist.sample(rng, 200_000)
        assert draws.mean() == pytest.approx(dist.mean_tokens, rel=0.02)
    # Turn 1 of every conversation has no history: P(t = 1) = 1 / 9.3.
    assert (last.sample(rng, 200_000) == 0).mean() == pytest.approx(1 / 9.3, rel=0.05)
    assert last.sample(rng, 10_000).max() <= 4096 + 2048
    assert full.mean_tokens > 5 * last.mean_tokens


def test_a_multi_turn_request_computes_only_what_its_cached_prefix_does_not_cover() -> None:
    shape = LengthShape("turns", FixedLengths(100), FixedLengths(10), "test", shared_prefix=FixedLengths(3000))
    workload = closed_loop(shape, concurrency=4, num_requests=8)
    trace = materialize(workload, seed=0)
    assert (trace.prompt_tokens == 3100).all() and (trace.cached_prompt_tokens == 3000).all()
    result = run_scenario(workload, parse_scheduler("v1"), H200, seed=0)
    steps = result.steps
    # Only the 100 new tokens per request are prefilled; the KV holds the whole 3,100-token prompt.
    assert steps["prefill_tokens"].sum() == 8 * 100
    assert steps["kv_used_tokens"].max() >= 4 * 3100
    # Their attention runs over the cached prefix: 100·3000 + 100·101/2 pairs per request.
    assert steps["prefill_attention_pairs"].sum() == 8 * (100 * 3000 + 100 * 101 // 2)
    uncached = run_scenario(closed_loop(LengthShape("flat", FixedLengths(3100), FixedLengths(10), "t"),
                                        concurrency=4, num_requests=8), parse_scheduler("v1"), H200, seed=0)
    assert result.metrics.ttft_mean_s < uncached.metrics.ttft_mean_s


def test_a_prompt_beyond_max_model_len_is_refused_when_the_scenario_is_built() -> None:
    with pytest.raises(ValueError, match=r"draws prompts of up to 131072 tokens, which do not fit max_model_len "
                                         r"40960 of profile h200-qwen3-8b"):
        parse_scenario("closed:fixed:131072,fixed:64:c=8", max_model_len_tokens=H200.shape.max_model_len_tokens,
                       profile_name=H200.name)
    # A shape that fits passes, also with its shared prefix counted.
    assert parse_scenario("closed:wildchat:c=8", max_model_len_tokens=40_960).phases
    with pytest.raises(ValueError, match=r"wildchat-full-history draws prompts of up to 34096 tokens, which do not "
                                         r"fit max_model_len 32768"):
        check_fits(closed_loop(DATASET_SHAPES["wildchat-full-history"], concurrency=8, num_requests=8),
                   max_model_len_tokens=32_768)
    # Unbounded distributions are checked at their 1e-9 tail: geometric outputs are no prompt problem.
    assert parse_scenario("closed:geometric:256,geometric:256:c=8", max_model_len_tokens=40_960).phases
    with pytest.raises(ValueError, match="draws prompts of up to"):
        parse_scenario("closed:geometric:4096,fixed:1:c=8", max_model_len_tokens=40_960)


def test_the_engine_refuses_a_too_long_prompt_and_cuts_outputs_at_the_context_limit() -> None:
    engine = SimEngine(H200, shape=EngineShape(max_num_seqs=4, kv_capacity_tokens=4096, max_model_len_tokens=300))
    with pytest.raises(ValueError, match=r"a prompt of 5000 tokens does not fit max_model_len 300 of profile "
                                         r"h200-qwen3-8b"):
        engine.add_requests(np.array([250, 5000]), np.array([1000, 7]), 0.0)
    assert engine.num_requests == 0
    engine.add_requests(np.array([250, 299]), np.array([1000, 7]), 0.0)
    prompts, outputs = engine.lengths_of(np.array([0, 1]))
    assert prompts.tolist() == [250, 299] and outputs.tolist() == [50, 1]
    with pytest.raises(ValueError, match="cached_prompt_tokens must give"):
        engine.add_requests(np.array([100]), np.array([5]), 0.0, cached_prompt_tokens=np.array([100]))
