from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_ROLE_UNSPECIFIED: _ClassVar[KvRole]
    KV_ROLE_PRODUCER: _ClassVar[KvRole]
    KV_ROLE_CONSUMER: _ClassVar[KvRole]
    KV_ROLE_BOTH: _ClassVar[KvRole]

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_MB: _ClassVar[Mode]
    MODE_EB: _ClassVar[Mode]
    MODE_PASSTHROUGH: _ClassVar[Mode]
KV_ROLE_UNSPECIFIED: KvRole
KV_ROLE_PRODUCER: KvRole
KV_ROLE_CONSUMER: KvRole
KV_ROLE_BOTH: KvRole
MODE_UNSPECIFIED: Mode
MODE_MB: Mode
MODE_EB: Mode
MODE_PASSTHROUGH: Mode

class Pool(_message.Message):
    __slots__ = ("model", "accelerator", "kv_role")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    KV_ROLE_FIELD_NUMBER: _ClassVar[int]
    model: str
    accelerator: str
    kv_role: KvRole
    def __init__(self, model: _Optional[str] = ..., accelerator: _Optional[str] = ..., kv_role: _Optional[_Union[KvRole, str]] = ...) -> None: ...

class BudgetPolicy(_message.Message):
    __slots__ = ("b_max_tokens", "b_cap_tokens", "n_th", "t_large_tokens", "n_d_large")
    B_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    B_CAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_TH_FIELD_NUMBER: _ClassVar[int]
    T_LARGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    N_D_LARGE_FIELD_NUMBER: _ClassVar[int]
    b_max_tokens: int
    b_cap_tokens: int
    n_th: int
    t_large_tokens: int
    n_d_large: int
    def __init__(self, b_max_tokens: _Optional[int] = ..., b_cap_tokens: _Optional[int] = ..., n_th: _Optional[int] = ..., t_large_tokens: _Optional[int] = ..., n_d_large: _Optional[int] = ...) -> None: ...

class Diagnostics(_message.Message):
    __slots__ = ("p0", "eta", "mu_l_tokens", "mu_o_tokens", "sigma_o_tokens", "t95_tokens", "theta0", "delta_theta", "theta_star", "n_star", "k_star", "lhs_s_per_token", "rhs_s_per_token", "n_obs", "num_samples", "num_rejected_samples", "pool_window_end_bucket", "cost_source", "window_first_bucket", "window_rebased", "window_transient", "num_censored", "num_truncated", "num_shifts", "last_shift", "num_unconfirmed_shifts", "mu_o_lower_tokens", "cold_start_mu_l_tokens", "cold_start_mu_o_tokens", "cold_start_p0", "data_age_s")
    P0_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    MU_L_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MU_O_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIGMA_O_TOKENS_FIELD_NUMBER: _ClassVar[int]
    T95_TOKENS_FIELD_NUMBER: _ClassVar[int]
    THETA0_FIELD_NUMBER: _ClassVar[int]
    DELTA_THETA_FIELD_NUMBER: _ClassVar[int]
    THETA_STAR_FIELD_NUMBER: _ClassVar[int]
    N_STAR_FIELD_NUMBER: _ClassVar[int]
    K_STAR_FIELD_NUMBER: _ClassVar[int]
    LHS_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RHS_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    N_OBS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    NUM_REJECTED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    POOL_WINDOW_END_BUCKET_FIELD_NUMBER: _ClassVar[int]
    COST_SOURCE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIRST_BUCKET_FIELD_NUMBER: _ClassVar[int]
    WINDOW_REBASED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TRANSIENT_FIELD_NUMBER: _ClassVar[int]
    NUM_CENSORED_FIELD_NUMBER: _ClassVar[int]
    NUM_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NUM_SHIFTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SHIFT_FIELD_NUMBER: _ClassVar[int]
    NUM_UNCONFIRMED_SHIFTS_FIELD_NUMBER: _ClassVar[int]
    MU_O_LOWER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLD_START_MU_L_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLD_START_MU_O_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLD_START_P0_FIELD_NUMBER: _ClassVar[int]
    DATA_AGE_S_FIELD_NUMBER: _ClassVar[int]
    p0: float
    eta: float
    mu_l_tokens: float
    mu_o_tokens: float
    sigma_o_tokens: float
    t95_tokens: float
    theta0: float
    delta_theta: float
    theta_star: float
    n_star: int
    k_star: int
    lhs_s_per_token: float
    rhs_s_per_token: float
    n_obs: float
    num_samples: int
    num_rejected_samples: int
    pool_window_end_bucket: int
    cost_source: str
    window_first_bucket: int
    window_rebased: bool
    window_transient: bool
    num_censored: int
    num_truncated: int
    num_shifts: int
    last_shift: PoolShift
    num_unconfirmed_shifts: int
    mu_o_lower_tokens: float
    cold_start_mu_l_tokens: float
    cold_start_mu_o_tokens: float
    cold_start_p0: float
    data_age_s: float
    def __init__(self, p0: _Optional[float] = ..., eta: _Optional[float] = ..., mu_l_tokens: _Optional[float] = ..., mu_o_tokens: _Optional[float] = ..., sigma_o_tokens: _Optional[float] = ..., t95_tokens: _Optional[float] = ..., theta0: _Optional[float] = ..., delta_theta: _Optional[float] = ..., theta_star: _Optional[float] = ..., n_star: _Optional[int] = ..., k_star: _Optional[int] = ..., lhs_s_per_token: _Optional[float] = ..., rhs_s_per_token: _Optional[float] = ..., n_obs: _Optional[float] = ..., num_samples: _Optional[int] = ..., num_rejected_samples: _Optional[int] = ..., pool_window_end_bucket: _Optional[int] = ..., cost_source: _Optional[str] = ..., window_first_bucket: _Optional[int] = ..., window_rebased: _Optional[bool] = ..., window_transient: _Optional[bool] = ..., num_censored: _Optional[int] = ..., num_truncated: _Optional[int] = ..., num_shifts: _Optional[int] = ..., last_shift: _Optional[_Union[PoolShift, _Mapping]] = ..., num_unconfirmed_shifts: _Optional[int] = ..., mu_o_lower_tokens: _Optional[float] = ..., cold_start_mu_l_tokens: _Optional[float] = ..., cold_start_mu_o_tokens: _Optional[float] = ..., cold_start_p0: _Optional[float] = ..., data_age_s: _Optional[float] = ...) -> None: ...

class PoolShift(_message.Message):
    __slots__ = ("start_bucket", "detected_bucket", "direction", "mean_ratio")
    START_BUCKET_FIELD_NUMBER: _ClassVar[int]
    DETECTED_BUCKET_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MEAN_RATIO_FIELD_NUMBER: _ClassVar[int]
    start_bucket: int
    detected_bucket: int
    direction: int
    mean_ratio: float
    def __init__(self, start_bucket: _Optional[int] = ..., detected_bucket: _Optional[int] = ..., direction: _Optional[int] = ..., mean_ratio: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("version", "mode", "k", "n", "budget", "delta_s_per_token", "delta_source", "ttl_s", "advisory", "reason", "flags", "decided_at_s", "trace_id", "diagnostics", "trigger_traceparent")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    DELTA_S_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DELTA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    ADVISORY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_S_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    version: int
    mode: Mode
    k: int
    n: int
    budget: BudgetPolicy
    delta_s_per_token: float
    delta_source: str
    ttl_s: float
    advisory: bool
    reason: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    decided_at_s: float
    trace_id: str
    diagnostics: Diagnostics
    trigger_traceparent: str
    def __init__(self, version: _Optional[int] = ..., mode: _Optional[_Union[Mode, str]] = ..., k: _Optional[int] = ..., n: _Optional[int] = ..., budget: _Optional[_Union[BudgetPolicy, _Mapping]] = ..., delta_s_per_token: _Optional[float] = ..., delta_source: _Optional[str] = ..., ttl_s: _Optional[float] = ..., advisory: _Optional[bool] = ..., reason: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ..., decided_at_s: _Optional[float] = ..., trace_id: _Optional[str] = ..., diagnostics: _Optional[_Union[Diagnostics, _Mapping]] = ..., trigger_traceparent: _Optional[str] = ...) -> None: ...
