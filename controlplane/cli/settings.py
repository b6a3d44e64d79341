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
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import annotated_types
import yaml
from pydantic import SecretStr, ValidationError
from pydantic_settings import EnvSettingsSource

from controlplane.cli.settings_schema import (
    CONFIG_ENV,
    FIELDS,
    LOOP_FIELDS,
    POLICY_FIELDS,
    SECRETS,
    SECTIONS,
    SERVER_FIELDS,
    ControllerSettings,
    SettingsError,
    default_data_dir,
    env_of,
    flag_of,
    parse_scopes,
    parse_tokens,
    section_of,
)
from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.service.config import ControllerConfig, SecurityConfig

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
