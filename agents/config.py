"""Agent configuration from the engine's environment, validated once at engine start.

The agent is off (the engine behaves exactly as stock vLLM) unless CP_CONTROLLER_ADDRESS is set. Every
variable is described once, in `AGENT_SETTINGS` (name, default, rule, meaning); `load_agent_config` validates
with those rules and `describe_agent_settings` shows the resolved values and where each came from (what
`controlplane config show --agent` prints). This module must stay light: the standard library and
`controlplane.protocol` only (the agent's run-time dependencies are grpcio and protobuf).

  CP_CONTROLLER_ADDRESS   host:port of the controller (required to turn the agent on)
  CP_AGENT_TOKEN          bearer token for AgentService (optional on loopback)
  CP_ENGINE_ID            unique engine id, stable across restarts of the same engine (default: the pod's
                          name, POD_NAME, else HOSTNAME; <hostname>-<pid> when neither is set). A data-parallel
                          rank gets "-dp<rank>" appended, to an explicit id too, so ranks never share one.
                          On Kubernetes set it from the downward API (fieldRef metadata.name).
  CP_POOL_MODEL           pool model name (default: vLLM's served model name, the first --served-model-name,
                          else --model)
  CP_POOL_ACCELERATOR     pool accelerator name (default: the platform's device name)
  CP_DECISION_TTL_S       upper bound on how long a decision outlives the controller (default: its ttl_s)
  CP_TLS_CA               PEM file of the controller's CA (turns TLS on)
  CP_BATCH_INTERVAL_S     telemetry batch period, seconds (default 1.0; also the idle heartbeat)
  CP_BUFFER_EVENTS        events buffered per kind before the oldest are dropped (default 65536)
  CP_AGENT_REPORT         path of a JSON file of the agent's counters (default: none), rewritten atomically
                          every CP_AGENT_REPORT_INTERVAL_S, at shutdown and at interpreter exit
  CP_AGENT_REPORT_INTERVAL_S  seconds between report writes (default 5; ≥ 0.1)
  CP_STEP_TRACE           1: the report also lists every engine step (an audit mode: O(batch) per step)
"""

from __future__ import annotations

import math
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.protocol import (
    ENGINE_ID_PATTERN,
    KV_ROLE_FROM_VLLM,
    KvRole,
    bounded,
    is_valid_engine_id,
    pool_name_problem,
)

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")
_TRUE, _FALSE = ("1", "true"), ("", "0", "false")


class AgentConfigError(ValueError):
    """The agent's environment is invalid; the message names the variable and where its value came from."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's settings (see the module docstring for the variable behind each).

    Attributes:
        controller_address: host:port of the controller.
        engine_id: this engine's id on the controller.
        pool_model / pool_accelerator: the pool this engine belongs to.
        token: bearer token for AgentService ("" for none).
        decision_ttl_s: upper bound on how long a decision outlives the controller, seconds (0: its ttl_s).
        tls_ca: the controller's CA (None: plaintext).
        batch_interval_s: telemetry batch period and idle heartbeat, seconds; also the running-length
            histogram's sampling period.
        buffer_events: telemetry events buffered per kind before the oldest are dropped.
        report_path: the JSON report file (None: no report).
        report_interval_s: seconds between report writes.
        step_trace: the report lists every step (only with a report path).
    """

    controller_address: str
    engine_id: str
    pool_model: str
    pool_accelerator: str
    token: str = ""
    decision_ttl_s: float = 0.0
    tls_ca: Path | None = None
    batch_interval_s: float = 1.0
    buffer_events: int = 65536
    report_path: Path | None = None
    report_interval_s: float = 5.0
    step_trace: bool = False


# ------------------------------------------------------------------------------------------- the rules


def _address(text: str) -> str:
    match = _ADDRESS.match(text)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ValueError("must be host:port with a port in 1..65535")
    return text


def _engine_id(text: str) -> str:
    if not is_valid_engine_id(text):
        raise ValueError(f"must match {ENGINE_ID_PATTERN.pattern}")
    return text


def _pool_name(text: str) -> str:
    problem = pool_name_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


def _number(minimum: float, maximum: float = math.inf) -> Callable[[str], float]:
    bounds = f"≥ {minimum}" if maximum == math.inf else f"in [{minimum}, {maximum}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a finite number {bounds}") from None
        if not (math.isfinite(value) and minimum <= value <= maximum):
            raise ValueError(f"must be a finite number {bounds}")
        return value

    return parse


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) < minimum:
            raise ValueError(f"must be an integer ≥ {minimum}")
        return int(text)

    return parse


def _existing_file(text: str) -> Path:
    if not Path(text).is_file():
        raise ValueError("file not found")
    return Path(text)


def _path_in_existing_dir(text: str) -> Path:
    if not Path(text).parent.is_dir():
        raise ValueError(f"directory not found: {Path(text).parent}")
    return Path(text)


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in _TRUE + _FALSE:
        raise ValueError("must be 0 or 1 (or true / false)")
    return lowered in _TRUE


@dataclass(frozen=True, slots=True)
class AgentSetting:
    """One agent environment variable: the AgentConfig field it fills, its documented default, the rule its
    value must satisfy (as text and as the parser that enforces it) and what it means."""

    env: str
    field: str
    default: str
    rule: str
    doc: str
    parse: Callable[[str], Any]
    secret: bool = False


AGENT_SETTINGS: tuple[AgentSetting, ...] = (
    AgentSetting("CP_CONTROLLER_ADDRESS", "controller_address", "unset: the agent is off (stock vLLM)",
                 "host:port, port in 1..65535", "the controller's gRPC address", _address),
    AgentSetting("CP_AGENT_TOKEN", "token", "none", "any text", "bearer token for AgentService (one of the "
                 "controller's CP_AGENT_TOKENS)", str, secret=True),
    AgentSetting("CP_ENGINE_ID", "engine_id", "POD_NAME, else HOSTNAME, else <hostname>-<pid>; -dp<rank> "
                 "appended under data parallelism", f"matches {ENGINE_ID_PATTERN.pattern}",
                 "this engine's id on the controller, stable across restarts (Kubernetes: the downward API's "
                 "metadata.name)", _engine_id),
    AgentSetting("CP_POOL_MODEL", "pool_model", "vLLM's served model name (first --served-model-name, else "
                 "--model)", "1..256 printable characters without '|'", "the pool's model name", _pool_name),
    AgentSetting("CP_POOL_ACCELERATOR", "pool_accelerator", "the device name vLLM reports",
                 "1..256 printable characters without '|'", "the pool's accelerator name", _pool_name),
    AgentSetting("CP_DECISION_TTL_S", "decision_ttl_s", "0 (the controller's ttl_s)", "finite ≥ 0",
                 "upper bound on how long a decision outlives the controller, s", _number(0.0)),
    AgentSetting("CP_TLS_CA", "tls_ca", "none (plaintext)", "an existing file",
                 "PEM file of the controller's CA (turns TLS on)", _existing_file),
    AgentSetting("CP_BATCH_INTERVAL_S", "batch_interval_s", "1.0", "finite, in [0.01, 60]",
                 "telemetry batch period and idle heartbeat, s (the controller closes a stream silent for 180 s)",
                 _number(0.01, 60.0)),
    AgentSetting("CP_BUFFER_EVENTS", "buffer_events", "65536", "integer ≥ 16",
                 "telemetry events buffered per kind before the oldest are dropped", _count(16)),
    AgentSetting("CP_AGENT_REPORT", "report_path", "none", "a path in an existing directory",
                 "JSON file of the agent's counters, rewritten atomically", _path_in_existing_dir),
    AgentSetting("CP_AGENT_REPORT_INTERVAL_S", "report_interval_s", "5.0", "finite ≥ 0.1",
                 "seconds between report writes", _number(0.1)),
    AgentSetting("CP_STEP_TRACE", "step_trace", "0", "0 or 1 (true / false); only with CP_AGENT_REPORT",
                 "the report also lists every engine step (audit mode, O(batch) per step)", _flag),
)


# ------------------------------------------------------------------------------------------- defaults


def engine_id_default(env: Mapping[str, str]) -> tuple[str, str]:
    """The engine id when CP_ENGINE_ID is unset, and where it came from.

    The pod's name (POD_NAME, else HOSTNAME, which container runtimes set to the pod or container name)
    survives a restart of the engine process, so a restarted engine keeps its id (and its history on the
    controller). Without either variable (a bare host, where several engines may share the hostname) it is
    <hostname>-<pid>.
    """
    for name in ("POD_NAME", "HOSTNAME"):
        value = env.get(name, "").strip()
        if value:
            return value, f"default from {name}"
    return f"{socket.gethostname()}-{os.getpid()}", "default <hostname>-<pid>"


def pool_model_default(served_model_name: str | Sequence[str] | None, model: str) -> str:
    """vLLM's served model name: the first of a list, the model path when none is given (vLLM's own rule,
    so a pool is named as the engine's OpenAI endpoint names the model)."""
    if isinstance(served_model_name, str) and served_model_name:
        return served_model_name
    if isinstance(served_model_name, Sequence) and served_model_name and served_model_name[0]:
        return str(served_model_name[0])
    return model


def engine_data_parallel_rank(*, size: int, index: int, master_port: int = 0) -> int | None:
    """The rank to append to the engine id, or None without data parallelism.

    Args:
        size: vLLM's parallel_config.data_parallel_size as the engine sees it.
        index: parallel_config.data_parallel_index (the original data-parallel rank).
        master_port: parallel_config.data_parallel_master_port (0: not set).
    vLLM runs each rank of a dense model as an independent engine: it resets the size to 1 and the rank to 0,
    and keeps the rank in the index. The master port it picked for the deployment stays set (vLLM takes one
    whenever data parallelism is configured; it is 0 on an engine started without, unless VLLM_DP_MASTER_PORT
    says otherwise), which tells a dense model's rank 0 from a plain engine. A model vLLM keeps in one
    data-parallel group (MoE) keeps its size. So every rank of a data-parallel engine gets its rank.
    """
    return index if size > 1 or index > 0 or master_port > 0 else None


def engine_kv_role(kv_transfer_config: object) -> KvRole:
    """The engine's role in disaggregated prefill/decode from vLLM's `vllm_config.kv_transfer_config`: NONE
    without one or without a KV connector (vLLM's own test, `is_kv_transfer_instance`), else its kv_role
    ("kv_producer", "kv_consumer", "kv_both"; NONE for a spelling this agent does not know)."""
    if kv_transfer_config is None or not getattr(kv_transfer_config, "kv_connector", None):
        return KvRole.NONE
    return KV_ROLE_FROM_VLLM.get(str(getattr(kv_transfer_config, "kv_role", "") or ""), KvRole.NONE)


# ------------------------------------------------------------------------------------------- resolution


@dataclass(frozen=True, slots=True)
class ResolvedAgentSetting:
    """One setting's resolved value (as shown: secrets redacted) and where it came from."""

    setting: AgentSetting
    shown: str
    source: str


def _resolve(env: Mapping[str, str], *, default_model: str, default_accelerator: str,
             data_parallel_rank: int | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Parse every variable (raising AgentConfigError naming the first bad one); returns the AgentConfig
    keyword arguments and each field's source."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in AGENT_SETTINGS:
        text = env.get(setting.env, "").strip()
        if text:
            raw, source = text, "env"
        elif setting.field == "engine_id":
            raw, source = engine_id_default(env)
        elif setting.field == "pool_model":
            raw, source = default_model, "default (served model name)"
        elif setting.field == "pool_accelerator":
            raw, source = default_accelerator, "default (device name)"
        else:
            sources[setting.field] = "default"
            continue
        if setting.field == "engine_id" and data_parallel_rank is not None:
            raw, source = f"{raw}-dp{data_parallel_rank}", f"{source}, -dp<rank> appended"
        try:
            values[setting.field] = setting.parse(raw)
        except ValueError as exc:
            shown = "<redacted>" if setting.secret else bounded(raw)
            raise AgentConfigError(f"{setting.env}={shown} ({source}): {exc}") from None
        sources[setting.field] = source
    values["step_trace"] = values.get("step_trace", False) and values.get("report_path") is not None
    return values, sources


def load_agent_config(env: Mapping[str, str] | None = None, *, default_model: str = "",
                      default_accelerator: str = "", data_parallel_rank: int | None = None) -> AgentConfig | None:
    """The agent's config, or None when CP_CONTROLLER_ADDRESS is unset (agent off).

    Args:
        env: the environment (default: os.environ).
        default_model / default_accelerator: the pool names when CP_POOL_MODEL / CP_POOL_ACCELERATOR are
            unset (the engine's served model name and device name).
        data_parallel_rank: the engine's data-parallel rank when vLLM runs it as one of several; appended to
            the engine id ("-dp<rank>"), explicit or default, so that ranks never share an id.
    Raises:
        AgentConfigError naming the variable, its source and the rule it breaks when a value is malformed.
    """
    env = os.environ if env is None else env
    if not env.get("CP_CONTROLLER_ADDRESS", "").strip():
        return None
    values, _ = _resolve(env, default_model=default_model, default_accelerator=default_accelerator,
                         data_parallel_rank=data_parallel_rank)
    return AgentConfig(**values)


def describe_agent_settings(env: Mapping[str, str], *, default_model: str = "",
                            default_accelerator: str = "") -> tuple[ResolvedAgentSetting, ...]:
    """Every agent setting as `env` resolves it (secrets redacted), for `controlplane config show --agent`.

    Outside an engine the served model and device name are unknown: pass them, or the rows say so.

    Raises:
        AgentConfigError as `load_agent_config` does.
    """
    values, sources = _resolve(env, default_model=default_model or "<served model name>",
                               default_accelerator=default_accelerator or "<device name>",
                               data_parallel_rank=None)
    rows = []
    for setting in AGENT_SETTINGS:
        source = sources[setting.field]
        if setting.field not in values or source == "default":
            shown = setting.default
        elif source == "default <hostname>-<pid>":
            shown = f"{socket.gethostname()}-<engine pid>"  # this process's pid is not the engine's
        elif setting.secret:
            shown = "<redacted>" if values[setting.field] else ""
        else:
            value = values[setting.field]
            shown = "" if value is None else str(value)
        rows.append(ResolvedAgentSetting(setting=setting, shown=shown, source=source))
    return tuple(rows)
