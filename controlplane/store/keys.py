"""Key names of the store: scope and pool keys (pure functions) and the Redis key space under a prefix.

Layout under a prefix P (default "cp"):

    P:decision:<engine_id>            hash   latest decision of an engine (version-guarded)
    P:history                         stream every decision written, capped (MAXLEN ~)
    P:override:<kind>:<scope_key>     hash   an operator override, kind "delta" | "pin", optional expiry
    P:audit                           stream every override set or clear, capped (MAXLEN ~)
    P:overrides                       pub/sub channel: change notices for controller replicas
    P:engine:<engine_id>              hash   registry entry, expires unless refreshed by heartbeats
    P:calibration:<pool_key>          hash   cost profile of a pool

On Redis Cluster use a hash-tagged prefix such as "{cp}" so that every key lands in one slot (decision
writes touch a hash and the history stream in one script; override writes touch a hash, the audit stream
and the channel in one transaction).

No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.api.v1 import common_pb2, operator_pb2

FLEET_SCOPE_KEY = "fleet"
POOL_KEY_SEPARATOR = "|"

_KIND_NAMES = {
    operator_pb2.OVERRIDE_KIND_DELTA: "delta",
    operator_pb2.OVERRIDE_KIND_PIN: "pin",
}


def pool_key(pool: common_pb2.Pool) -> str:
    """The key of a pool: "<model>|<accelerator>".

    Raises:
        ValueError: when the model or the accelerator is empty, or the model contains "|" (the key
            would be ambiguous).
    """
    if not pool.model or not pool.accelerator:
        raise ValueError(
            f"a pool needs both a model and an accelerator, got model={pool.model!r} "
            f"accelerator={pool.accelerator!r}"
        )
    if POOL_KEY_SEPARATOR in pool.model:
        raise ValueError(f"a pool's model must not contain {POOL_KEY_SEPARATOR!r}: {pool.model!r}")
    return f"{pool.model}{POOL_KEY_SEPARATOR}{pool.accelerator}"


def scope_key(scope: operator_pb2.Scope) -> str:
    """The key of an override scope: "fleet", "pool:<model>|<accelerator>" or "engine:<engine_id>".

    Raises:
        ValueError: for SCOPE_KIND_UNSPECIFIED (or an unknown kind), a pool scope without a complete
            pool, or an engine scope without an engine_id.
    """
    if scope.kind == operator_pb2.SCOPE_KIND_FLEET:
        return FLEET_SCOPE_KEY
    if scope.kind == operator_pb2.SCOPE_KIND_POOL:
        if not scope.HasField("pool"):
            raise ValueError("a SCOPE_KIND_POOL scope needs a pool (model and accelerator)")
        return f"pool:{pool_key(scope.pool)}"
    if scope.kind == operator_pb2.SCOPE_KIND_ENGINE:
        if not scope.engine_id:
            raise ValueError("a SCOPE_KIND_ENGINE scope needs an engine_id")
        return f"engine:{scope.engine_id}"
    try:
        kind_name = operator_pb2.ScopeKind.Name(scope.kind)
    except ValueError:
        kind_name = str(scope.kind)
    raise ValueError(f"scope kind must be SCOPE_KIND_FLEET, _POOL or _ENGINE, got {kind_name}")


def override_kind_name(kind: operator_pb2.OverrideKind) -> str:
    """"delta" or "pin".

    Raises:
        ValueError: for OVERRIDE_KIND_UNSPECIFIED or an unknown kind.
    """
    try:
        return _KIND_NAMES[kind]
    except KeyError:
        raise ValueError(f"override kind must be OVERRIDE_KIND_DELTA or OVERRIDE_KIND_PIN, got {kind}") from None


def _escape_glob(text: str) -> str:
    """`text` with the glob characters of Redis MATCH patterns escaped."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Redis key names under one prefix (see the module docstring for the layout)."""

    prefix: str = "cp"

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("the key prefix must not be empty")

    def decision(self, engine_id: str) -> str:
        return f"{self.prefix}:decision:{engine_id}"

    @property
    def decision_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:decision:*"

    @property
    def history(self) -> str:
        return f"{self.prefix}:history"

    def override(self, kind_name: str, scope: str) -> str:
        return f"{self.prefix}:override:{kind_name}:{scope}"

    @property
    def override_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:override:*"

    @property
    def audit(self) -> str:
        return f"{self.prefix}:audit"

    @property
    def overrides_channel(self) -> str:
        return f"{self.prefix}:overrides"

    def engine(self, engine_id: str) -> str:
        return f"{self.prefix}:engine:{engine_id}"

    @property
    def engine_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:engine:*"

    def calibration(self, pool: str) -> str:
        return f"{self.prefix}:calibration:{pool}"

    @property
    def calibration_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:calibration:*"

    def suffix(self, key: str, *, kind: str) -> str:
        """The part of `key` after "<prefix>:<kind>:" (an engine id or a pool key)."""
        head = f"{self.prefix}:{kind}:"
        if not key.startswith(head):
            raise ValueError(f"key {key!r} is not a {kind} key under prefix {self.prefix!r}")
        return key[len(head):]
