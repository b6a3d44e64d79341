"""The controller's settings: one pydantic-settings model, read from flags, CP_* environment variables and a
YAML or TOML file, validated together, and built into the frozen dataclasses the service runs on.

Precedence: flag > environment > file > default. Every setting `name` has the flag `--name` (underscores
as dashes; booleans also `--no-name`), the variable `CP_NAME` and the key `name` in its section of the file
(`--config FILE` or `CP_CONFIG`); the tokens are secrets and have no flag (a command line is visible to every
user of the host). A file looks like

    server:   {host: 0.0.0.0, port: 50151}
    policy:   {theta_max: 0.7, oom_tolerance: 0.005}

(or TOML `[policy]` tables). Errors name each bad setting, its value and where that value came from.

This module is read at entry points only (`controlplane serve`, `demo`, `config show`; their flags come from
`controlplane.cli.settings_flags`): the service, the decision loop and the core receive `ControllerConfig`,
`DecisionLoopConfig` and `PolicyConfig` (frozen dataclasses, which validate themselves again) and never
import pydantic. The agent's settings (environment only, no pydantic in the engine) are `agents.config`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import annotated_types
import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.service.config import ControllerConfig, SecurityConfig
from controlplane.store.urls import parse_store_url

ENV_PREFIX = "CP_"
CONFIG_ENV = "CP_CONFIG"
SECTIONS = ("server", "store", "security", "loop", "policy")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
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
                                          doc="before min_samples completions, run EB when rule (8) picks it at "
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


# ----------------------------------------------------------------------------------------------- sources


class _MappingEnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of os.environ (entry points pass
    os.environ; tests pass a dict)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(ControllerSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # Case-insensitive, empty values ignored (the model's config: an empty CP_X is no CP_X).
        return {key.lower(): value for key, value in self._mapping.items() if value != ""}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        # One variable per setting, `env_of` (no alias or unprefixed fallbacks).
        return self.env_vars.get(env_of(field_name).lower()), field_name, False


def read_settings_file(path: Path) -> dict[str, tuple[Any, str]]:
    """{setting: (value, source)} from a YAML (.yaml/.yml) or TOML (.toml) file of sections.

    Raises:
        SettingsError naming the file and the problem: unreadable, unparsable, not a mapping of sections,
        an unknown section or setting, or a setting under the wrong section.
    """
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise SettingsError(f"config file {path}: expected a .yaml, .yml or .toml file")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"config file {path}: not valid {suffix[1:].upper()}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: expected a mapping of sections ({', '.join(SECTIONS)})")
    found: dict[str, tuple[Any, str]] = {}
    for section, body in data.items():
        if section not in SECTIONS:
            hint = f" ({section!r} is a setting of section {section_of(section)!r})" if section in FIELDS else ""
            raise SettingsError(f"config file {path}: unknown section {section!r}{hint}; sections are "
                                f"{', '.join(SECTIONS)}")
        if not isinstance(body, dict):
            raise SettingsError(f"config file {path}: section {section!r} must be a mapping of settings")
        for key, value in body.items():
            if key not in FIELDS:
                raise SettingsError(f"config file {path}: unknown setting {section}.{key}")
            if section_of(key) != section:
                raise SettingsError(f"config file {path}: {key} belongs to section {section_of(key)!r}, "
                                    f"not {section!r}")
            found[key] = (value, f"file {path} ({section}.{key})")
    return found


# ----------------------------------------------------------------------------------------------- resolution


@dataclasses.dataclass(frozen=True, slots=True)
class SettingView:
    """One setting as `config show` prints it: the resolved value (secrets redacted), its source, its
    flag and variable, its default, its rule and its meaning."""

    section: str
    name: str
    value: Any
    source: str
    flag: str
    env: str
    default: Any
    rule: str
    doc: str


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedSettings:
    """The validated settings and, per setting given anywhere, where its value came from."""

    settings: ControllerSettings
    sources: Mapping[str, str]
    config_file: Path | None = None

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def controller_config(self) -> ControllerConfig:
        """The frozen config the service runs on.

        Raises:
            SettingsError when the dataclasses' own checks refuse a combination (naming the settings
            mentioned and their sources).
        """
        s = self.settings
        try:
            return ControllerConfig(
                **{name: getattr(s, name) for name in SERVER_FIELDS},
                data_dir=None if s.redis_url else s.data_dir,
                loop=DecisionLoopConfig(**{field: getattr(s, name) for field, name in LOOP_FIELDS.items()}),
                policy=PolicyConfig(**{name: getattr(s, name) for name in POLICY_FIELDS}),
                security=SecurityConfig(
                    tls_cert=s.tls_cert, tls_key=s.tls_key, tls_client_ca=s.tls_client_ca, insecure=s.insecure,
                    agent_tokens=parse_tokens(s.agent_tokens.get_secret_value(), source=env_of("agent_tokens")),
                    operator_tokens=parse_tokens(s.operator_tokens.get_secret_value(),
                                                 source=env_of("operator_tokens")),
                    agent_scopes=parse_scopes(s.agent_scopes)),
            )
        except ValueError as exc:
            named = [name for name in FIELDS if name in str(exc)]
            where = ", ".join(f"{name} from {self.source(name)}" for name in named)
            raise SettingsError(f"invalid settings: {exc}" + (f" ({where})" if where else "")) from None

    def describe(self) -> tuple[SettingView, ...]:
        """Every setting, in section order, as `config show` prints it."""
        views = []
        for section in SECTIONS:
            for name, field in FIELDS.items():
                if section_of(name) != section:
                    continue
                views.append(SettingView(
                    section=section, name=name, value=shown_value(name, getattr(self.settings, name)),
                    source=self.source(name), flag=flag_of(name), env=env_of(name), default=default_text(name),
                    rule=rule_text(name), doc=field.description or ""))
        return tuple(views)


class FlagDefault:
    """The default of a setting's flag: not a value (falsy, and left out by `flags_from_args`) but the text
    --help shows for %(default)s, so a command's `set_defaults(name=value)` (a real value, which then wins
    over environment and file like a flag) shows in its help."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__


def resolve_controller_settings(*, env: Mapping[str, str], flags: Mapping[str, Any] | None = None,
                                config_file: Path | None = None) -> ResolvedSettings:
    """Gather the settings (flag > environment > file > default), validate them together.

    Args:
        env: the environment (CP_* variables; CP_CONFIG names the file when `config_file` is None;
            XDG_DATA_HOME places the default data directory).
        flags: setting name → value of the flags given (None values are ignored: flag not given).
        config_file: the settings file (`--config`).
    Raises:
        SettingsError naming every bad setting, its value (secrets redacted) and its source.
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config_file if config_file is not None else (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    if path is not None:
        for name, (value, source) in read_settings_file(path).items():
            values[name], sources[name] = value, source
    for name, value in _MappingEnvSource(env)().items():
        values[name], sources[name] = value, f"env {env_of(name)}"
    for name, value in (flags or {}).items():
        if value is None or isinstance(value, FlagDefault):
            continue
        if name not in FIELDS:
            raise SettingsError(f"unknown setting {name!r}")
        values[name], sources[name] = value, f"flag {flag_of(name) or name}"
    if values.get("data_dir") in (None, "") and not values.get("redis_url"):
        values["data_dir"] = default_data_dir(env)
        sources["data_dir"] = "default ($XDG_DATA_HOME or ~/.local/share)"
    try:
        settings = ControllerSettings(**values)
    except ValidationError as exc:
        raise SettingsError(_describe_errors(exc, values, sources)) from None
    resolved = ResolvedSettings(settings=settings, sources=sources, config_file=path)
    resolved.controller_config()  # the dataclasses' own checks, reported with sources
    return resolved


def _describe_errors(exc: ValidationError, values: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["loc"]:
            name = str(error["loc"][0])
            value = values.get(name)
            if name.endswith("port") and str(value).startswith(("tcp://", "udp://")):
                message += " (a Kubernetes service link variable? set enableServiceLinks: false in the pod spec)"
            parts.append(f"{name} = {_echo(name, value)} from {sources.get(name, 'default')}: {message}")
            continue
        cause = (error.get("ctx") or {}).get("error")
        names = getattr(cause, "names", ())
        where = ", ".join(f"{name} from {sources.get(name, 'default')}" for name in names)
        parts.append(f"{message} ({where})" if where else message)
    return "invalid settings: " + "; ".join(parts)


def _echo(name: str, value: Any) -> str:
    text = str(shown_value(name, value))
    return repr(text if len(text) <= 64 else text[:64] + "…")


# ----------------------------------------------------------------------------------------------- display


def redact_url(url: str) -> str:
    """A store URL with its password and sentinel_password replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hosts = netloc.rpartition("@")
        user, sep, _password = userinfo.partition(":")
        netloc = f"{user}{':***' if sep else ''}@{hosts}"
    query = urlencode([(k, "***" if k == "sentinel_password" else v) for k, v in parse_qsl(parts.query)],
                      safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def shown_value(name: str, value: Any) -> Any:
    """A setting's value safe to print: secrets as "<redacted: N identities>", URLs without passwords, paths
    as text."""
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if name in SECRETS:
        count = len([item for item in str(value or "").split(",") if item.strip()])
        return f"<redacted: {count} identities>" if count else ""
    if name == "redis_url" and value:
        return redact_url(str(value))
    if isinstance(value, Path):
        return str(value)
    return value


def default_text(name: str) -> Any:
    field = FIELDS[name]
    if name == "controller_id":
        return "controller-<pid>"
    if name == "data_dir":
        return "$XDG_DATA_HOME/vllm-controlplane"
    return shown_value(name, field.default)


def rule_text(name: str) -> str:
    """The validation rule of a setting, in words: its range, its choices, and the rule over several
    settings it takes part in."""
    field = FIELDS[name]
    low = high = ""
    words = []
    for item in field.metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"[{item.ge:g}"
        elif isinstance(item, annotated_types.Gt):
            low = f"({item.gt:g}"
        elif isinstance(item, annotated_types.Le):
            high = f"{item.le:g}]"
        elif isinstance(item, annotated_types.Lt):
            high = f"{item.lt:g})"
        elif isinstance(item, annotated_types.MinLen) and item.min_length == 1:
            words.append("non-empty")
    if low and high:
        words.insert(0, f"in {low}, {high}")
    elif low:
        words.insert(0, ("≥ " if low[0] == "[" else "> ") + low[1:])
    elif high:
        words.insert(0, ("≤ " if high[-1] == "]" else "< ") + high[:-1])
    if get_args(field.annotation) and all(isinstance(a, str) for a in get_args(field.annotation)):
        words.append("one of " + ", ".join(get_args(field.annotation)))
    if name in ("tls_cert", "tls_key", "tls_client_ca"):
        words.append("an existing file")
    if name in SECRETS:
        words.append("identity:token, tokens ≥ 16 characters")
    if name == "redis_url":
        words.append("a store URL")
    if name == "agent_scopes":
        words.append("identity=glob[;glob…],…")
    if field.annotation is bool:
        words.append("true or false (1 or 0)")
    extra = FIELDS[name].json_schema_extra["rule"]  # type: ignore[index]
    if extra:
        words.append(str(extra))
    return "; ".join(words)
