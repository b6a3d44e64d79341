"""Agent configuration from the engine's environment, validated once at engine start.

The agent is off (the engine behaves exactly as stock vLLM) unless CP_CONTROLLER_ADDRESS is set.

  CP_CONTROLLER_ADDRESS   host:port of the controller (required to turn the agent on)
  CP_AGENT_TOKEN          bearer token for AgentService (optional on loopback)
  CP_ENGINE_ID            unique engine id (default: <hostname>-<pid>)
  CP_POOL_MODEL           pool model name (default: the served model)
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

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")
_ENGINE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class AgentConfigError(ValueError):
    """The agent's environment is invalid; the message names the variable."""


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


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float) -> float:
    text = env.get(name, "")
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise AgentConfigError(f"{name} must be a number, got {text!r}") from None
    if not value >= minimum or value != value or value == float("inf"):
        raise AgentConfigError(f"{name} must be a finite number ≥ {minimum}, got {text!r}")
    return value


def load_agent_config(env: Mapping[str, str] | None = None, *, default_model: str = "",
                      default_accelerator: str = "") -> AgentConfig | None:
    """The agent's config, or None when CP_CONTROLLER_ADDRESS is unset (agent off).

    Raises:
        AgentConfigError naming the variable when a value is malformed.
    """
    env = os.environ if env is None else env
    address = env.get("CP_CONTROLLER_ADDRESS", "").strip()
    if not address:
        return None
    if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise AgentConfigError(f"CP_CONTROLLER_ADDRESS must be host:port, got {address!r}")
    engine_id = env.get("CP_ENGINE_ID", "") or f"{socket.gethostname()}-{os.getpid()}"
    if not _ENGINE_ID.match(engine_id):
        raise AgentConfigError(f"CP_ENGINE_ID must match {_ENGINE_ID.pattern}, got {engine_id!r}")
    model = env.get("CP_POOL_MODEL", "") or default_model
    accelerator = env.get("CP_POOL_ACCELERATOR", "") or default_accelerator
    for name, value in (("CP_POOL_MODEL", model), ("CP_POOL_ACCELERATOR", accelerator)):
        if not value or "|" in value:
            raise AgentConfigError(f"{name} must be a non-empty name without '|', got {value!r}")
    tls_ca = Path(env["CP_TLS_CA"]) if env.get("CP_TLS_CA") else None
    if tls_ca is not None and not tls_ca.is_file():
        raise AgentConfigError(f"CP_TLS_CA: file not found: {tls_ca}")
    report_path = Path(env["CP_AGENT_REPORT"]) if env.get("CP_AGENT_REPORT") else None
    if report_path is not None and not report_path.parent.is_dir():
        raise AgentConfigError(f"CP_AGENT_REPORT: directory not found: {report_path.parent}")
    trace_text = env.get("CP_STEP_TRACE", "").strip().lower()
    if trace_text not in ("", "0", "1", "false", "true"):
        raise AgentConfigError(f"CP_STEP_TRACE must be 0 or 1, got {env.get('CP_STEP_TRACE')!r}")
    buffer_text = env.get("CP_BUFFER_EVENTS", "65536")
    if not buffer_text.isdigit() or int(buffer_text) < 16:
        raise AgentConfigError(f"CP_BUFFER_EVENTS must be an integer ≥ 16, got {buffer_text!r}")
    return AgentConfig(
        controller_address=address,
        engine_id=engine_id,
        pool_model=model,
        pool_accelerator=accelerator,
        token=env.get("CP_AGENT_TOKEN", ""),
        decision_ttl_s=_float(env, "CP_DECISION_TTL_S", 0.0, minimum=0.0),
        tls_ca=tls_ca,
        batch_interval_s=_float(env, "CP_BATCH_INTERVAL_S", 1.0, minimum=0.01),
        buffer_events=int(buffer_text),
        report_path=report_path,
        report_interval_s=_float(env, "CP_AGENT_REPORT_INTERVAL_S", 5.0, minimum=0.1),
        step_trace=report_path is not None and trace_text in ("1", "true"),
    )
