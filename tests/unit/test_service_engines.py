"""The controller's per-engine state: how the agent's cumulative preemption counter becomes preemptions since
the last decision (the memory guard's input)."""

from __future__ import annotations

import numpy as np

from controlplane.core.types import EngineLimits
from controlplane.service.config import DecisionLoopConfig
from controlplane.service.engines import EngineState
from controlplane.service.ingest import EngineHello, ValidatedBatch

LOOP = DecisionLoopConfig()
EMPTY = np.zeros(0)


def _batch(seq: int, preemptions: int) -> ValidatedBatch:
    return ValidatedBatch(seq=seq, prompt_tokens=EMPTY, output_tokens=EMPTY, prefill_tokens=EMPTY,
                          decode_tokens=EMPTY, decode_requests=EMPTY, duration_s=EMPTY, num_aborted=0, num_dropped=0,
                          kv_used_tokens=0, kv_total_tokens=1000, num_running=4, num_waiting=0,
                          num_preemptions=preemptions, num_events_dropped=0, traceparent="")


def _state() -> EngineState:
    hello = EngineHello(engine_id="e", model="m", accelerator="a", vllm_version="0", agent_version="0",
                        limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=64, kv_capacity_tokens=1000),
                        block_size_tokens=16)
    return EngineState.create(hello, LOOP)


def test_first_batch_is_the_baseline_then_increases_count() -> None:
    state = _state()
    state.ingest(_batch(1, 5000), now_s=0.0, loop=LOOP)  # an engine that preempted before this controller
    assert state.preemptions_since_decision == 0
    state.ingest(_batch(2, 5003), now_s=1.0, loop=LOOP)
    state.ingest(_batch(3, 5010), now_s=2.0, loop=LOOP)
    assert state.preemptions_since_decision == 10


def test_a_counter_that_goes_back_is_a_restarted_engine_and_counts_in_full() -> None:
    state = _state()
    state.ingest(_batch(1, 40), now_s=0.0, loop=LOOP)
    state.ingest(_batch(1, 3), now_s=1.0, loop=LOOP)
    assert state.preemptions_since_decision == 3
    state.ingest(_batch(2, 3), now_s=2.0, loop=LOOP)
    assert state.preemptions_since_decision == 3 and state.num_preemptions == 3
