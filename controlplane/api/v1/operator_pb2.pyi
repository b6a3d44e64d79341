from controlplane.api.v1 import agent_pb2 as _agent_pb2
from controlplane.api.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScopeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCOPE_KIND_UNSPECIFIED: _ClassVar[ScopeKind]
    SCOPE_KIND_FLEET: _ClassVar[ScopeKind]
    SCOPE_KIND_POOL: _ClassVar[ScopeKind]
    SCOPE_KIND_ENGINE: _ClassVar[ScopeKind]

class PinnedMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PINNED_MODE_UNSPECIFIED: _ClassVar[PinnedMode]
    PINNED_MODE_MB: _ClassVar[PinnedMode]
    PINNED_MODE_EB: _ClassVar[PinnedMode]
    PINNED_MODE_PASSTHROUGH: _ClassVar[PinnedMode]
    PINNED_MODE_ADVISORY: _ClassVar[PinnedMode]

class OverrideKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERRIDE_KIND_UNSPECIFIED: _ClassVar[OverrideKind]
    OVERRIDE_KIND_DELTA: _ClassVar[OverrideKind]
    OVERRIDE_KIND_PIN: _ClassVar[OverrideKind]
    OVERRIDE_KIND_OBJECTIVE: _ClassVar[OverrideKind]

class ObjectiveState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OBJECTIVE_STATE_UNSPECIFIED: _ClassVar[ObjectiveState]
    OBJECTIVE_STATE_NO_LATENCY_DATA: _ClassVar[ObjectiveState]
    OBJECTIVE_STATE_MEETING: _ClassVar[ObjectiveState]
    OBJECTIVE_STATE_ADJUSTING: _ClassVar[ObjectiveState]
    OBJECTIVE_STATE_INFEASIBLE: _ClassVar[ObjectiveState]

class RolloutAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_ACTION_UNSPECIFIED: _ClassVar[RolloutAction]
    ROLLOUT_ACTION_PROMOTE: _ClassVar[RolloutAction]
    ROLLOUT_ACTION_ABORT: _ClassVar[RolloutAction]
SCOPE_KIND_UNSPECIFIED: ScopeKind
SCOPE_KIND_FLEET: ScopeKind
SCOPE_KIND_POOL: ScopeKind
SCOPE_KIND_ENGINE: ScopeKind
PINNED_MODE_UNSPECIFIED: PinnedMode
PINNED_MODE_MB: PinnedMode
PINNED_MODE_EB: PinnedMode
PINNED_MODE_PASSTHROUGH: PinnedMode
PINNED_MODE_ADVISORY: PinnedMode
OVERRIDE_KIND_UNSPECIFIED: OverrideKind
OVERRIDE_KIND_DELTA: OverrideKind
OVERRIDE_KIND_PIN: OverrideKind
OVERRIDE_KIND_OBJECTIVE: OverrideKind
OBJECTIVE_STATE_UNSPECIFIED: ObjectiveState
OBJECTIVE_STATE_NO_LATENCY_DATA: ObjectiveState
OBJECTIVE_STATE_MEETING: ObjectiveState
OBJECTIVE_STATE_ADJUSTING: ObjectiveState
OBJECTIVE_STATE_INFEASIBLE: ObjectiveState
ROLLOUT_ACTION_UNSPECIFIED: RolloutAction
ROLLOUT_ACTION_PROMOTE: RolloutAction
ROLLOUT_ACTION_ABORT: RolloutAction

class Scope(_message.Message):
    __slots__ = ("kind", "pool", "engine_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    kind: ScopeKind
    pool: _common_pb2.Pool
    engine_id: str
    def __init__(self, kind: _Optional[_Union[ScopeKind, str]] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., engine_id: _Optional[str] = ...) -> None: ...

class SetDeltaRequest(_message.Message):
    __slots__ = ("scope", "delta_s_per_token", "expires_in_s", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    DELTA_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    delta_s_per_token: float
    expires_in_s: float
    reason: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., delta_s_per_token: _Optional[float] = ..., expires_in_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class PinModeRequest(_message.Message):
    __slots__ = ("scope", "mode", "k", "n", "expires_in_s", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    mode: PinnedMode
    k: int
    n: int
    expires_in_s: float
    reason: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., mode: _Optional[_Union[PinnedMode, str]] = ..., k: _Optional[int] = ..., n: _Optional[int] = ..., expires_in_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class LatencyObjective(_message.Message):
    __slots__ = ("ttft_quantile", "ttft_target_s", "tpot_quantile", "tpot_target_s", "delta_min_s_per_token", "delta_max_s_per_token", "budget_min_tokens", "budget_max_tokens")
    TTFT_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    TTFT_TARGET_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    TPOT_TARGET_S_FIELD_NUMBER: _ClassVar[int]
    DELTA_MIN_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DELTA_MAX_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ttft_quantile: float
    ttft_target_s: float
    tpot_quantile: float
    tpot_target_s: float
    delta_min_s_per_token: float
    delta_max_s_per_token: float
    budget_min_tokens: int
    budget_max_tokens: int
    def __init__(self, ttft_quantile: _Optional[float] = ..., ttft_target_s: _Optional[float] = ..., tpot_quantile: _Optional[float] = ..., tpot_target_s: _Optional[float] = ..., delta_min_s_per_token: _Optional[float] = ..., delta_max_s_per_token: _Optional[float] = ..., budget_min_tokens: _Optional[int] = ..., budget_max_tokens: _Optional[int] = ...) -> None: ...

class SetObjectiveRequest(_message.Message):
    __slots__ = ("scope", "objective", "expires_in_s", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    objective: LatencyObjective
    expires_in_s: float
    reason: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., objective: _Optional[_Union[LatencyObjective, _Mapping]] = ..., expires_in_s: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ClearOverrideRequest(_message.Message):
    __slots__ = ("scope", "kind", "reason")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    kind: OverrideKind
    reason: str
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., kind: _Optional[_Union[OverrideKind, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class OverrideRecord(_message.Message):
    __slots__ = ("scope", "kind", "delta_s_per_token", "mode", "k", "n", "expires_at_s", "set_by", "set_at_s", "reason", "cleared", "warnings", "objective")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DELTA_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_S_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SET_AT_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    scope: Scope
    kind: OverrideKind
    delta_s_per_token: float
    mode: PinnedMode
    k: int
    n: int
    expires_at_s: float
    set_by: str
    set_at_s: float
    reason: str
    cleared: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    objective: LatencyObjective
    def __init__(self, scope: _Optional[_Union[Scope, _Mapping]] = ..., kind: _Optional[_Union[OverrideKind, str]] = ..., delta_s_per_token: _Optional[float] = ..., mode: _Optional[_Union[PinnedMode, str]] = ..., k: _Optional[int] = ..., n: _Optional[int] = ..., expires_at_s: _Optional[float] = ..., set_by: _Optional[str] = ..., set_at_s: _Optional[float] = ..., reason: _Optional[str] = ..., cleared: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ..., objective: _Optional[_Union[LatencyObjective, _Mapping]] = ...) -> None: ...

class GetDecisionRequest(_message.Message):
    __slots__ = ("engine_id",)
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    def __init__(self, engine_id: _Optional[str] = ...) -> None: ...

class DecisionView(_message.Message):
    __slots__ = ("engine_id", "pool", "decision", "acked_version", "latest", "computed_at_s", "outcomes")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ACKED_VERSION_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    pool: _common_pb2.Pool
    decision: _common_pb2.Decision
    acked_version: int
    latest: _common_pb2.Decision
    computed_at_s: float
    outcomes: PoolOutcomes
    def __init__(self, engine_id: _Optional[str] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., decision: _Optional[_Union[_common_pb2.Decision, _Mapping]] = ..., acked_version: _Optional[int] = ..., latest: _Optional[_Union[_common_pb2.Decision, _Mapping]] = ..., computed_at_s: _Optional[float] = ..., outcomes: _Optional[_Union[PoolOutcomes, _Mapping]] = ...) -> None: ...

class LatencyQuantiles(_message.Message):
    __slots__ = ("num_requests", "p50_s", "p90_s", "p99_s", "mean_s")
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P90_S_FIELD_NUMBER: _ClassVar[int]
    P99_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    num_requests: int
    p50_s: float
    p90_s: float
    p99_s: float
    mean_s: float
    def __init__(self, num_requests: _Optional[int] = ..., p50_s: _Optional[float] = ..., p90_s: _Optional[float] = ..., p99_s: _Optional[float] = ..., mean_s: _Optional[float] = ...) -> None: ...

class PoolOutcomes(_message.Message):
    __slots__ = ("window_s", "ttft", "tpot", "queue", "objective_state", "objective_detail", "objective", "rollout")
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    TPOT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_STATE_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    OBJECTIVE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    window_s: float
    ttft: LatencyQuantiles
    tpot: LatencyQuantiles
    queue: LatencyQuantiles
    objective_state: ObjectiveState
    objective_detail: str
    objective: LatencyObjective
    rollout: str
    def __init__(self, window_s: _Optional[float] = ..., ttft: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., tpot: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., queue: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., objective_state: _Optional[_Union[ObjectiveState, str]] = ..., objective_detail: _Optional[str] = ..., objective: _Optional[_Union[LatencyObjective, _Mapping]] = ..., rollout: _Optional[str] = ...) -> None: ...

class ListEnginesRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("engine_id", "pool", "vllm_version", "agent_version", "limits", "connected", "telemetry_age_s", "decision_version", "acked_version", "num_completions", "num_rejected_events", "num_sequence_gaps", "controller_id", "instance_id", "excluded_from_pool", "support")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    VLLM_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DECISION_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACKED_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    NUM_SEQUENCE_GAPS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_FROM_POOL_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    pool: _common_pb2.Pool
    vllm_version: str
    agent_version: str
    limits: _agent_pb2.EngineLimits
    connected: bool
    telemetry_age_s: float
    decision_version: int
    acked_version: int
    num_completions: int
    num_rejected_events: int
    num_sequence_gaps: int
    controller_id: str
    instance_id: str
    excluded_from_pool: bool
    support: _agent_pb2.AgentSupport
    def __init__(self, engine_id: _Optional[str] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., vllm_version: _Optional[str] = ..., agent_version: _Optional[str] = ..., limits: _Optional[_Union[_agent_pb2.EngineLimits, _Mapping]] = ..., connected: _Optional[bool] = ..., telemetry_age_s: _Optional[float] = ..., decision_version: _Optional[int] = ..., acked_version: _Optional[int] = ..., num_completions: _Optional[int] = ..., num_rejected_events: _Optional[int] = ..., num_sequence_gaps: _Optional[int] = ..., controller_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., excluded_from_pool: _Optional[bool] = ..., support: _Optional[_Union[_agent_pb2.AgentSupport, _Mapping]] = ...) -> None: ...

class ListEnginesResponse(_message.Message):
    __slots__ = ("engines",)
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    def __init__(self, engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ...) -> None: ...

class WatchDecisionsRequest(_message.Message):
    __slots__ = ("pool", "engine_id", "since_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_S_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    engine_id: str
    since_s: float
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., engine_id: _Optional[str] = ..., since_s: _Optional[float] = ...) -> None: ...

class Calibration(_message.Message):
    __slots__ = ("pool", "alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request", "alpha_mb_s", "mb_coeffs_s_per_token", "source", "set_by", "set_at_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ALPHA_P_S_FIELD_NUMBER: _ClassVar[int]
    BETA_P_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ALPHA_D_S_FIELD_NUMBER: _ClassVar[int]
    BETA_D_S_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    ALPHA_MB_S_FIELD_NUMBER: _ClassVar[int]
    MB_COEFFS_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SET_AT_S_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    alpha_p_s: float
    beta_p_s_per_token: float
    alpha_d_s: float
    beta_d_s_per_request: float
    alpha_mb_s: float
    mb_coeffs_s_per_token: _containers.RepeatedScalarFieldContainer[float]
    source: str
    set_by: str
    set_at_s: float
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., alpha_p_s: _Optional[float] = ..., beta_p_s_per_token: _Optional[float] = ..., alpha_d_s: _Optional[float] = ..., beta_d_s_per_request: _Optional[float] = ..., alpha_mb_s: _Optional[float] = ..., mb_coeffs_s_per_token: _Optional[_Iterable[float]] = ..., source: _Optional[str] = ..., set_by: _Optional[str] = ..., set_at_s: _Optional[float] = ...) -> None: ...

class PutCalibrationRequest(_message.Message):
    __slots__ = ("calibration",)
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    calibration: Calibration
    def __init__(self, calibration: _Optional[_Union[Calibration, _Mapping]] = ...) -> None: ...

class GetCalibrationRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ...) -> None: ...

class ListOverridesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListOverridesResponse(_message.Message):
    __slots__ = ("overrides",)
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[OverrideRecord]
    def __init__(self, overrides: _Optional[_Iterable[_Union[OverrideRecord, _Mapping]]] = ...) -> None: ...

class ListAuditRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("id", "at_s", "actor", "action", "target", "kind", "reason", "old_json", "new_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    AT_S_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    OLD_JSON_FIELD_NUMBER: _ClassVar[int]
    NEW_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    at_s: float
    actor: str
    action: str
    target: str
    kind: str
    reason: str
    old_json: str
    new_json: str
    def __init__(self, id: _Optional[str] = ..., at_s: _Optional[float] = ..., actor: _Optional[str] = ..., action: _Optional[str] = ..., target: _Optional[str] = ..., kind: _Optional[str] = ..., reason: _Optional[str] = ..., old_json: _Optional[str] = ..., new_json: _Optional[str] = ...) -> None: ...

class ListAuditResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class RolloutView(_message.Message):
    __slots__ = ("pool", "from_mode", "to_mode", "started_at_s", "ended_at_s", "state", "canary_engine_ids", "num_engines", "detail", "controller_id", "switchback", "challenge")
    POOL_FIELD_NUMBER: _ClassVar[int]
    FROM_MODE_FIELD_NUMBER: _ClassVar[int]
    TO_MODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_S_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CANARY_ENGINE_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ENGINES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    SWITCHBACK_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    from_mode: str
    to_mode: str
    started_at_s: float
    ended_at_s: float
    state: str
    canary_engine_ids: _containers.RepeatedScalarFieldContainer[str]
    num_engines: int
    detail: str
    controller_id: str
    switchback: bool
    challenge: bool
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., from_mode: _Optional[str] = ..., to_mode: _Optional[str] = ..., started_at_s: _Optional[float] = ..., ended_at_s: _Optional[float] = ..., state: _Optional[str] = ..., canary_engine_ids: _Optional[_Iterable[str]] = ..., num_engines: _Optional[int] = ..., detail: _Optional[str] = ..., controller_id: _Optional[str] = ..., switchback: _Optional[bool] = ..., challenge: _Optional[bool] = ...) -> None: ...

class ListRolloutsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRolloutsResponse(_message.Message):
    __slots__ = ("rollouts", "recent")
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    rollouts: _containers.RepeatedCompositeFieldContainer[RolloutView]
    recent: _containers.RepeatedCompositeFieldContainer[RolloutView]
    def __init__(self, rollouts: _Optional[_Iterable[_Union[RolloutView, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[RolloutView, _Mapping]]] = ...) -> None: ...

class SteerRolloutRequest(_message.Message):
    __slots__ = ("pool", "action", "reason")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    action: RolloutAction
    reason: str
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., action: _Optional[_Union[RolloutAction, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ListHistoryRequest(_message.Message):
    __slots__ = ("limit", "engine_id", "pool")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    limit: int
    engine_id: str
    pool: _common_pb2.Pool
    def __init__(self, limit: _Optional[int] = ..., engine_id: _Optional[str] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ...) -> None: ...

class HistoryEntry(_message.Message):
    __slots__ = ("id", "engine_id", "pool", "decided_at_s", "decision")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_S_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    id: str
    engine_id: str
    pool: _common_pb2.Pool
    decided_at_s: float
    decision: _common_pb2.Decision
    def __init__(self, id: _Optional[str] = ..., engine_id: _Optional[str] = ..., pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., decided_at_s: _Optional[float] = ..., decision: _Optional[_Union[_common_pb2.Decision, _Mapping]] = ...) -> None: ...

class ListHistoryResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[HistoryEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[HistoryEntry, _Mapping]]] = ...) -> None: ...

class ListLatencyHistoryRequest(_message.Message):
    __slots__ = ("pool", "since_s", "until_s", "limit")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SINCE_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_S_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    pool: _common_pb2.Pool
    since_s: float
    until_s: float
    limit: int
    def __init__(self, pool: _Optional[_Union[_common_pb2.Pool, _Mapping]] = ..., since_s: _Optional[float] = ..., until_s: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class LatencySample(_message.Message):
    __slots__ = ("at_s", "outcomes")
    AT_S_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    at_s: float
    outcomes: PoolOutcomes
    def __init__(self, at_s: _Optional[float] = ..., outcomes: _Optional[_Union[PoolOutcomes, _Mapping]] = ...) -> None: ...

class ListLatencyHistoryResponse(_message.Message):
    __slots__ = ("samples",)
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[LatencySample]
    def __init__(self, samples: _Optional[_Iterable[_Union[LatencySample, _Mapping]]] = ...) -> None: ...
