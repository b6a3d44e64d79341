"""Key names of the store: scope and pool keys (pure functions) and the Redis key space under a prefix.

Every key carries a Redis Cluster hash tag (the part in braces decides the slot), chosen so that each
multi-key script touches one slot:

    P:decision:{e:<engine_id>}                   hash    latest decision of an engine (version-guarded)
    P:epoch:{e:<engine_id>}                      string  the engine's epoch counter (INCR; no expiry)
    P:engine:{e:<engine_id>}                     hash    registry entry, expires unless refreshed
    P:rollouts:{r:<controller_id>}               hash    a replica's rollouts in progress and recent verdicts
    P:rolloutsindex:{o}                          zset    the replicas with rollout views, scored by the Unix time
                                                         their views expire (found without a SCAN)
    P:history:{p:<h>}:<pool_key>                 stream  decisions of the pool's engines, capped (MAXLEN ~)
    P:historyindex:{o}                           zset    the history streams' keys, scored by the Unix time
                                                         their expiry was last renewed (found without a SCAN)
    P:poolstat:{p:<h>}:<bucket_start_s>:<pool_key>  hash replica_id → opaque statistics payload, expires
    P:poolsnap:{p:<h>}:<pool_key>                string  the pool's persisted long-window statistics, expires
    P:latency:{p:<h>}:<pool_key>                 stream  the pool's recorded latency quantiles, one entry per
                                                         sampling slot (entry id: the slot's start), capped
    P:override:{o}:<kind>:<scope_key>            hash    an operator override, kind "delta" | "pin"
    P:calibration:{o}:<pool_key>                 hash    cost profile of a pool (an operator record)
    P:audit:{o}                                  stream  every override or calibration change, capped
    P:overrides:{o}                              pub/sub channel of change notices for replicas

- Engine keys are tagged with the engine id: all keys of one engine share a slot (the decision and the
  epoch are read together by `reserve_epoch`), and engines spread over the cluster.
- Pool keys are tagged with `<h>`, 12 hex digits of a BLAKE2b hash of the pool key, because pool names
  may contain any character (braces included); the full pool key follows the tag, so two pools never
  share a key even if their hashes collide (they would only share a slot).
- Operator records (overrides, calibrations, the audit stream, the channel) share the tag {o}: a change
  and its audit entry are written by one script in one slot. They are few and rarely written. The history
  index lives there too: one small key, written once per pool and renewal interval; so does the rollouts index,
  one entry per replica.

The prefix P may not contain braces (the tags above must be the first braces of every key). SCAN patterns
match the tagged forms only, so keys of another layout under the same prefix are ignored.

No I/O here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.protocol import KV_ROLE_FROM_PROTO, POOL_KEY_SEPARATOR, pool_key_of_message

FLEET_SCOPE_KEY = "fleet"

_KIND_NAMES = {
    operator_pb2.OVERRIDE_KIND_DELTA: "delta",
    operator_pb2.OVERRIDE_KIND_PIN: "pin",
    operator_pb2.OVERRIDE_KIND_OBJECTIVE: "objective",
}


def pool_key(pool: common_pb2.Pool) -> str:
    """The key of a pool: "<model>|<accelerator>", "|<role>" appended for a KV-transfer role (`protocol.KvRole`).

    Raises:
        ValueError: when the model or the accelerator is empty, the model contains "|" (the key would be
            ambiguous), or the role is not one the protocol knows.
    """
    if not pool.model or not pool.accelerator:
        raise ValueError(
            f"a pool needs both a model and an accelerator, got model={pool.model!r} "
            f"accelerator={pool.accelerator!r}"
        )
    if POOL_KEY_SEPARATOR in pool.model:
        raise ValueError(f"a pool's model must not contain {POOL_KEY_SEPARATOR!r}: {pool.model!r}")
    if pool.kv_role not in KV_ROLE_FROM_PROTO:
        raise ValueError(f"a pool's kv_role must be unset, producer, consumer or both, got {pool.kv_role}")
    return pool_key_of_message(pool)


def scope_key(scope: operator_pb2.Scope) -> str:
    """The key of an override scope: "fleet", "pool:<pool key>" (`pool_key`) or "engine:<engine_id>".

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
    """"delta", "pin" or "objective".

    Raises:
        ValueError: for OVERRIDE_KIND_UNSPECIFIED or an unknown kind.
    """
    try:
        return _KIND_NAMES[kind]
    except KeyError:
        raise ValueError(f"override kind must be OVERRIDE_KIND_DELTA, _PIN or _OBJECTIVE, got {kind}") from None


def _escape_glob(text: str) -> str:
    """`text` with the glob characters of Redis MATCH patterns escaped."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


OPERATOR_TAG = "{o}"
POOL_HASH_HEX_DIGITS = 12


def pool_hash(pool: str) -> str:
    """The short stable hash of a pool key in its keys' hash tag: 12 hex digits of BLAKE2b."""
    return hashlib.blake2b(pool.encode("utf-8", "surrogatepass"), digest_size=POOL_HASH_HEX_DIGITS // 2).hexdigest()


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Redis key names under one prefix (see the module docstring for the layout)."""

    prefix: str = "cp"

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("the key prefix must not be empty")
        if "{" in self.prefix or "}" in self.prefix:
            raise ValueError(f"the key prefix must not contain braces (keys carry their own hash tags), "
                             f"got {self.prefix!r}")

    # ---- per engine: tag {e:<engine_id>} ----------------------------------------------------------------

    def decision(self, engine_id: str) -> str:
        return f"{self.prefix}:decision:{{e:{engine_id}}}"

    @property
    def decision_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:decision:{{e:*}}"

    def epoch(self, engine_id: str) -> str:
        return f"{self.prefix}:epoch:{{e:{engine_id}}}"

    def engine(self, engine_id: str) -> str:
        return f"{self.prefix}:engine:{{e:{engine_id}}}"

    @property
    def engine_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:engine:{{e:*}}"

    def rollouts(self, controller_id: str) -> str:
        return f"{self.prefix}:rollouts:{{r:{controller_id}}}"

    @property
    def rollouts_index(self) -> str:
        return f"{self.prefix}:rolloutsindex:{{o}}"

    def engine_id_of(self, key: str, *, kind: str) -> str:
        """The engine id in a per-engine key "<prefix>:<kind>:{e:<engine_id>}".

        Raises:
            ValueError: when `key` is not such a key.
        """
        head = f"{self.prefix}:{kind}:{{e:"
        if not (key.startswith(head) and key.endswith("}") and len(key) > len(head) + 1):
            raise ValueError(f"key {key!r} is not a {kind} key of an engine under prefix {self.prefix!r}")
        return key[len(head):-1]

    # ---- per pool: tag {p:<hash>} -----------------------------------------------------------------------

    def pool_tag(self, pool: str) -> str:
        return f"{{p:{pool_hash(pool)}}}"

    def history(self, pool: str) -> str:
        return f"{self.prefix}:history:{self.pool_tag(pool)}:{pool}"

    @property
    def history_index(self) -> str:
        return f"{self.prefix}:historyindex:{{o}}"

    @property
    def history_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:history:{{p:*"

    def pool_contribution(self, pool: str, bucket_start_s: int) -> str:
        return f"{self.prefix}:poolstat:{self.pool_tag(pool)}:{bucket_start_s}:{pool}"

    def pool_snapshot(self, pool: str) -> str:
        return f"{self.prefix}:poolsnap:{self.pool_tag(pool)}:{pool}"

    def latency_history(self, pool: str) -> str:
        return f"{self.prefix}:latency:{self.pool_tag(pool)}:{pool}"

    # ---- operator records: tag {o} ----------------------------------------------------------------------

    def override(self, kind_name: str, scope: str) -> str:
        return f"{self.prefix}:override:{OPERATOR_TAG}:{kind_name}:{scope}"

    @property
    def override_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:override:{OPERATOR_TAG}:*"

    def calibration(self, pool: str) -> str:
        return f"{self.prefix}:calibration:{OPERATOR_TAG}:{pool}"

    @property
    def calibration_pattern(self) -> str:
        return f"{_escape_glob(self.prefix)}:calibration:{OPERATOR_TAG}:*"

    def pool_of_calibration(self, key: str) -> str:
        """The pool key in a calibration key.

        Raises:
            ValueError: when `key` is not a calibration key under this prefix.
        """
        head = f"{self.prefix}:calibration:{OPERATOR_TAG}:"
        if not key.startswith(head):
            raise ValueError(f"key {key!r} is not a calibration key under prefix {self.prefix!r}")
        return key[len(head):]

    @property
    def audit(self) -> str:
        return f"{self.prefix}:audit:{OPERATOR_TAG}"

    @property
    def overrides_channel(self) -> str:
        return f"{self.prefix}:overrides:{OPERATOR_TAG}"
