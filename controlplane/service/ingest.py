"""Validation of agent messages, field by field.

Structural errors (a Hello missing its engine id, columns of different lengths, KV used above total)
raise `TelemetryError` naming the field; the servicer answers INVALID_ARGUMENT. Out-of-range values
inside well-formed columns (a non-aborted request with 0 output tokens, a step duration that is not a
positive finite number, a NaN finish time) are dropped and counted, and the rest of the batch is used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from controlplane.api.v1 import agent_pb2
from controlplane.core.types import EngineLimits

_ENGINE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
MAX_BATCH_EVENTS = 1_000_000


class TelemetryError(ValueError):
    """A message is malformed; `field` is the dotted path of the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclass(frozen=True, slots=True)
class EngineHello:
    engine_id: str
    model: str
    accelerator: str
    vllm_version: str
    agent_version: str
    limits: EngineLimits
    block_size_tokens: int

    @property
    def pool_key(self) -> str:
        return f"{self.model}|{self.accelerator}"


def validate_hello(hello: agent_pb2.Hello) -> EngineHello:
    """Raises TelemetryError for a missing or malformed engine id, pool or limits."""
    if not _ENGINE_ID.match(hello.engine_id):
        raise TelemetryError("hello.engine_id", f"must match {_ENGINE_ID.pattern}, got {hello.engine_id!r}")
    if not hello.pool.model or not hello.pool.accelerator:
        raise TelemetryError("hello.pool", "model and accelerator are required")
    if "|" in hello.pool.model or "|" in hello.pool.accelerator:
        raise TelemetryError("hello.pool", "model and accelerator must not contain '|'")
    limits = hello.limits
    if limits.max_num_seqs < 1:
        raise TelemetryError("hello.limits.max_num_seqs", "must be ≥ 1")
    if limits.max_num_batched_tokens < 1:
        raise TelemetryError("hello.limits.max_num_batched_tokens", "must be ≥ 1")
    return EngineHello(
        engine_id=hello.engine_id,
        model=hello.pool.model,
        accelerator=hello.pool.accelerator,
        vllm_version=hello.vllm_version,
        agent_version=hello.agent_version,
        limits=EngineLimits(
            max_num_seqs=limits.max_num_seqs,
            max_num_batched_tokens=limits.max_num_batched_tokens,
            kv_capacity_tokens=limits.kv_capacity_tokens,
            max_model_len_tokens=limits.max_model_len_tokens,
        ),
        block_size_tokens=limits.block_size_tokens,
    )


@dataclass(frozen=True, eq=False)
class ValidatedBatch:
    """The usable content of one TelemetryBatch (arrays are float64 for the estimators)."""

    seq: int
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    decode_requests: np.ndarray
    duration_s: np.ndarray
    num_aborted: int
    num_dropped: int
    kv_used_tokens: int
    kv_total_tokens: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    num_events_dropped: int
    traceparent: str


def _same_length(prefix: str, columns: dict[str, object]) -> int:
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{name}={n}" for name, n in lengths.items())
        raise TelemetryError(prefix, f"columns must have equal lengths, got {detail}")
    size = next(iter(lengths.values()))
    if size > MAX_BATCH_EVENTS:
        raise TelemetryError(prefix, f"at most {MAX_BATCH_EVENTS} events per batch, got {size}")
    return size


def validate_batch(batch: agent_pb2.TelemetryBatch) -> ValidatedBatch:
    """Check structure (raises TelemetryError) and drop out-of-range values (counted in num_dropped)."""
    if batch.seq < 1:
        raise TelemetryError("telemetry.seq", "must be ≥ 1")
    c = batch.completions
    _same_length("telemetry.completions", {"prompt_tokens": c.prompt_tokens, "output_tokens": c.output_tokens,
                                           "finish_time_s": c.finish_time_s, "aborted": c.aborted})
    s = batch.steps
    _same_length("telemetry.steps", {"prefill_tokens": s.prefill_tokens, "decode_tokens": s.decode_tokens,
                                     "decode_requests": s.decode_requests, "duration_s": s.duration_s})
    if batch.kv_used_tokens > batch.kv_total_tokens:
        raise TelemetryError("telemetry.kv_used_tokens",
                             f"{batch.kv_used_tokens} exceeds kv_total_tokens {batch.kv_total_tokens}")
    if batch.traceparent and len(batch.traceparent) > 128:
        raise TelemetryError("telemetry.traceparent", "longer than 128 characters")
    if not math.isfinite(batch.sent_at_s):
        raise TelemetryError("telemetry.sent_at_s", "must be finite")

    prompts = np.asarray(c.prompt_tokens, dtype=np.float64)
    outputs = np.asarray(c.output_tokens, dtype=np.float64)
    finish = np.asarray(c.finish_time_s, dtype=np.float64)
    aborted = np.asarray(c.aborted, dtype=bool)
    good = ~aborted & (prompts >= 1) & (outputs >= 1) & np.isfinite(finish)
    dropped = int(np.count_nonzero(~aborted & ~good))

    prefill = np.asarray(s.prefill_tokens, dtype=np.float64)
    decode_tok = np.asarray(s.decode_tokens, dtype=np.float64)
    decode_req = np.asarray(s.decode_requests, dtype=np.float64)
    duration = np.asarray(s.duration_s, dtype=np.float64)
    good_steps = np.isfinite(duration) & (duration > 0) & ((prefill + decode_tok) > 0) & (decode_req <= decode_tok)
    dropped += int(np.count_nonzero(~good_steps))
    scheduler = batch.scheduler
    return ValidatedBatch(
        seq=batch.seq,
        prompt_tokens=prompts[good],
        output_tokens=outputs[good],
        prefill_tokens=prefill[good_steps],
        decode_tokens=decode_tok[good_steps],
        decode_requests=decode_req[good_steps],
        duration_s=duration[good_steps],
        num_aborted=int(np.count_nonzero(aborted)),
        num_dropped=dropped,
        kv_used_tokens=batch.kv_used_tokens,
        kv_total_tokens=batch.kv_total_tokens,
        num_running=scheduler.num_running_prefills + scheduler.num_running_decodes,
        num_waiting=scheduler.num_waiting,
        num_preemptions=batch.counters.num_preemptions,
        num_events_dropped=batch.counters.num_events_dropped,
        traceparent=batch.traceparent,
    )
