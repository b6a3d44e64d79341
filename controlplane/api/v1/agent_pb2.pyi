from controlplane.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SupportLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUPPORT_LEVEL_UNSPECIFIED: _ClassVar[SupportLevel]
    SUPPORT_LEVEL_FULL: _ClassVar[SupportLevel]
    SUPPORT_LEVEL_DEGRADED: _ClassVar[SupportLevel]
    SUPPORT_LEVEL_STOCK: _ClassVar[SupportLevel]
SUPPORT_LEVEL_UNSPECIFIED: SupportLevel
SUPPORT_LEVEL_FULL: SupportLevel
SUPPORT_LEVEL_DEGRADED: SupportLevel
SUPPORT_LEVEL_STOCK: SupportLevel

class AgentMessage(_message.Message):
    __slots__ = ("hello", "telemetry", "ack")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    telemetry: TelemetryBatch
    ack: DecisionAck
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., telemetry: _Optional[_Union[TelemetryBatch, _Mapping]] = ..., ack: _Optional[_Union[DecisionAck, _Mapping]] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: _common_pb2.Decision
    def __init__(self, decision: _Optional[_Union[_common_pb2.Decision, _Mapping]] = ...) -> None: ...

class EngineLimits(_message.Message):
    __slots__ = ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "block_size_tokens", "max_model_len_tokens")
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    block_size_tokens: int
    max_model_len_tokens: int
    def __init__(self, max_num_seqs: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ..., block_size_tokens: _Optional[int] = ..., max_model_len_tokens: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("engine_id", "pool", "vllm_version", "agent_version", "limits", "instance_id", "instance_started_at_s", "support")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    VLLM_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_STARTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    pool: _common_pb2.Pool
    vllm_version: str
    agent_version: str
    limits: EngineLimits
    instance_id: str
    instance_started_at_s: float
    support: AgentSupport
    def __init__(self, engine_id: _Optional[str] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., vllm_version: _Optional[str] = ..., agent_version: _Optional[str] = ..., limits: _Optional[_Union[EngineLimits, _Mapping]] = ..., instance_id: _Optional[str] = ..., instance_started_at_s: _Optional[float] = ..., support: _Optional[_Union[AgentSupport, _Mapping]] = ...) -> None: ...

class AgentSupport(_message.Message):
    __slots__ = ("level", "missing", "detail")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    level: SupportLevel
    missing: _containers.RepeatedScalarFieldContainer[str]
    detail: str
    def __init__(self, level: _Optional[_Union[SupportLevel, str]] = ..., missing: _Optional[_Iterable[str]] = ..., detail: _Optional[str] = ...) -> None: ...

class Completions(_message.Message):
    __slots__ = ("prompt_tokens", "output_tokens", "finish_time_s", "aborted", "admitted_time_s", "arrival_time_s", "first_token_time_s")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_S_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TIME_S_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    output_tokens: _containers.RepeatedScalarFieldContainer[int]
    finish_time_s: _containers.RepeatedScalarFieldContainer[float]
    aborted: _containers.RepeatedScalarFieldContainer[bool]
    admitted_time_s: _containers.RepeatedScalarFieldContainer[float]
    arrival_time_s: _containers.RepeatedScalarFieldContainer[float]
    first_token_time_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, prompt_tokens: _Optional[_Iterable[int]] = ..., output_tokens: _Optional[_Iterable[int]] = ..., finish_time_s: _Optional[_Iterable[float]] = ..., aborted: _Optional[_Iterable[bool]] = ..., admitted_time_s: _Optional[_Iterable[float]] = ..., arrival_time_s: _Optional[_Iterable[float]] = ..., first_token_time_s: _Optional[_Iterable[float]] = ...) -> None: ...

class Steps(_message.Message):
    __slots__ = ("prefill_tokens", "decode_tokens", "decode_requests", "duration_s", "mode", "budget_tokens", "packed_columns")
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PACKED_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    prefill_tokens: _containers.RepeatedScalarFieldContainer[int]
    decode_tokens: _containers.RepeatedScalarFieldContainer[int]
    decode_requests: _containers.RepeatedScalarFieldContainer[int]
    duration_s: _containers.RepeatedScalarFieldContainer[float]
    mode: _containers.RepeatedScalarFieldContainer[_common_pb2.Mode]
    budget_tokens: _containers.RepeatedScalarFieldContainer[int]
    packed_columns: bytes
    def __init__(self, prefill_tokens: _Optional[_Iterable[int]] = ..., decode_tokens: _Optional[_Iterable[int]] = ..., decode_requests: _Optional[_Iterable[int]] = ..., duration_s: _Optional[_Iterable[float]] = ..., mode: _Optional[_Iterable[_Union[_common_pb2.Mode, str]]] = ..., budget_tokens: _Optional[_Iterable[int]] = ..., packed_columns: _Optional[bytes] = ...) -> None: ...

class SchedulerState(_message.Message):
    __slots__ = ("num_running_prefills", "num_running_decodes", "num_waiting", "largest_remaining_prefill_tokens")
    NUM_RUNNING_PREFILLS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_DECODES_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    LARGEST_REMAINING_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_running_prefills: int
    num_running_decodes: int
    num_waiting: int
    largest_remaining_prefill_tokens: int
    def __init__(self, num_running_prefills: _Optional[int] = ..., num_running_decodes: _Optional[int] = ..., num_waiting: _Optional[int] = ..., largest_remaining_prefill_tokens: _Optional[int] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("num_preemptions", "num_events_dropped")
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_EVENTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    num_preemptions: int
    num_events_dropped: int
    def __init__(self, num_preemptions: _Optional[int] = ..., num_events_dropped: _Optional[int] = ...) -> None: ...

class RunningLengths(_message.Message):
    __slots__ = ("output_tokens", "num_requests", "admitted_time_s")
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    output_tokens: _containers.RepeatedScalarFieldContainer[int]
    num_requests: _containers.RepeatedScalarFieldContainer[int]
    admitted_time_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, output_tokens: _Optional[_Iterable[int]] = ..., num_requests: _Optional[_Iterable[int]] = ..., admitted_time_s: _Optional[_Iterable[float]] = ...) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("seq", "completions", "steps", "kv_used_tokens", "kv_total_tokens", "scheduler", "counters", "sent_at_s", "traceparent", "running")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    KV_USED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_S_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    seq: int
    completions: Completions
    steps: Steps
    kv_used_tokens: int
    kv_total_tokens: int
    scheduler: SchedulerState
    counters: Counters
    sent_at_s: float
    traceparent: str
    running: RunningLengths
    def __init__(self, seq: _Optional[int] = ..., completions: _Optional[_Union[Completions, _Mapping]] = ..., steps: _Optional[_Union[Steps, _Mapping]] = ..., kv_used_tokens: _Optional[int] = ..., kv_total_tokens: _Optional[int] = ..., scheduler: _Optional[_Union[SchedulerState, _Mapping]] = ..., counters: _Optional[_Union[Counters, _Mapping]] = ..., sent_at_s: _Optional[float] = ..., traceparent: _Optional[str] = ..., running: _Optional[_Union[RunningLengths, _Mapping]] = ...) -> None: ...

class DecisionAck(_message.Message):
    __slots__ = ("version", "applied", "reject_reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    REJECT_REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    applied: bool
    reject_reason: str
    def __init__(self, version: _Optional[int] = ..., applied: _Optional[bool] = ..., reject_reason: _Optional[str] = ...) -> None: ...
