"""The controller's settings model: every setting with its section, default, rule and meaning (one
pydantic-settings model, `ControllerSettings`), how each maps to its flag, variable and file key, and the
parsers of the compound values (tokens, scopes). `controlplane.cli.settings` reads and resolves them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.service.config import ControllerConfig
from controlplane.store.urls import parse_store_url

ENV_PREFIX = "CP_"
CONFIG_ENV = "CP_CONFIG"
SECTIONS = ("server", "store", "security", "loop", "policy")
_LOOP = DecisionLoopConfig()
_POLICY = PolicyConfig()
_SERVER = {f.name: f.default for f in dataclasses.fields(ControllerConfig) if f.default is not dataclasses.MISSING}


class SettingsError(ValueError):
    """Invalid settings: the message names each bad setting, its value and where that value came from."""


class _RuleError(ValueError):
    """A rule over several settings is broken; `names` are the settings it involves."""

    def __init__(self, message: str, *names: str) -> None:
        super().__init__(message)
        self.names = names


def default_data_dir(env: Mapping[str, str]) -> Path:
    """$XDG_DATA_HOME/vllm-controlplane, else ~/.local/share/vllm-controlplane."""
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "vllm-controlplane"


def parse_tokens(text: str, *, source: str) -> dict[str, str]:
    """"identity:token,identity:token" → {token: identity}; raises ValueError naming the source (when not "")
    and never echoing a token."""
    tokens: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        identity, sep, token = item.partition(":")
        if not sep or not identity or len(token) < 16:
            raise ValueError(f"{source}: " * bool(source) + "expected identity:token with a token of ≥ 16 "
                             f"characters, got an entry for identity {identity!r} with a {len(token)}-character token")
        tokens[token] = identity
    return tokens


def parse_scopes(text: str) -> dict[str, tuple[str, ...]]:
    """"identity=glob;glob,identity=glob" → {identity: (glob, …)}: the engine ids each agent identity may
    hold (CP_AGENT_SCOPES); raises ValueError naming the bad entry."""
    scopes: dict[str, tuple[str, ...]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        identity, sep, globs = item.partition("=")
        patterns = tuple(filter(None, (g.strip() for g in globs.split(";"))))
        if not sep or not identity or not patterns:
            raise ValueError(f"CP_AGENT_SCOPES: expected identity=glob[;glob…], got {item!r}")
        scopes[identity] = patterns
    return scopes


def _setting(default: Any = None, *, section: str, doc: str, note: str = "", rule: str = "", flag: bool = True,
             env: str = "", default_factory: Callable[[], Any] | None = None, **constraints: Any) -> Any:
    """A settings field: its section, its meaning, a note on special values (shown after the default), the
    cross-setting rule it takes part in (text), and its variable when it is not CP_<NAME>."""
    extra = {"section": section, "note": note, "rule": rule, "flag": flag, "env": env}
    if default_factory is not None:
        return Field(default_factory=default_factory, description=doc, json_schema_extra=extra, **constraints)
    return Field(default, description=doc, json_schema_extra=extra, **constraints)


class ControllerSettings(BaseSettings):
    """Every knob of one controller process (server, store, security, decision loop, policy).

    Built by `resolve_controller_settings`, which gathers flags, environment and file with their sources;
    constructing it directly reads nothing but its keyword arguments.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, env_ignore_empty=True,
                                      extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    # server
    host: str = _setting(_SERVER["host"], section="server", rule="non-loopback needs TLS and tokens, or insecure",
                         doc="gRPC listen address", min_length=1)
    port: int = _setting(_SERVER["port"], section="server", doc="gRPC port", note="0 picks a free one", ge=0, le=65535)
    controller_id: str = _setting(section="server", doc="this replica's name",
                                  default_factory=lambda: f"controller-{os.getpid()}", min_length=1)
    metrics_port: int = _setting(_SERVER["metrics_port"], section="server", doc="Prometheus /metrics port",
                                 note="0: off", ge=0, le=65535)
    metrics_host: str = _setting(_SERVER["metrics_host"], section="server", min_length=1,
                                 doc="address /metrics listens on, unauthenticated (0.0.0.0: scrapes from "
                                 "other hosts)")
    max_connection_age_s: float = _setting(_SERVER["max_connection_age_s"], section="server", ge=0.0,
                                           note="0: never", doc="agent streams older than this end with GOAWAY and "
                                           "reconnect, spreading over replicas, s")
    readiness_grace_s: float = _setting(_SERVER["readiness_grace_s"], section="server", ge=0.0,
                                        doc="store outage tolerated before readiness turns NOT_SERVING, s")
    store_retry_s: float = _setting(_SERVER["store_retry_s"], section="server", gt=0.0,
                                    doc="pause between store reconnection attempts, s")
    registry_ttl_s: float = _setting(_SERVER["registry_ttl_s"], section="server", gt=0.0,
                                     doc="lifetime of this replica's registry entries, s",
                                     note="renewed every third of it")
    workers: int = _setting(1, section="server", ge=1, le=64, rule="> 1 needs a fixed port",
                            doc="controller processes on this host sharing the gRPC port, replicas of one another "
                            "(worker i: controller_id-w<i>, /metrics on metrics_port + i)")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = _setting(
        "INFO", section="server", doc="logging level")
    # store
    redis_url: str = _setting("", section="store", doc="Redis or Valkey to use instead of the embedded one: "
                              "redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// (see "
                              "controlplane/store/urls.py)")
    data_dir: Path | None = _setting(None, section="store", doc="embedded Redis data directory (used when no "
                                     "redis_url is given)")
    engine_retention_s: float = _setting(_SERVER["engine_retention_s"], section="store", ge=0.0, note="0: forever",
                                         doc="an engine's decision and epoch keys expire this long after its last "
                                         "decision write, and a pool's history after its latest entry, s")
    # security
    # CP_TLS_CERT / CP_TLS_KEY / CP_TLS_CA are `controlplane ctl`'s client credentials: the server's differ.
    tls_cert: Path | None = _setting(None, section="security", rule="with tls_key", env="CP_SERVER_TLS_CERT",
                                     doc="server certificate (PEM)")
    tls_key: Path | None = _setting(None, section="security", rule="with tls_cert", env="CP_SERVER_TLS_KEY",
                                    doc="server private key (PEM)")
    tls_client_ca: Path | None = _setting(None, section="security", rule="needs tls_cert",
                                          env="CP_SERVER_TLS_CLIENT_CA", doc="CA of client certificates (mutual TLS)")
    insecure: bool = _setting(False, section="security",
                              doc="allow a non-loopback address without TLS and tokens")
    agent_tokens: SecretStr = _setting(SecretStr(""), section="security", flag=False,
                                       rule="disjoint from operator_tokens",
                                       doc="agent bearer tokens, identity:token,… (AgentService only)")
    operator_tokens: SecretStr = _setting(SecretStr(""), section="security", flag=False,
                                          doc="operator bearer tokens, identity:token,… (OperatorService only)")
    agent_scopes: str = _setting("", section="security",
                                 doc="engine ids each agent identity may hold: identity=glob;glob,…")
    # loop
    decision_interval_s: float = _setting(_LOOP.interval_s, section="loop", gt=0.0,
                                          doc="recompute period, s")
    recompute_completions: int = _setting(_LOOP.recompute_completions, section="loop", ge=1,
                                          doc="new completions that make an engine's decision due")
    ttl_s: float = _setting(_LOOP.ttl_s, section="loop", gt=0.0,
                            doc="decision lifetime at the agent, s (re-sent every ttl_s/3)")
    engine_ttl_s: float = _setting(_LOOP.engine_ttl_s, section="loop", gt=0.0,
                                   doc="a disconnected engine is forgotten after this long, s")
    max_disconnected_engines: int = _setting(_LOOP.max_disconnected_engines, section="loop", ge=0,
                                             doc="disconnected engines one agent identity may leave remembered; "
                                             "past it its longest-disconnected is forgotten early",
                                             note="0: no limit")
    bucket_s: float = _setting(_LOOP.bucket_s, section="loop", gt=0.0, doc="length of one pool-statistics bucket, s")
    output_window: int = _setting(_LOOP.output_window, section="loop", ge=8, rule="≥ min_samples",
                                  doc="completions in a pool's output-length window, at least")
    prompt_window: int = _setting(_LOOP.prompt_window, section="loop", ge=8,
                                  doc="completions in a pool's prompt-length window, at least")
    step_window: int = _setting(_LOOP.step_window, section="loop", ge=8,
                                doc="steps per cost phase in a pool's cost window, at least")
    n_obs_time_constant_s: float = _setting(_LOOP.n_obs_time_constant_s, section="loop", gt=0.0,
                                            doc="time constant of the running-requests EMA (N_obs), s")
    max_window_s: float = _setting(_LOOP.max_window_s, section="loop", gt=0.0, rule="≥ bucket_s",
                                   doc="no bucket older than this enters a window, s")
    snapshot_interval_s: float = _setting(_LOOP.snapshot_interval_s, section="loop", gt=0.0,
                                          doc="how often a pool's window is saved for a warm start, s")
    snapshot_ttl_s: float = _setting(_LOOP.snapshot_ttl_s, section="loop", gt=0.0,
                                     doc="how long a saved window is kept, s")
    latency_history_interval_s: float = _setting(_LOOP.latency_history_interval_s, section="loop", ge=0.0,
                                                 doc="how often each pool's latency quantiles are recorded for "
                                                 "`ctl report`, s (0: not recorded)")
    latency_history_s: float = _setting(_LOOP.latency_history_s, section="loop", gt=0.0,
                                        doc="how long recorded latency quantiles are kept, s")
    shift_detection: bool = _setting(_LOOP.shift_detection, section="loop",
                                     doc="detect shifts of a pool's output lengths and re-base its window at them")
    shift_min_samples: int = _setting(_LOOP.shift_min_samples, section="loop", ge=1, rule="≤ output_window",
                                      doc="completions a re-based window needs before it is fitted (the pool "
                                      "keeps its previous fit until then)")
    # policy
    min_samples: int = _setting(_POLICY.min_samples, section="policy", ge=1, rule="≤ output_window",
                                doc="completions before a pool leaves cold start")
    theta_min: float = _setting(_POLICY.theta_min, section="policy", gt=0.0, lt=1.0, rule="≤ theta_max",
                                doc="lower clip of θ̂*")
    theta_max: float = _setting(_POLICY.theta_max, section="policy", gt=0.0, lt=1.0, rule="≥ theta_min",
                                doc="upper clip of θ̂*")
    oom_tolerance: float = _setting(_POLICY.oom_tolerance, section="policy", gt=0.0, lt=1.0,
                                    doc="ε: tolerated probability of exceeding the KV cache when sizing N")
    default_delta_s_per_token: float = _setting(_POLICY.default_delta_s_per_token, section="policy",
                                                ge=-DELTA_LIMIT_S_PER_TOKEN, le=DELTA_LIMIT_S_PER_TOKEN,
                                                doc="δ without an operator override, s/token (> 0 favours MB)")
    hysteresis_rel: float = _setting(_POLICY.hysteresis_rel, section="policy", ge=0.0,
                                     doc="EB+ relative hysteresis band")
    hysteresis_abs_s_per_token: float = _setting(_POLICY.hysteresis_abs_s_per_token, section="policy", ge=0.0,
                                                 doc="EB+ absolute hysteresis band, s/token")
    cooldown_s: float = _setting(_POLICY.cooldown_s, section="policy", ge=0.0,
                                 doc="EB+ minimum time between switches, s")
    cold_start_crossover: bool = _setting(_POLICY.cold_start_crossover, section="policy",
                                          doc="before min_samples completions, run EB when [EB] eq. (8) picks it at "
                                          "every length the engine serves")
    memory_guard: bool = _setting(_POLICY.memory_guard, section="policy",
                                  doc="lower N when an engine preempts under EB")
    guard_decrease_factor: float = _setting(_POLICY.guard_decrease_factor, section="policy", gt=0.0, lt=1.0,
                                            doc="memory guard: N is multiplied by this on preemption")
    guard_increase_fraction: float = _setting(_POLICY.guard_increase_fraction, section="policy", gt=0.0, le=1.0,
                                              doc="memory guard: N regrows by this fraction per clean interval")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # resolve_controller_settings gathers flags, environment and file itself, to know each value's source.
        return (init_settings,)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("redis_url")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value:
            parse_store_url(value)  # raises ValueError naming the problem
        return value

    @field_validator("tls_cert", "tls_key", "tls_client_ca")
    @classmethod
    def _existing_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file not found: {value}")
        return value

    @field_validator("agent_tokens", "operator_tokens")
    @classmethod
    def _tokens(cls, value: SecretStr) -> SecretStr:
        parse_tokens(value.get_secret_value(), source="")
        return value

    @field_validator("agent_scopes")
    @classmethod
    def _scopes(cls, value: str) -> str:
        parse_scopes(value)
        return value

    @model_validator(mode="after")
    def _together(self) -> ControllerSettings:
        if self.theta_min > self.theta_max:
            raise _RuleError(f"theta_min ({self.theta_min}) must be ≤ theta_max ({self.theta_max})",
                             "theta_min", "theta_max")
        if self.output_window < self.min_samples:
            raise _RuleError(f"output_window ({self.output_window} completions) must hold at least min_samples "
                             f"({self.min_samples}), or no decision ever leaves cold start",
                             "output_window", "min_samples")
        if self.shift_min_samples > self.output_window:
            raise _RuleError(f"shift_min_samples ({self.shift_min_samples}) must be ≤ output_window "
                             f"({self.output_window}): a re-based window holds at most that many completions",
                             "shift_min_samples", "output_window")
        if self.max_window_s < self.bucket_s:
            raise _RuleError(f"max_window_s ({self.max_window_s}) must be ≥ bucket_s ({self.bucket_s})",
                             "max_window_s", "bucket_s")
        if 0 < self.engine_retention_s < self.engine_ttl_s:
            raise _RuleError(f"engine_retention_s ({self.engine_retention_s}) must be 0 or ≥ engine_ttl_s "
                             f"({self.engine_ttl_s}): a remembered engine needs its keys",
                             "engine_retention_s", "engine_ttl_s")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise _RuleError("TLS needs both tls_cert and tls_key", "tls_cert", "tls_key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise _RuleError("tls_client_ca (mutual TLS) needs tls_cert and tls_key", "tls_client_ca", "tls_cert")
        agent = parse_tokens(self.agent_tokens.get_secret_value(), source="agent_tokens")
        operator = parse_tokens(self.operator_tokens.get_secret_value(), source="operator_tokens")
        if set(agent) & set(operator):
            raise _RuleError("a token cannot be both an agent and an operator token",
                             "agent_tokens", "operator_tokens")
        if not _is_loopback(self.host) and not ((agent or operator) and self.tls_cert is not None) \
                and not self.insecure:
            raise _RuleError(f"refusing to listen on non-loopback address {self.host!r} without TLS and token "
                             "authentication; pass --insecure (CP_INSECURE=1) to do it anyway",
                             "host", "tls_cert", "agent_tokens", "insecure")
        return self


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


FIELDS = ControllerSettings.model_fields
# How the settings fill the frozen dataclasses (dataclass field → setting); tests check every field is covered.
SERVER_FIELDS = ("host", "port", "controller_id", "redis_url", "metrics_port", "metrics_host", "max_connection_age_s",
                 "readiness_grace_s", "store_retry_s", "registry_ttl_s", "engine_retention_s")
LOOP_FIELDS = {"recompute_completions": "recompute_completions", "interval_s": "decision_interval_s",
               "ttl_s": "ttl_s", "n_obs_time_constant_s": "n_obs_time_constant_s", "output_window": "output_window",
               "prompt_window": "prompt_window", "step_window": "step_window", "bucket_s": "bucket_s",
               "max_window_s": "max_window_s", "engine_ttl_s": "engine_ttl_s",
               "max_disconnected_engines": "max_disconnected_engines",
               "snapshot_interval_s": "snapshot_interval_s", "snapshot_ttl_s": "snapshot_ttl_s",
               "latency_history_interval_s": "latency_history_interval_s", "latency_history_s": "latency_history_s",
               "shift_detection": "shift_detection", "shift_min_samples": "shift_min_samples"}
POLICY_FIELDS = ("min_samples", "theta_min", "theta_max", "oom_tolerance", "default_delta_s_per_token",
                 "hysteresis_rel", "hysteresis_abs_s_per_token", "cooldown_s", "cold_start_crossover",
                 "memory_guard", "guard_decrease_factor", "guard_increase_fraction")
SECRETS = ("agent_tokens", "operator_tokens")


def section_of(name: str) -> str:
    return FIELDS[name].json_schema_extra["section"]  # type: ignore[index]


def flag_of(name: str) -> str:
    """The flag of a setting ("" for a secret, which has none)."""
    return "--" + name.replace("_", "-") if FIELDS[name].json_schema_extra["flag"] else ""  # type: ignore[index]


def env_of(name: str) -> str:
    """The environment variable of a setting: CP_<NAME>, unless the setting names another."""
    return FIELDS[name].json_schema_extra["env"] or ENV_PREFIX + name.upper()  # type: ignore[index]
