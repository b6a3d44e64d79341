"""Untrusted agent input for the fuzz, auth and untrusted-input suites and the fuzz soak benchmark.

Messages: hypothesis strategies draw every field of every agent message with its extremes (NaN/±inf
doubles, uint32/uint64 maxima, empty and 4,096-element repeated fields, text with NUL and control
characters): valid Hellos and batches, and Hellos, batches and byte strings that each break exactly one
named rule (`HELLO_FAULTS`, `BATCH_FAULTS`, oversize, undecodable, unknown kind). `draw_corpus` draws a few
hundred of them once (seeded, generation only); `compose_scripts` combines them with a seeded RNG into
thousands of Connect streams (`StreamScript`), each with one fault of a known kind, none, or random byte
mutations — thousands of messages without thousands of hypothesis examples.

Oracle: the expected outcome of a script (the `cp_rejections_total` cause and the status code) follows
from how it was built; the controller's own validation is never consulted. Mutated scripts are the
exception (`determinable` False): their outcome is only known once sent.

Drivers send scripts over a real channel as raw bytes (`request_serializer=None`), so undecodable bytes
reach the server as they are: `run_script` (one stream, start to finish) and `LiveAgent` (a long-lived
engine that ACKs what it gets and records when each decision came; `stream_telemetry` sends a well-behaved
engine's telemetry on one). `non_finite_doubles` walks every double of a message and names the non-finite ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.loop.ingest import (
    MAX_BATCH_EVENTS,
    MAX_BATCHED_TOKENS,
    MAX_BLOCK_SIZE_TOKENS,
    MAX_KV_CAPACITY_TOKENS,
    MAX_MODEL_LEN_TOKENS,
    MAX_NUM_SEQS,
    MAX_RUNNING_BINS,
    MAX_TEXT_CHARS,
)
from controlplane.protocol import MAX_POOL_NAME_CHARS, UINT32_MAX, UINT64_MAX
from testbench.messages import geometric_batch

CONNECT_METHOD = "/controlplane.v1.AgentService/Connect"
# Every `cp_rejections_total` cause and the status a stream rejected for it ends with ("refused" is
# PERMISSION_DENIED for identity and scope refusals, ALREADY_EXISTS for an older instance: see REFUSED_CODES).
CAUSE_CODES: dict[str, grpc.StatusCode] = {
    "no_hello": grpc.StatusCode.FAILED_PRECONDITION,
    "bad_hello": grpc.StatusCode.INVALID_ARGUMENT,
    "refused": grpc.StatusCode.ALREADY_EXISTS,
    "malformed": grpc.StatusCode.INVALID_ARGUMENT,
    "oversize": grpc.StatusCode.INVALID_ARGUMENT,
    "second_hello": grpc.StatusCode.INVALID_ARGUMENT,
    "unknown_message": grpc.StatusCode.INVALID_ARGUMENT,
    "undecodable": grpc.StatusCode.INVALID_ARGUMENT,
}
CAUSES = tuple(sorted(CAUSE_CODES))
REFUSED_CODES = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.ALREADY_EXISTS)
# The codes a rejected stream ends with; anything else but OK (UNKNOWN, INTERNAL, a hang) is a failure.
REJECTION_CODES = frozenset({*CAUSE_CODES.values(), *REFUSED_CODES})
# Instance start time of the well-behaved engines a "refused" script claims (Unix seconds): every refused
# script's instance started before it, so it loses with ALREADY_EXISTS and never takes the engine over.
TARGET_STARTED_AT_S = 1.5e9

# ---------------------------------------------------------------------------------------------------------
# Scalars and text
# ---------------------------------------------------------------------------------------------------------

_EXTREME_DOUBLES = (math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308,
                    -1.7976931348623157e308, 1e-300, 1e300, 1.7e9, -1.0)


def uint32s() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from((0, 1, 2, 255, 256, 4096, (1 << 31) - 1, 1 << 31, UINT32_MAX - 1, UINT32_MAX)),
                     st.integers(0, UINT32_MAX))


def uint64s() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from((0, 1, 2, UINT32_MAX, UINT32_MAX + 1, (1 << 63) - 1, 1 << 63, UINT64_MAX - 1,
                                      UINT64_MAX)),
                     st.integers(0, UINT64_MAX))


def doubles() -> st.SearchStrategy[float]:
    """Any double, NaN and ±inf included (extremes drawn often)."""
    return st.one_of(st.sampled_from(_EXTREME_DOUBLES), st.floats())


def finite_doubles() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([v for v in _EXTREME_DOUBLES if math.isfinite(v)]),
                     st.floats(allow_nan=False, allow_infinity=False))


_PRINTABLE = st.one_of(st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp",
                                                                        "Zs")),
                       st.just(" "))


def printable_text(*, min_size: int = 0, max_size: int, forbid: str = "") -> st.SearchStrategy[str]:
    """Text Python calls printable (no control characters, no NUL), without the characters in `forbid`."""
    return st.text(_PRINTABLE, min_size=min_size, max_size=max_size).filter(
        lambda s: s.isprintable() and not any(c in s for c in forbid))


def any_text(*, max_size: int) -> st.SearchStrategy[str]:
    """Any valid UTF-8 text: NUL, control and format characters included."""
    return st.text(st.characters(codec="utf-8"), max_size=max_size)


def pool_names() -> st.SearchStrategy[str]:
    """Valid pool model or accelerator names: 1..MAX_POOL_NAME_CHARS printable characters without "|"."""
    return st.one_of(printable_text(min_size=1, max_size=24, forbid="|"),
                     printable_text(min_size=MAX_POOL_NAME_CHARS, max_size=MAX_POOL_NAME_CHARS, forbid="|"))


def engine_ids() -> st.SearchStrategy[str]:
    return st.from_regex(r"[A-Za-z0-9._:-]{1,60}", fullmatch=True)


def traceparents() -> st.SearchStrategy[str]:
    w3c = st.builds(lambda t, s, f: f"00-{t:032x}-{s:016x}-{f:02x}", st.integers(0, (1 << 128) - 1),
                    st.integers(0, (1 << 64) - 1), st.integers(0, 255))
    return st.one_of(st.just(""), w3c, printable_text(min_size=1, max_size=128))


# ---------------------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------------------


@st.composite
def valid_hellos(draw: st.DrawFn, *, pools: st.SearchStrategy[common_pb2.Pool] | None = None) -> agent_pb2.Hello:
    """A Hello every rule of the contract accepts (engine id, pool names, limits, versions, instance)."""
    limits = agent_pb2.EngineLimits(
        max_num_seqs=draw(st.one_of(st.sampled_from((1, 2, 1024, MAX_NUM_SEQS)), st.integers(1, MAX_NUM_SEQS))),
        max_num_batched_tokens=draw(st.one_of(st.sampled_from((1, 256, 16384, MAX_BATCHED_TOKENS)),
                                              st.integers(1, MAX_BATCHED_TOKENS))),
        kv_capacity_tokens=draw(st.one_of(st.sampled_from((1, 1_500_000, MAX_KV_CAPACITY_TOKENS)),
                                          st.integers(1, MAX_KV_CAPACITY_TOKENS))),
        block_size_tokens=draw(st.one_of(st.sampled_from((1, 16, MAX_BLOCK_SIZE_TOKENS)),
                                         st.integers(1, MAX_BLOCK_SIZE_TOKENS))),
        max_model_len_tokens=draw(st.one_of(st.sampled_from((1, 2, 32768, MAX_MODEL_LEN_TOKENS)),
                                            st.integers(1, MAX_MODEL_LEN_TOKENS))),
    )
    pool = draw(pools) if pools is not None else common_pb2.Pool(model=draw(pool_names()),
                                                                   accelerator=draw(pool_names()))
    return agent_pb2.Hello(
        engine_id=draw(engine_ids()), pool=pool,
        vllm_version=draw(printable_text(max_size=MAX_TEXT_CHARS)),
        agent_version=draw(printable_text(max_size=MAX_TEXT_CHARS)),
        limits=limits,
        instance_id=draw(st.one_of(st.just(""), printable_text(min_size=1, max_size=MAX_TEXT_CHARS))),
        # Not in the controller's future (a start from the future is refused: `sessions.check_started_at`).
        instance_started_at_s=draw(st.one_of(st.sampled_from((0.0, 5e-324, 1.7e9)), st.floats(0.0, 1.7e9))),
    )


def _set_pool_name(which: str, value: str) -> Callable[[st.DrawFn, agent_pb2.Hello], None]:
    def fault(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
        setattr(hello.pool, which, value)
    return fault


def _limit_out_of_range(name: str, low: int, high: int) -> Callable[[st.DrawFn, agent_pb2.Hello], None]:
    def fault(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
        setattr(hello.limits, name, draw(st.one_of(st.sampled_from((low, high)), st.integers(low, high))))
    return fault


def _pool_name_with(which: str, characters: str) -> Callable[[st.DrawFn, agent_pb2.Hello], None]:
    def fault(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
        name = getattr(hello.pool, which)
        at = draw(st.integers(0, len(name)))
        setattr(hello.pool, which, name[:at] + draw(st.sampled_from(characters)) + name[at:])
    return fault


def _engine_id_with_bad_character(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
    bad = draw(st.characters(codec="utf-8").filter(lambda c: not (c.isascii() and (c.isalnum() or c in "._:-"))))
    at = draw(st.integers(0, len(hello.engine_id)))
    hello.engine_id = hello.engine_id[:at] + bad + hello.engine_id[at:]


def _text_fault(name: str, *, long: bool) -> Callable[[st.DrawFn, agent_pb2.Hello], None]:
    def fault(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
        if long:
            setattr(hello, name, draw(printable_text(min_size=1, max_size=8)) * (MAX_TEXT_CHARS + 1))
        else:
            setattr(hello, name, "v" + draw(st.sampled_from("\x00\n\r\t\x1b\x7f\u200b\u2028")))
    return fault


def _started_at(value: float) -> Callable[[st.DrawFn, agent_pb2.Hello], None]:
    def fault(draw: st.DrawFn, hello: agent_pb2.Hello) -> None:
        hello.instance_started_at_s = value
    return fault


# One entry per way a Hello can break one rule; the fault's name says which. "engine_id*" faults make the
# engine id itself invalid (such a script cannot be given a unique engine id: not rebindable).
HELLO_FAULTS: dict[str, Callable[[st.DrawFn, agent_pb2.Hello], None]] = {
    "engine_id_empty": lambda draw, h: setattr(h, "engine_id", ""),
    "engine_id_10kb": lambda draw, h: setattr(h, "engine_id", "e" * 10_240),
    "engine_id_129_chars": lambda draw, h: setattr(h, "engine_id", "e" * 129),
    "engine_id_bad_character": _engine_id_with_bad_character,
    "engine_id_nul": lambda draw, h: setattr(h, "engine_id", h.engine_id + "\x00"),
    "model_empty": _set_pool_name("model", ""),
    "model_100kb": _set_pool_name("model", "m" * 102_400),
    "model_257_chars": _set_pool_name("model", "m" * (MAX_POOL_NAME_CHARS + 1)),
    "model_control_character": _pool_name_with("model", "\x00\x01\n\r\t\x1b\x7f\u2028"),
    "model_pipe": _pool_name_with("model", "|"),
    "accelerator_empty": _set_pool_name("accelerator", ""),
    "accelerator_100kb": _set_pool_name("accelerator", "a" * 102_400),
    "accelerator_control_character": _pool_name_with("accelerator", "\x00\x01\n\x1b"),
    "accelerator_pipe": _pool_name_with("accelerator", "|"),
    "no_limits": lambda draw, h: h.ClearField("limits"),
    "max_num_seqs_zero": _limit_out_of_range("max_num_seqs", 0, 0),
    "max_num_seqs_too_large": _limit_out_of_range("max_num_seqs", MAX_NUM_SEQS + 1, UINT32_MAX),
    "max_num_batched_tokens_zero": _limit_out_of_range("max_num_batched_tokens", 0, 0),
    "max_num_batched_tokens_too_large": _limit_out_of_range("max_num_batched_tokens", MAX_BATCHED_TOKENS + 1,
                                                            UINT32_MAX),
    "max_model_len_zero": _limit_out_of_range("max_model_len_tokens", 0, 0),
    "max_model_len_too_large": _limit_out_of_range("max_model_len_tokens", MAX_MODEL_LEN_TOKENS + 1, UINT32_MAX),
    "kv_capacity_zero": _limit_out_of_range("kv_capacity_tokens", 0, 0),
    "kv_capacity_too_large": _limit_out_of_range("kv_capacity_tokens", MAX_KV_CAPACITY_TOKENS + 1, UINT64_MAX),
    "block_size_zero": _limit_out_of_range("block_size_tokens", 0, 0),
    "block_size_too_large": _limit_out_of_range("block_size_tokens", MAX_BLOCK_SIZE_TOKENS + 1, UINT32_MAX),
    "instance_started_nan": _started_at(math.nan),
    "instance_started_inf": _started_at(math.inf),
    "instance_started_negative": _started_at(-1.0),
    "vllm_version_too_long": _text_fault("vllm_version", long=True),
    "vllm_version_control_character": _text_fault("vllm_version", long=False),
    "agent_version_too_long": _text_fault("agent_version", long=True),
    "instance_id_too_long": _text_fault("instance_id", long=True),
    "instance_id_control_character": _text_fault("instance_id", long=False),
}


@st.composite
def bad_hellos(draw: st.DrawFn, *, pools: st.SearchStrategy[common_pb2.Pool] | None = None,
               fault: str | None = None) -> tuple[str, agent_pb2.Hello]:
    """(fault name, a Hello that breaks exactly that rule of HELLO_FAULTS; drawn when `fault` is None)."""
    hello = draw(valid_hellos(pools=pools))
    fault = fault if fault is not None else draw(st.sampled_from(sorted(HELLO_FAULTS)))
    HELLO_FAULTS[fault](draw, hello)
    return fault, hello


def _column(draw: st.DrawFn, values: st.SearchStrategy, size: int) -> list:
    """`size` values: drawn one by one when few, else a short drawn pattern repeated (cheap to draw)."""
    if size <= 16:
        return draw(st.lists(values, min_size=size, max_size=size))
    pattern = draw(st.lists(values, min_size=1, max_size=4))
    return (pattern * (size // len(pattern) + 1))[:size]


def _sizes() -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 8), st.sampled_from((0, 1, 64, 1000, MAX_RUNNING_BINS)))


@st.composite
def valid_batches(draw: st.DrawFn) -> agent_pb2.TelemetryBatch:
    """A structurally valid TelemetryBatch (equal column lengths, kv_used ≤ kv_total, finite sent_at, a short
    printable traceparent, at most MAX_RUNNING_BINS running bins) whose values are anything the types allow:
    a controller must drop the impossible ones, not refuse the batch. seq is left unset: a script sets it."""
    num_completions, num_steps = draw(_sizes()), draw(_sizes())
    num_bins = draw(st.one_of(st.integers(0, 4), st.sampled_from((MAX_RUNNING_BINS,))))
    kv_total = draw(uint64s())
    return agent_pb2.TelemetryBatch(
        completions=agent_pb2.Completions(
            prompt_tokens=_column(draw, uint32s(), num_completions),
            output_tokens=_column(draw, uint32s(), num_completions),
            finish_time_s=_column(draw, doubles(), num_completions),
            aborted=_column(draw, st.booleans(), num_completions)),
        steps=agent_pb2.Steps(
            prefill_tokens=_column(draw, uint32s(), num_steps),
            decode_tokens=_column(draw, uint32s(), num_steps),
            decode_requests=_column(draw, uint32s(), num_steps),
            duration_s=_column(draw, doubles(), num_steps)),
        kv_used_tokens=draw(st.integers(0, kv_total)),
        kv_total_tokens=kv_total,
        scheduler=agent_pb2.SchedulerState(num_running_prefills=draw(uint32s()), num_running_decodes=draw(uint32s()),
                                           num_waiting=draw(uint32s()),
                                           largest_remaining_prefill_tokens=draw(uint64s())),
        counters=agent_pb2.Counters(num_preemptions=draw(uint64s()), num_events_dropped=draw(uint64s())),
        sent_at_s=draw(finite_doubles()),
        traceparent=draw(traceparents()),
        running=agent_pb2.RunningLengths(output_tokens=_column(draw, uint32s(), num_bins),
                                         num_requests=_column(draw, uint32s(), num_bins)),
    )


@st.composite
def plausible_batches(draw: st.DrawFn) -> agent_pb2.TelemetryBatch:
    """A batch an engine of the harness' limits could send (outputs around a drawn mean, positive durations):
    enough of these move a pool's estimate, so decisions get computed from fuzzed pools. seq unset."""
    num = draw(st.integers(1, 120))
    mean = draw(st.sampled_from((1.0, 2.0, 16.0, 256.0, 4096.0, 20000.0)))
    outputs = [max(1, min(30000, int(mean * draw(st.sampled_from((0.1, 0.5, 1.0, 2.0, 4.0)))))) for _ in range(4)]
    steps = draw(st.integers(1, 8))
    return agent_pb2.TelemetryBatch(
        completions=agent_pb2.Completions(prompt_tokens=[draw(st.integers(1, 2000))] * num,
                                          output_tokens=(outputs * (num // 4 + 1))[:num],
                                          finish_time_s=[1.7e9] * num, aborted=[False] * num),
        steps=agent_pb2.Steps(prefill_tokens=[draw(st.integers(0, 16384))] * steps,
                              decode_tokens=[draw(st.integers(1, 512))] * steps,
                              decode_requests=[1] * steps,
                              duration_s=[draw(st.floats(1e-6, 600.0))] * steps),
        kv_used_tokens=1000, kv_total_tokens=1_500_000,
        scheduler=agent_pb2.SchedulerState(num_running_decodes=draw(st.integers(0, 1024))),
        sent_at_s=1.7e9,
    )


def _lengthen_or_shorten(column, *, extra: object) -> None:
    if len(column):
        del column[-1]
    else:
        column.append(extra)


BATCH_FAULTS = ("completions_unequal", "steps_unequal", "running_unequal", "kv_used_above_total", "seq_zero",
                "traceparent_too_long", "traceparent_control_character", "sent_at_nonfinite")


@st.composite
def malformed_batches(draw: st.DrawFn, *, fault: str | None = None) -> tuple[str, agent_pb2.TelemetryBatch]:
    """(fault name, a batch that breaks exactly that structural rule of BATCH_FAULTS: cause "malformed"; drawn
    when `fault` is None). A "seq_zero" batch must be sent with seq 0, every other one with any seq ≥ 1."""
    batch = draw(valid_batches())
    fault = fault if fault is not None else draw(st.sampled_from(BATCH_FAULTS))
    if fault == "completions_unequal":
        column = draw(st.sampled_from(("prompt_tokens", "output_tokens", "finish_time_s", "aborted")))
        _lengthen_or_shorten(getattr(batch.completions, column), extra=True if column == "aborted" else 1)
    elif fault == "steps_unequal":
        column = draw(st.sampled_from(("prefill_tokens", "decode_tokens", "decode_requests", "duration_s")))
        _lengthen_or_shorten(getattr(batch.steps, column), extra=1)
    elif fault == "running_unequal":
        _lengthen_or_shorten(batch.running.num_requests, extra=1)
    elif fault == "kv_used_above_total":
        batch.kv_total_tokens = draw(st.integers(0, UINT64_MAX - 1))
        batch.kv_used_tokens = draw(st.integers(batch.kv_total_tokens + 1, UINT64_MAX))
    elif fault == "traceparent_too_long":
        batch.traceparent = "0" * draw(st.integers(129, 4096))
    elif fault == "traceparent_control_character":
        batch.traceparent = "00-" + draw(st.sampled_from("\x00\n\x1b\x7f"))
    elif fault == "sent_at_nonfinite":
        batch.sent_at_s = draw(st.sampled_from((math.nan, math.inf, -math.inf)))
    return fault, batch


@st.composite
def oversize_batches(draw: st.DrawFn) -> tuple[str, agent_pb2.TelemetryBatch]:
    """(fault name, a batch over a size limit that is cheap to send: more running bins than
    MAX_RUNNING_BINS). `huge_batch` builds the costly one (MAX_BATCH_EVENTS + 1 events)."""
    batch = draw(valid_batches())
    size = draw(st.sampled_from((MAX_RUNNING_BINS + 1, MAX_RUNNING_BINS + 2, 2 * MAX_RUNNING_BINS)))
    value = draw(uint32s())
    batch.running.output_tokens[:] = [value] * size
    batch.running.num_requests[:] = [1] * size
    return "running_bins_over_limit", batch


def huge_batch(*, seq: int, num_events: int, steps: bool = False) -> agent_pb2.TelemetryBatch:
    """A well-formed batch of `num_events` completions (or steps): MAX_BATCH_EVENTS is accepted, one more is
    "oversize". About 13 bytes per completion, 24 per step, on the wire."""
    batch = agent_pb2.TelemetryBatch(seq=seq, sent_at_s=1.7e9, kv_total_tokens=1)
    if steps:
        batch.steps.prefill_tokens.extend([0] * num_events)
        batch.steps.decode_tokens.extend([64] * num_events)
        batch.steps.decode_requests.extend([64] * num_events)
        batch.steps.duration_s.extend([0.05] * num_events)
    else:
        batch.completions.prompt_tokens.extend([300] * num_events)
        batch.completions.output_tokens.extend([200] * num_events)
        batch.completions.finish_time_s.extend([1.7e9] * num_events)
        batch.completions.aborted.extend([False] * num_events)
    return batch


def acks() -> st.SearchStrategy[agent_pb2.DecisionAck]:
    return st.builds(agent_pb2.DecisionAck, version=uint64s(), applied=st.booleans(),
                     reject_reason=st.one_of(any_text(max_size=64), st.just("r" * 100_000)))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def decodes(payload: bytes) -> agent_pb2.AgentMessage | None:
    """The AgentMessage `payload` decodes to, or None when protobuf refuses it."""
    try:
        return agent_pb2.AgentMessage.FromString(payload)
    except DecodeError:
        return None


@st.composite
def undecodable_payloads(draw: st.DrawFn) -> bytes:
    """Bytes protobuf cannot decode as an AgentMessage (checked with protobuf itself)."""
    junk = draw(st.binary(max_size=64))
    kind = draw(st.sampled_from(("truncated_length", "invalid_wire_type", "unmatched_end_group", "truncated_varint")))
    if kind == "truncated_length":  # field 2 (telemetry) claims more bytes than follow
        payload = b"\x12" + _varint(len(junk) + draw(st.integers(1, 1 << 20))) + junk
    elif kind == "invalid_wire_type":  # wire types 6 and 7 do not exist
        payload = junk + _varint((draw(st.integers(1, 1000)) << 3) | draw(st.sampled_from((6, 7))))
    elif kind == "unmatched_end_group":
        payload = _varint((draw(st.integers(1, 1000)) << 3) | 4) + junk
    else:
        payload = junk + b"\x08" + b"\xff" * draw(st.integers(1, 9))
    if decodes(payload) is not None:
        payload = b"\x12\xff\xff\xff\x07"  # the construction happened to decode: a sure truncation instead
    return payload


@st.composite
def unknown_kind_payloads(draw: st.DrawFn) -> bytes:
    """An AgentMessage with no known kind: empty, or only fields this contract does not define."""
    parts = [b""]
    for _ in range(draw(st.integers(0, 3))):
        number = draw(st.integers(4, (1 << 29) - 1))
        wire = draw(st.sampled_from((0, 1, 2, 5)))
        if wire == 0:
            body = _varint(draw(uint64s()))
        elif wire == 2:
            blob = draw(st.binary(max_size=32))
            body = _varint(len(blob)) + blob
        else:
            body = draw(st.binary(min_size=8 if wire == 1 else 4, max_size=8 if wire == 1 else 4))
        parts.append(_varint((number << 3) | wire) + body)
    payload = b"".join(parts)
    decoded = decodes(payload)
    if decoded is None or decoded.WhichOneof("kind") is not None:  # pragma: no cover - construction guarantees it
        payload = b""
    return payload


# ---------------------------------------------------------------------------------------------------------
# Stream scripts
# ---------------------------------------------------------------------------------------------------------

Part = agent_pb2.AgentMessage | bytes


def telemetry_payload(batch_body: bytes, *, seq: int) -> bytes:
    """An AgentMessage{telemetry} on the wire from a serialised TelemetryBatch without its seq (seq 0 is
    left out, as protobuf does): fields may come in any order, so seq is prepended."""
    body = (b"\x08" + _varint(seq) if seq else b"") + batch_body
    return b"\x12" + _varint(len(body)) + body


@dataclass(frozen=True)
class StreamScript:
    """The messages of one Connect stream, in order, and what the controller must make of them.

    fault: "none" or "<kind>:<detail>". cause: the `cp_rejections_total` cause the stream must be rejected and
    counted for (None: it must be accepted and end OK when the client half-closes). determinable: False for
    mutated scripts, whose outcome is only known once sent. rebindable: the first message is a Hello whose
    engine id may be replaced (`encode(engine_id=…)`) so that concurrent streams never share an id.
    """

    fault: str
    cause: str | None
    parts: tuple[Part, ...]
    determinable: bool = True
    rebindable: bool = True

    @property
    def kind(self) -> str:
        return self.fault.partition(":")[0]

    @property
    def code(self) -> grpc.StatusCode | None:
        """The status the stream must end with (None when not determinable)."""
        if not self.determinable:
            return None
        return grpc.StatusCode.OK if self.cause is None else CAUSE_CODES[self.cause]

    @property
    def num_messages(self) -> int:
        return len(self.parts)

    def encode(self, *, engine_id: str | None = None) -> list[bytes]:
        """The wire bytes of every message; a rebindable script's Hellos get `engine_id` when given."""
        out = []
        for part in self.parts:
            if isinstance(part, bytes):
                out.append(part)
                continue
            if engine_id is not None and self.rebindable and part.HasField("hello"):
                message = agent_pb2.AgentMessage()
                message.CopyFrom(part)
                message.hello.engine_id = engine_id
                part = message
            out.append(part.SerializeToString())
        return out

    def bound_engine_id(self, index: int) -> str | None:
        """A unique, valid engine id for script number `index` (None for a script that is not rebindable)."""
        if not self.rebindable or not self.parts or isinstance(self.parts[0], bytes) \
                or not self.parts[0].HasField("hello"):
            return None
        return f"f{index}.{self.parts[0].hello.engine_id}"[:128]


SCRIPT_KINDS = ("none", "no_hello", "bad_hello", "malformed", "oversize", "second_hello", "unknown_message",
                "undecodable", "refused", "mutated")


@dataclass(frozen=True)
class Corpus:
    """Messages drawn by hypothesis, serialised once; `compose_scripts` combines them into streams.

    Batches are kept as bytes without their seq (`telemetry_payload` adds it)."""

    hellos: list[agent_pb2.Hello]
    bad_hellos: dict[str, list[agent_pb2.Hello]]  # by fault (every fault of HELLO_FAULTS)
    batches: list[bytes]
    plausible: list[bytes]
    malformed: dict[str, list[bytes]]  # by fault (every fault of BATCH_FAULTS)
    oversize: list[tuple[str, bytes]]
    acks: list[bytes]
    undecodable: list[bytes]
    unknown: list[bytes]


def _no_seq(batch: agent_pb2.TelemetryBatch) -> bytes:
    batch.ClearField("seq")
    return batch.SerializeToString()


def draw_corpus(*, pools: st.SearchStrategy[common_pb2.Pool] | None = None, seed: int = 0,
                scale: float = 1.0) -> Corpus:
    """Draw every kind of message with hypothesis (a few hundred examples in all, times `scale`)."""
    def count(n: int) -> int:
        return max(4, int(n * scale))

    def ack_payload(ack: agent_pb2.DecisionAck) -> bytes:
        return agent_pb2.AgentMessage(ack=ack).SerializeToString()

    return Corpus(
        hellos=draw_examples(valid_hellos(pools=pools), count=count(60), seed=seed),
        bad_hellos={fault: [h for _, h in draw_examples(bad_hellos(pools=pools, fault=fault), count=count(3),
                                                         seed=seed + 1)] for fault in sorted(HELLO_FAULTS)},
        batches=[_no_seq(b) for b in draw_examples(valid_batches(), count=count(120), seed=seed + 2)],
        plausible=[_no_seq(b) for b in draw_examples(plausible_batches(), count=count(40), seed=seed + 3)],
        malformed={fault: [_no_seq(b) for _, b in draw_examples(malformed_batches(fault=fault), count=count(6),
                                                                 seed=seed + 4)] for fault in BATCH_FAULTS},
        oversize=[(fault, _no_seq(b)) for fault, b in draw_examples(oversize_batches(), count=count(12),
                                                                     seed=seed + 5)],
        acks=[ack_payload(a) for a in draw_examples(acks(), count=count(40), seed=seed + 6)],
        undecodable=draw_examples(undecodable_payloads(), count=count(40), seed=seed + 7),
        unknown=draw_examples(unknown_kind_payloads(), count=count(20), seed=seed + 8),
    )


def mutate(payload: bytes, rng: random.Random) -> bytes:
    """`payload` with 1–3 random bit flips, byte cuts, insertions or duplications."""
    data = bytearray(payload)
    for _ in range(rng.choice((1, 1, 2, 3))):
        operation = rng.choice(("flip", "flip", "cut", "insert", "duplicate"))
        at = rng.randint(0, len(data))
        if operation == "flip" and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randint(0, 7)
        elif operation == "cut":
            del data[at:at + rng.randint(1, 16)]
        elif operation == "insert":
            data[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            data[at:at] = data[at:at + rng.randint(1, 16)]
    return bytes(data)


def _body(corpus: Corpus, rng: random.Random, *, first_seq: int, num: int) -> tuple[list[Part], int]:
    """`num` acceptable messages after a Hello (batches with consecutive seq, now and then a jump to 1, to
    2^64−1 or anywhere; ACKs of any version); returns them and the next seq."""
    parts: list[Part] = []
    seq = first_seq
    for _ in range(num):
        kind = rng.choice(("valid", "valid", "plausible", "plausible", "ack"))
        if kind == "ack":
            parts.append(rng.choice(corpus.acks))
            continue
        if rng.random() < 0.1:
            seq = rng.choice((1, UINT64_MAX, rng.randint(1, UINT64_MAX)))
        parts.append(telemetry_payload(rng.choice(corpus.batches if kind == "valid" else corpus.plausible), seq=seq))
        seq = seq + 1 if seq < UINT64_MAX else 1
    return parts, seq


def compose_scripts(corpus: Corpus, *, count: int, seed: int, targets: Sequence[str] = (),
                    kinds: Sequence[str] = SCRIPT_KINDS, max_messages: int = 8) -> list[StreamScript]:
    """`count` stream scripts, the kinds in equal shares (shuffled), from `corpus` (see StreamScript).

    targets: engine ids of live, well-behaved engines whose instances started at TARGET_STARTED_AT_S; a
    "refused" script claims one of them as an agent instance that started earlier (ALREADY_EXISTS) and so
    never takes it over. "refused" is left out without targets.
    """
    rng = random.Random(seed)
    kinds = [k for k in kinds if k != "refused" or targets]
    order = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(order)
    scripts = []
    for kind in order:
        hello = agent_pb2.AgentMessage(hello=rng.choice(corpus.hellos))
        trailing, _ = _body(corpus, rng, first_seq=1, num=rng.randint(0, 2))
        if kind == "none":
            body, _ = _body(corpus, rng, first_seq=1, num=rng.randint(0, max_messages))
            scripts.append(StreamScript("none", None, (hello, *body)))
            continue
        if kind == "no_hello":
            first = rng.choice((*corpus.acks[:8], *corpus.unknown[:8], telemetry_payload(
                rng.choice(corpus.batches), seq=rng.randint(1, 5))))
            scripts.append(StreamScript("no_hello", "no_hello", (first, hello, *trailing), rebindable=False))
            continue
        if kind == "bad_hello":
            fault = rng.choice(sorted(corpus.bad_hellos))
            bad_hello = rng.choice(corpus.bad_hellos[fault])
            scripts.append(StreamScript(f"bad_hello:{fault}", "bad_hello",
                                        (agent_pb2.AgentMessage(hello=bad_hello), *trailing),
                                        rebindable=not fault.startswith("engine_id")))
            continue
        if kind == "refused":
            claimed = agent_pb2.AgentMessage()
            claimed.CopyFrom(hello)
            claimed.hello.engine_id = rng.choice(list(targets))
            claimed.hello.instance_id = f"fz-{rng.randrange(1 << 32):08x}"
            claimed.hello.instance_started_at_s = rng.random() * TARGET_STARTED_AT_S * 0.999
            scripts.append(StreamScript("refused:older_instance", "refused", (claimed, *trailing), rebindable=False))
            continue
        if kind == "undecodable" and rng.random() < 0.5:
            scripts.append(StreamScript("undecodable:first", "undecodable",
                                        (rng.choice(corpus.undecodable), *trailing), rebindable=False))
            continue
        prefix, seq = _body(corpus, rng, first_seq=1, num=rng.randint(0, max_messages // 2))
        if kind == "malformed":
            fault = rng.choice(BATCH_FAULTS)
            body = rng.choice(corpus.malformed[fault])
            bad: Part = telemetry_payload(body, seq=0 if fault == "seq_zero" else seq)
        elif kind == "oversize":
            fault, body = rng.choice(corpus.oversize)
            bad = telemetry_payload(body, seq=seq)
        elif kind == "second_hello":
            fault = "second_hello"
            bad = agent_pb2.AgentMessage(hello=rng.choice((*corpus.hellos, *corpus.bad_hellos["model_pipe"])))
        elif kind == "unknown_message":
            fault, bad = "unknown_message", rng.choice(corpus.unknown)
        elif kind == "undecodable":
            fault, bad = "after_hello", rng.choice(corpus.undecodable)
        else:
            source = telemetry_payload(rng.choice(corpus.batches), seq=seq) if rng.random() < 0.7 else \
                rng.choice(corpus.acks)
            scripts.append(StreamScript("mutated", None, (hello, *prefix, mutate(source, rng), *trailing),
                                        determinable=False))
            continue
        scripts.append(StreamScript(f"{kind}:{fault}", kind, (hello, *prefix, bad, *trailing)))
    return scripts


def huge_scripts(*, pool: common_pb2.Pool, limits: agent_pb2.EngineLimits) -> list[StreamScript]:
    """The costly extremes, built once: a batch of exactly MAX_BATCH_EVENTS completions (accepted), and
    MAX_BATCH_EVENTS + 1 completions or steps (oversize)."""
    hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(engine_id="huge", pool=pool, limits=limits,
                                                         vllm_version="0.32.0", agent_version="fuzz"))
    return [
        StreamScript("none:max_batch_events", None,
                     (hello, agent_pb2.AgentMessage(telemetry=huge_batch(seq=1, num_events=MAX_BATCH_EVENTS)))),
        StreamScript("oversize:completions", "oversize",
                     (hello, agent_pb2.AgentMessage(telemetry=huge_batch(seq=1, num_events=MAX_BATCH_EVENTS + 1)))),
        StreamScript("oversize:steps", "oversize",
                     (hello, agent_pb2.AgentMessage(telemetry=huge_batch(seq=1, num_events=MAX_BATCH_EVENTS + 1,
                                                                         steps=True)))),
    ]


def draw_examples(strategy: st.SearchStrategy, *, count: int, seed: int) -> list:
    """`count` examples of `strategy`, the same for the same seed (hypothesis generation only: no shrinking,
    no example database, no deadline)."""
    found: list = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: object) -> None:
        found.append(example)

    collect()
    return found


# ---------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------


def non_finite_doubles(message: Message, path: str = "") -> list[str]:
    """Dotted paths of every NaN or ±inf double/float in `message`, nested messages, repeated fields and maps
    included (an empty list when every number is finite)."""
    found: list[str] = []
    for descriptor, value in message.ListFields():
        name = f"{path}.{descriptor.name}" if path else descriptor.name
        repeated = descriptor.is_repeated
        if descriptor.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            values = list(value) if repeated else [value]
            found.extend(f"{name}[{i}]" if repeated else name for i, v in enumerate(values) if not math.isfinite(v))
        elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
            if descriptor.message_type.GetOptions().map_entry:
                value_field = descriptor.message_type.fields_by_name["value"]
                for key, item in value.items():
                    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        found.extend(non_finite_doubles(item, f"{name}[{key!r}]"))
                    elif value_field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT) \
                            and not math.isfinite(item):
                        found.append(f"{name}[{key!r}]")
            elif repeated:
                for i, item in enumerate(value):
                    found.extend(non_finite_doubles(item, f"{name}[{i}]"))
            else:
                found.extend(non_finite_doubles(value, name))
    return found


# ---------------------------------------------------------------------------------------------------------
# Drivers
# ---------------------------------------------------------------------------------------------------------


def raw_connect(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    """AgentService.Connect sending bytes as they are (no request serializer)."""
    return channel.stream_stream(CONNECT_METHOD, request_serializer=None,
                                 response_deserializer=agent_pb2.ControllerMessage.FromString)


# What grpc's Python client reports when the server ends a bidirectional call while the client is still
# writing requests: the client loses the server's status (grpc's, not the controller's: a handler that only
# aborts shows it too). Such a stream was ended by the server, the status it sent is unknown to the client.
LOST_STATUS = (grpc.StatusCode.INTERNAL, "Internal error from Core")


@dataclass
class StreamOutcome:
    """How one scripted stream ended: its status (None when it did not end within the timeout)."""

    script: StreamScript
    engine_id: str | None
    code: grpc.StatusCode | None
    details: str
    decisions: list[common_pb2.Decision]

    @property
    def status_lost(self) -> bool:
        """The server ended the stream while the client was writing and grpc lost its status (LOST_STATUS)."""
        return (self.code, self.details) == LOST_STATUS

    @property
    def rejected(self) -> bool:
        """Ended by the server with a rejection status (or with a status the client lost while writing)."""
        return self.code in REJECTION_CODES or self.status_lost


async def run_script(channel: grpc.aio.Channel, script: StreamScript, *, engine_id: str | None = None,
                     payloads: Sequence[bytes] | None = None, metadata: Sequence[tuple[str, str]] = (),
                     timeout_s: float = 30.0) -> StreamOutcome:
    """Send every message of `script` (then half-close) and read until the server ends the stream.

    payloads: `script.encode(engine_id=engine_id)` done beforehand (serialising a 24 MB batch takes the
    event loop for a while: encode first when the loop's latency is being measured).
    """
    if payloads is None:
        payloads = script.encode(engine_id=engine_id)

    async def requests() -> AsyncIterator[bytes]:
        for payload in payloads:
            yield payload

    call = raw_connect(channel)(requests(), metadata=tuple(metadata))
    decisions: list[common_pb2.Decision] = []
    try:
        async with asyncio.timeout(timeout_s):
            async for message in call:
                decisions.append(message.decision)
            return StreamOutcome(script, engine_id, await call.code(), await call.details(), decisions)
    except grpc.aio.AioRpcError as exc:
        return StreamOutcome(script, engine_id, exc.code(), exc.details() or "", decisions)
    except TimeoutError:
        call.cancel()
        return StreamOutcome(script, engine_id, None, f"no end within {timeout_s} s", decisions)


@dataclass
class LiveAgent:
    """A long-lived Connect stream opened with a given Hello; it ACKs every decision (like a real agent when
    `auto_ack`) and records each decision with its arrival time (event-loop seconds)."""

    channel: grpc.aio.Channel
    hello: agent_pb2.Hello
    metadata: Sequence[tuple[str, str]] = ()
    auto_ack: bool = True
    received: list[tuple[float, common_pb2.Decision]] = field(default_factory=list)
    code: grpc.StatusCode | None = None
    details: str = ""
    _outgoing: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _call: grpc.aio.StreamStreamCall | None = None
    _reader: asyncio.Task[None] | None = None

    @property
    def engine_id(self) -> str:
        return self.hello.engine_id

    async def open(self, *, first: Part | None = None) -> LiveAgent:
        """Start the stream with the Hello (or with `first` instead: any message or bytes)."""
        self._call = raw_connect(self.channel)(self._requests(), metadata=tuple(self.metadata))
        await self.send(first if first is not None else agent_pb2.AgentMessage(hello=self.hello))
        self._reader = asyncio.create_task(self._read())
        return self

    async def _requests(self) -> AsyncIterator[bytes]:
        while True:
            payload = await self._outgoing.get()
            if payload is None:
                return
            yield payload

    async def _read(self) -> None:
        assert self._call is not None
        try:
            async for message in self._call:
                self.received.append((asyncio.get_running_loop().time(), message.decision))
                self._arrived.set()
                if self.auto_ack:
                    await self.send(agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(
                        version=message.decision.version, applied=True)))
            self.code, self.details = await self._call.code(), await self._call.details()
        except grpc.aio.AioRpcError as exc:
            self.code, self.details = exc.code(), exc.details() or ""
        finally:
            self._arrived.set()

    async def send(self, message: Part) -> None:
        await self._outgoing.put(message if isinstance(message, bytes) else message.SerializeToString())

    async def send_batch(self, batch: agent_pb2.TelemetryBatch) -> None:
        await self.send(agent_pb2.AgentMessage(telemetry=batch))

    async def decision(self, *, after: int = 0, timeout_s: float = 10.0,
                       where: Callable[[common_pb2.Decision], bool] | None = None) -> common_pb2.Decision:
        """The first decision received at index ≥ `after` that satisfies `where`.

        Raises:
            TimeoutError: none within timeout_s (the stream's status, if it ended, is in the message).
        """
        deadline = asyncio.get_running_loop().time() + timeout_s
        index = after
        while True:
            while index < len(self.received):
                decision = self.received[index][1]
                index += 1
                if where is None or where(decision):
                    return decision
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0 or self.ended:
                raise TimeoutError(f"{self.engine_id}: no matching decision within {timeout_s} s "
                                   f"(stream status {self.code}: {self.details})")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    @property
    def ended(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def finished(self, *, timeout_s: float = 10.0) -> grpc.StatusCode | None:
        """Wait until the server ended the stream; returns its status code."""
        assert self._reader is not None
        await asyncio.wait_for(asyncio.shield(self._reader), timeout_s)
        return self.code

    async def close(self) -> None:
        """Half-close and wait for the end (cancelled after 5 s)."""
        await self._outgoing.put(None)
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._reader), 5.0)
        if self._call is not None and not self.ended:
            self._call.cancel()

    def max_gap_s(self, *, since: float, until: float) -> float:
        """The longest time in [since, until] without a decision (event-loop seconds): between `since` and the
        first decision after it, between consecutive decisions, and from the last one to `until`."""
        times = [since, *(t for t, _ in self.received if since < t <= until), until]
        return max(b - a for a, b in itertools.pairwise(times))


async def stream_telemetry(agent: LiveAgent, seed: int, stop: asyncio.Event, *, period_s: float = 0.2) -> None:
    """A well-behaved engine's telemetry on `agent`: a batch of 40 geometric completions every period_s, numbered
    from 1, until `stop` is set."""
    rng = np.random.default_rng(seed)
    seq = 1
    while not stop.is_set():
        await agent.send_batch(geometric_batch(seq, rng, num=40))
        seq += 1
        await asyncio.sleep(period_s)
