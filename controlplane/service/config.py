"""Validated, frozen configuration of one controller process (built at the entry point only)."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.store.urls import parse_store_url

__all__ = ["ControllerConfig", "DecisionLoopConfig", "SecurityConfig"]


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """TLS and token authentication. Tokens map a secret to the caller's identity.

    agent_tokens may call AgentService only; operator_tokens OperatorService only. Empty maps: no auth.
    agent_scopes: per agent identity, the engine-id patterns (shell globs) its streams may hold; an identity
    without an entry may hold any engine id (but never one another identity holds).
    """

    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    agent_tokens: dict[str, str] = field(default_factory=dict)
    operator_tokens: dict[str, str] = field(default_factory=dict)
    agent_scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    insecure: bool = False

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("a client CA (mutual TLS) needs a server certificate and key")
        for path in (self.tls_cert, self.tls_key, self.tls_client_ca):
            if path is not None and not path.is_file():
                raise ValueError(f"TLS file not found: {path}")
        overlap = set(self.agent_tokens) & set(self.operator_tokens)
        if overlap:
            raise ValueError("a token cannot be both an agent and an operator token")

    @property
    def authenticated(self) -> bool:
        return bool(self.agent_tokens or self.operator_tokens)


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Everything one controller process needs; validated on construction."""

    host: str = "127.0.0.1"
    port: int = 50151
    controller_id: str = "controller-0"
    redis_url: str = ""
    data_dir: Path | None = None
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Streams older than this are ended with GOAWAY (agents reconnect, possibly to another replica, which
    # rebalances streams after a scale-up); 0 keeps connections forever.
    max_connection_age_s: float = 0.0
    readiness_grace_s: float = 15.0
    store_retry_s: float = 1.0
    registry_ttl_s: float = 30.0
    # An engine's decision and epoch keys in Redis expire this long after its last decision write (0: never);
    # epochs are then floored at the server's clock so versions keep increasing (`RedisStore`).
    engine_retention_s: float = 7 * 24 * 3600.0
    loop: DecisionLoopConfig = field(default_factory=DecisionLoopConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.loop.output_window < self.policy.min_samples:
            raise ValueError(f"the output window ({self.loop.output_window} completions) must hold at least "
                             f"min_samples ({self.policy.min_samples}), or no decision ever leaves cold start")
        if not self.max_connection_age_s >= 0:
            raise ValueError(f"max_connection_age_s must be ≥ 0, got {self.max_connection_age_s}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be in [0, 65535], got {self.metrics_port}")
        if not self.readiness_grace_s >= 0 or not self.store_retry_s > 0 or not self.registry_ttl_s > 0:
            raise ValueError("readiness_grace_s must be ≥ 0, store_retry_s and registry_ttl_s > 0")
        if not (math.isfinite(self.engine_retention_s) and self.engine_retention_s >= 0):
            raise ValueError(f"engine_retention_s must be ≥ 0 (0: never expire), got {self.engine_retention_s}")
        if 0 < self.engine_retention_s < self.loop.engine_ttl_s:
            raise ValueError(f"engine_retention_s ({self.engine_retention_s} s) must be 0 or at least the loop's "
                             f"engine_ttl_s ({self.loop.engine_ttl_s} s): a remembered engine needs its keys")
        if not self.redis_url and self.data_dir is None:
            raise ValueError("give a redis_url or a data_dir for the embedded Redis")
        if self.redis_url:
            parse_store_url(self.redis_url)  # raises ValueError naming the problem
        if not self.is_loopback and not (self.security.authenticated and self.security.tls_cert) \
                and not self.security.insecure:
            raise ValueError(
                f"refusing to listen on non-loopback address {self.host!r} without TLS and token "
                "authentication; pass --insecure to do it anyway"
            )

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
