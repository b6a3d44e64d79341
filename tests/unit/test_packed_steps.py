"""Packed steps (`Steps.packed_columns`): the byte layout both sides agree on, the layouts the controller
refuses (each with the field named), and the agent's choice of encoding (packed only for a controller that says
it reads them, and columns that pack)."""

from __future__ import annotations

import struct

import pytest

from agents.config import AgentConfig
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.core.types import EngineLimits
from controlplane.loop.ingest import MAX_BATCH_EVENTS, TelemetryError, validate_batch
from controlplane.protocol import (
    STEP_PACKED_BYTES,
    STEPS_METADATA,
    pack_step_columns,
    reads_packed_steps,
    steps_message,
)

LIMITS = EngineLimits(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20,
                      max_model_len_tokens=4096)


def test_the_layout_is_durations_as_float64_then_three_uint32_columns_little_endian() -> None:
    packed = pack_step_columns([0.5, 0.25], [100, 0], [0, 7], [0, 3])
    assert len(packed) == 2 * STEP_PACKED_BYTES
    assert struct.unpack("<2d6I", packed) == (0.5, 0.25, 100, 0, 0, 7, 0, 3)


def test_a_count_a_uint32_cannot_hold_or_columns_of_different_lengths_are_not_packed() -> None:
    with pytest.raises(OverflowError):
        pack_step_columns([0.1], [-1], [0], [0])
    with pytest.raises(OverflowError):
        pack_step_columns([0.1], [1 << 32], [0], [0])
    with pytest.raises(ValueError, match="equal lengths"):
        pack_step_columns([0.1, 0.2], [1], [0], [0])


def _batch(steps: agent_pb2.Steps) -> agent_pb2.TelemetryBatch:
    return agent_pb2.TelemetryBatch(seq=1, steps=steps)


def test_packed_steps_are_read_as_the_repeated_fields_would_be() -> None:
    steps = ([0.02, 0.03, 0.0], [512, 0, 5], [0, 16, 1], [0, 16, 1])  # the third: a zero duration, dropped
    v = validate_batch(_batch(agent_pb2.Steps(packed_columns=pack_step_columns(*steps))), LIMITS)
    assert v.duration_s.tolist() == [0.02, 0.03] and v.prefill_tokens.tolist() == [512, 0]
    assert v.decode_tokens.tolist() == [0, 16] and v.decode_requests.tolist() == [0, 16] and v.num_dropped == 1


@pytest.mark.parametrize(("steps", "field", "words"), [
    (agent_pb2.Steps(packed_columns=pack_step_columns([0.1], [1], [0], [0]), duration_s=[0.1]),
     "telemetry.steps.packed_columns", "sent with the columns it packs"),
    (agent_pb2.Steps(packed_columns=b"\0" * (STEP_PACKED_BYTES + 3)), "telemetry.steps.packed_columns",
     f"{STEP_PACKED_BYTES} bytes per step, got {STEP_PACKED_BYTES + 3} bytes"),
    (agent_pb2.Steps(packed_columns=pack_step_columns([0.1, 0.1], [1, 1], [0, 0], [0, 0]), mode=[common_pb2.MODE_MB]),
     "telemetry.steps.mode", "one per step (2), got 1"),
    (agent_pb2.Steps(packed_columns=pack_step_columns([0.1], [1], [0], [0]), budget_tokens=[1, 2]),
     "telemetry.steps.budget_tokens", "one per step (1), got 2"),
])
def test_a_malformed_packed_layout_is_refused_with_the_field_named(steps: agent_pb2.Steps, field: str,
                                                                   words: str) -> None:
    with pytest.raises(TelemetryError, match=field) as raised:
        validate_batch(_batch(steps), LIMITS)
    assert words in str(raised.value)


def test_too_many_packed_steps_are_refused_as_oversize() -> None:
    steps = agent_pb2.Steps(packed_columns=b"\0" * (STEP_PACKED_BYTES * (MAX_BATCH_EVENTS + 1)))
    with pytest.raises(TelemetryError) as raised:
        validate_batch(_batch(steps), LIMITS)
    assert raised.value.cause == "oversize"


def test_the_metadata_says_whether_the_controller_reads_packed_steps() -> None:
    assert reads_packed_steps([("x-other", "1"), STEPS_METADATA])
    assert not reads_packed_steps([("cp-steps", "something-else")]) and not reads_packed_steps(None)


def test_steps_are_packed_only_when_asked_and_the_columns_pack() -> None:
    columns = ([0.02, 0.01], [300, 0], [4, 9], [4, 9])
    packed = steps_message(*columns, packed=True, mode=[1, 2], budget_tokens=[512, 512])
    assert packed.packed_columns == pack_step_columns(*columns) and not packed.duration_s
    assert list(packed.mode) == [1, 2] and list(packed.budget_tokens) == [512, 512]
    repeated = steps_message(*columns, packed=False)
    assert not repeated.packed_columns and list(repeated.prefill_tokens) == [300, 0]
    uneven = steps_message([0.02], [300, 0], [4, 9], [4, 9], packed=True)  # does not pack: sent for the controller
    assert not uneven.packed_columns and len(uneven.prefill_tokens) == 2  # to refuse (unequal columns)


def test_the_agents_link_packs_only_for_a_controller_that_reads_them() -> None:
    recorder = TelemetryRecorder(capacity=8)
    config = AgentConfig(controller_address="127.0.0.1:1", engine_id="e", pool_model="m", pool_accelerator="a")
    link = ControllerLink(config, hello=agent_pb2.Hello(engine_id="e"), recorder=recorder,
                          on_decision=lambda decision, now_s: (True, ""))
    recorder.record_step(300, 4, 4, 0.02)
    older = link._batch(1).steps  # an older controller (no metadata): the repeated fields
    assert not older.packed_columns and list(older.duration_s) == [0.02]
    link._packed_steps = True
    recorder.record_step(300, 4, 4, 0.02)
    sent = link._batch(2).steps
    assert sent.packed_columns == pack_step_columns([0.02], [300], [4], [4]) and not sent.duration_s
    assert len(sent.mode) == 1
