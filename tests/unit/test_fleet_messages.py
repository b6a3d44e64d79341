"""Fake-engine state to AgentService messages: Hello limits, columnar telemetry, the sim→wall time map."""

from __future__ import annotations

import math

import pytest

from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.messages import (
    SimToWallHistory,
    ack_message,
    check_engine_id,
    hello_message,
    telemetry_message,
)
from controlplane.fleet.profiles import EngineShape
from controlplane.fleet.workload import WorkloadSpec

SHAPE = EngineShape(max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=10_010, block_size_tokens=16,
                    max_model_len_tokens=2048)


def test_hello_carries_identity_pool_and_whole_block_kv_capacity() -> None:
    message = hello_message(engine_id="sim-0-0001", model="m", accelerator="a", shape=SHAPE)
    hello = message.hello
    assert (hello.engine_id, hello.pool.model, hello.pool.accelerator, hello.vllm_version) == (
        "sim-0-0001", "m", "a", "sim")
    assert hello.limits.kv_capacity_tokens == 10_000  # 625 whole blocks of 16
    assert (hello.limits.max_num_seqs, hello.limits.max_num_batched_tokens) == (8, 512)


@pytest.mark.parametrize("engine_id", ["", "has space", "x" * 129, "slash/no"])
def test_engine_ids_outside_the_contract_are_refused(engine_id: str) -> None:
    with pytest.raises(ValueError, match="engine_id"):
        check_engine_id(engine_id)


def test_telemetry_columns_line_up_and_finish_times_map_to_wall_time() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("geometric:8/uniform:64/closed:6"), shape=SHAPE, seed=1)
    engine.run_until(2.0)
    telemetry = engine.drain()
    to_wall = SimToWallHistory(0.0, 1_000.0)
    to_wall.add(telemetry.now_s, 1_010.0)
    batch = telemetry_message(telemetry, seq=1, to_wall_s=to_wall, sent_at_s=1_010.0).telemetry
    c, s = batch.completions, batch.steps
    assert len(c.prompt_tokens) == len(c.output_tokens) == len(c.finish_time_s) == len(c.aborted) > 0
    assert len(s.prefill_tokens) == len(s.decode_tokens) == len(s.decode_requests) == len(s.duration_s) > 0
    assert all(1_000.0 <= f <= 1_010.0 for f in c.finish_time_s)
    assert list(s.duration_s) == telemetry.step_duration_s
    assert batch.kv_total_tokens == engine.kv_total_tokens
    with pytest.raises(ValueError, match="seq"):
        telemetry_message(telemetry, seq=0, to_wall_s=to_wall, sent_at_s=0.0)


def test_running_requests_and_admissions_ride_as_an_agent_sends_them() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("geometric:64/uniform:64/closed:6"), shape=SHAPE, seed=3)
    engine.run_until(1.0)
    engine.drain()
    engine.run_until(3.0)
    telemetry = engine.drain()
    to_wall = SimToWallHistory(0.0, 1_000.0)
    to_wall.add(1.0, 1_001.0)
    to_wall.add(telemetry.now_s, 1_003.0)
    batch = telemetry_message(telemetry, seq=2, to_wall_s=to_wall, sent_at_s=1_003.0).telemetry
    c, r = batch.completions, batch.running
    assert len(c.admitted_time_s) == len(c.output_tokens) > 0
    assert all(1_000.0 <= a <= f for a, f in zip(c.admitted_time_s, c.finish_time_s, strict=True))
    assert any(a < 1_001.0 for a in c.admitted_time_s)  # admitted in the first batch's span, finished in this one
    state = engine.scheduler_state()
    assert sum(r.num_requests) == state.num_running_prefills + state.num_running_decodes > 0
    assert list(r.output_tokens) == sorted(r.output_tokens)
    assert len(r.admitted_time_s) == len(r.output_tokens)
    assert all(1_000.0 <= a <= 1_003.0 for a in r.admitted_time_s)


def test_the_stream_map_is_piecewise_through_its_anchors() -> None:
    """One anchor per flush: the second batch ran 10 simulated seconds in 1 wall second, the first 10 in 10.
    A time of the first batch maps at the first batch's pace, not the second's."""
    to_wall = SimToWallHistory(0.0, 100.0)
    to_wall.add(10.0, 110.0)
    to_wall.add(20.0, 111.0)
    assert to_wall(5.0) == pytest.approx(105.0)  # a per-batch map of the second batch would say 110.5 − 0.5
    assert to_wall(15.0) == pytest.approx(110.5)
    assert to_wall(-5.0) == pytest.approx(95.0)  # before the oldest anchor: the oldest segment's pace
    assert to_wall(25.0) == 111.0  # never in the future
    assert math.isnan(to_wall(math.nan))
    to_wall.add(20.0, 112.0)  # the engine did not advance: the newest anchor moves
    assert to_wall(20.0) == 112.0
    to_wall.add(30.0, 111.5)  # a wall clock that stepped back is held
    assert to_wall(30.0) == 112.0
    with pytest.raises(ValueError, match="max_anchors"):
        SimToWallHistory(0.0, 0.0, max_anchors=1)


def test_the_stream_map_keeps_its_newest_anchors() -> None:
    to_wall = SimToWallHistory(0.0, 0.0, max_anchors=3)
    for t in range(1, 6):
        to_wall.add(float(t), float(t) * (1.0 if t < 4 else 2.0))  # pace 1 up to t = 3, then 2 wall s per s
    # anchors kept: (3, 3), (4, 8), (5, 10); before (3, 3) the oldest segment's pace is 5 wall s per s
    assert to_wall(3.5) == pytest.approx(5.5)
    assert to_wall(2.0) == pytest.approx(-2.0)


def test_sim_to_wall_is_linear_and_never_in_the_future() -> None:
    to_wall = SimToWallHistory(10.0, 100.0)
    to_wall.add(20.0, 101.0)
    assert to_wall(15.0) == pytest.approx(100.5)
    assert to_wall(25.0) == 101.0
    degenerate = SimToWallHistory(5.0, 0.0)  # an engine clock that never advanced: everything at the newest wall
    degenerate.add(5.0, 3.0)
    assert degenerate(5.0) == 3.0
    assert math.isnan(to_wall(math.nan))


def test_ack_message() -> None:
    ack = ack_message(version=9, applied=False, reject_reason="k_greater_than_n").ack
    assert (ack.version, ack.applied, ack.reject_reason) == (9, False, "k_greater_than_n")
