"""Conversion of fake-engine state into AgentService messages (Hello, TelemetryBatch, DecisionAck).

Pure functions: no I/O, no clock reads (times are passed in). Engine times are simulated seconds; the
contract's `finish_time_s` is engine wall clock since the Unix epoch, so the caller supplies a map from
simulated to wall time (a stream's `SimToWallHistory`). Step durations stay in simulated seconds: they are
what the controller fits the cost model to.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from controlplane import __version__
from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.fleet.profiles import EngineShape
from controlplane.fleet.telemetry import EngineTelemetry
from controlplane.protocol import ENGINE_ID_PATTERN, bounded, is_valid_engine_id, steps_message

VLLM_VERSION = "sim"
AGENT_VERSION = f"controlplane-fleet/{__version__}"
def check_engine_id(engine_id: str) -> str:
    """Return `engine_id` when it matches the contract's `protocol.ENGINE_ID_PATTERN`; else raise ValueError."""
    if not is_valid_engine_id(engine_id):
        raise ValueError(f"engine_id {bounded(engine_id)} must match {ENGINE_ID_PATTERN.pattern}")
    return engine_id


class SimToWallHistory:
    """The engine clock → wall clock map of one stream: piecewise linear through one anchor (engine clock,
    wall clock) per flush, never later than the newest anchor's wall time. Before the oldest anchor kept it
    continues the oldest segment's pace; NaN maps to NaN.

    Why not one linear map per batch: a batch carries times from before its own span (when a request still
    running, or one finishing now, was first scheduled, possibly many batches ago). A per-batch map puts them
    at this batch's pace, which an unpaced engine does not keep from one batch to the next, so an admission
    could land after a completion that followed it. Within the newest segment both maps agree.
    """

    def __init__(self, sim_s: float, wall_s: float, *, max_anchors: int = 4096) -> None:
        if max_anchors < 2:
            raise ValueError(f"max_anchors must be ≥ 2, got {max_anchors}")
        self._sim: list[float] = [sim_s]
        self._wall: list[float] = [wall_s]
        self._max_anchors = max_anchors

    def add(self, sim_s: float, wall_s: float) -> None:
        """Anchor engine time `sim_s` at wall time `wall_s` (a flush). Times are kept non-decreasing: an
        engine clock that did not advance moves the newest anchor's wall time instead."""
        wall_s = max(wall_s, self._wall[-1])
        if sim_s <= self._sim[-1]:
            self._wall[-1] = wall_s
            return
        self._sim.append(sim_s)
        self._wall.append(wall_s)
        if len(self._sim) > self._max_anchors:
            del self._sim[0], self._wall[0]

    def __call__(self, sim_s: float) -> float:
        if math.isnan(sim_s):
            return math.nan
        sims, walls = self._sim, self._wall
        if sim_s >= sims[-1]:
            return walls[-1]
        i = bisect.bisect_right(sims, sim_s)
        if i == 0:  # before the oldest anchor: the oldest segment's pace (or the anchor itself when alone)
            if len(sims) < 2:
                return walls[0]
            i = 1
        lo, hi = i - 1, i
        fraction = (sim_s - sims[lo]) / (sims[hi] - sims[lo])
        return min(walls[-1], walls[lo] + fraction * (walls[hi] - walls[lo]))


def hello_message(
    *, engine_id: str, model: str, accelerator: str, shape: EngineShape, agent_version: str = AGENT_VERSION
) -> agent_pb2.AgentMessage:
    """The opening message of a stream: identity, pool and start-up limits."""
    hello = agent_pb2.Hello(
        engine_id=check_engine_id(engine_id),
        pool=common_pb2.Pool(model=model, accelerator=accelerator),
        vllm_version=VLLM_VERSION,
        agent_version=agent_version,
        limits=agent_pb2.EngineLimits(
            max_num_seqs=shape.max_num_seqs,
            max_num_batched_tokens=shape.max_num_batched_tokens,
            kv_capacity_tokens=(shape.kv_capacity_tokens // shape.block_size_tokens) * shape.block_size_tokens,
            block_size_tokens=shape.block_size_tokens,
            max_model_len_tokens=shape.max_model_len_tokens,
        ),
    )
    return agent_pb2.AgentMessage(hello=hello)


def telemetry_message(
    telemetry: EngineTelemetry, *, seq: int, to_wall_s: Callable[[float], float], sent_at_s: float,
    packed: bool = False,
) -> agent_pb2.AgentMessage:
    """A TelemetryBatch with sequence number `seq` (≥ 1) from one `FakeEngine.drain()`.

    Completion finish and admission times and the running entries' admission times go through `to_wall_s`
    (a stream's `SimToWallHistory`); every completion has aborted = False. The running
    requests' histogram rides in `running`, as an agent sends it. packed: the steps in `Steps.packed_columns`
    (for a controller that reads them), else in the repeated fields.
    """
    if seq < 1:
        raise ValueError(f"seq starts at 1, got {seq}")
    num_completions = len(telemetry.completion_finish_s)
    batch = agent_pb2.TelemetryBatch(
        seq=seq,
        completions=agent_pb2.Completions(
            prompt_tokens=telemetry.completion_prompt_tokens,
            output_tokens=telemetry.completion_output_tokens,
            finish_time_s=[to_wall_s(t) for t in telemetry.completion_finish_s],
            aborted=[False] * num_completions,
            admitted_time_s=[to_wall_s(t) for t in telemetry.completion_admitted_s],
            arrival_time_s=[to_wall_s(t) for t in telemetry.completion_arrival_s],
            first_token_time_s=[to_wall_s(t) for t in telemetry.completion_first_token_s],
        ),
        steps=steps_message(telemetry.step_duration_s, telemetry.step_prefill_tokens, telemetry.step_decode_tokens,
                            telemetry.step_decode_requests, packed=packed),
        kv_used_tokens=telemetry.kv_used_tokens,
        kv_total_tokens=telemetry.kv_total_tokens,
        scheduler=agent_pb2.SchedulerState(
            num_running_prefills=telemetry.scheduler.num_running_prefills,
            num_running_decodes=telemetry.scheduler.num_running_decodes,
            num_waiting=telemetry.scheduler.num_waiting,
            largest_remaining_prefill_tokens=telemetry.scheduler.largest_remaining_prefill_tokens,
        ),
        counters=agent_pb2.Counters(
            num_preemptions=telemetry.num_preemptions,
            num_events_dropped=telemetry.num_events_dropped,
        ),
        sent_at_s=sent_at_s,
        running=agent_pb2.RunningLengths(
            output_tokens=telemetry.running_output_tokens,
            num_requests=telemetry.running_num_requests,
            admitted_time_s=[to_wall_s(t) for t in telemetry.running_admitted_s],
        ),
    )
    return agent_pb2.AgentMessage(telemetry=batch)


def ack_message(*, version: int, applied: bool, reject_reason: str = "") -> agent_pb2.AgentMessage:
    """A DecisionAck for `version`."""
    return agent_pb2.AgentMessage(
        ack=agent_pb2.DecisionAck(version=version, applied=applied, reject_reason=reject_reason)
    )
