"""Whether an override's scope names a pool or an engine the fleet knows, and the warning when it does not.

An override on a pool or engine no engine has reported is stored and takes effect if such an engine
connects; a typo in a pool's name (`NVIDIA H200` for `NVIDIA-H200`) would otherwise go unnoticed. The
operator API answers such a change with `unknown_scope_warning`'s text in `OverrideRecord.warnings`;
`ctl --strict` asks ListEngines first and refuses the change on the same test (`unknown_scope`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controlplane.api.v1 import operator_pb2
from controlplane.protocol import bounded, pool_key_of_message

# At most this many known pools are named in a warning; the rest are counted.
MAX_POOLS_NAMED = 10


def known_pools(engines: Iterable[operator_pb2.EngineInfo]) -> list[str]:
    """The pool keys ("model|accelerator", "|role" appended for a role) of `engines`, each once, sorted."""
    return sorted({pool_key_of_message(engine.pool) for engine in engines})


def scope_is_known(scope: operator_pb2.Scope, engines: Sequence[operator_pb2.EngineInfo]) -> bool:
    """Whether `scope` covers at least one of `engines` (connected or remembered); the fleet scope always
    does, even with no engine: it names no pool or engine that could be misspelt."""
    if scope.kind == operator_pb2.SCOPE_KIND_POOL:
        wanted = pool_key_of_message(scope.pool)
        return any(pool_key_of_message(engine.pool) == wanted for engine in engines)
    if scope.kind == operator_pb2.SCOPE_KIND_ENGINE:
        return any(engine.engine_id == scope.engine_id for engine in engines)
    return True


def unknown_scope(scope: operator_pb2.Scope, engines: Sequence[operator_pb2.EngineInfo]) -> str | None:
    """What is unknown about a pool or engine scope that covers none of `engines`, naming the known pools (at
    most MAX_POOLS_NAMED of them); None when the scope is known or is the fleet."""
    if scope_is_known(scope, engines):
        return None
    if scope.kind == operator_pb2.SCOPE_KIND_POOL:
        what = f"pool {bounded(pool_key_of_message(scope.pool))} has no engine"
    else:
        what = f"engine {bounded(scope.engine_id)} is not an engine"
    return (f"{what} the controller knows (connected or remembered; known pools: "
            f"{_pool_list(known_pools(engines))})")


def unknown_scope_warning(scope: operator_pb2.Scope, engines: Sequence[operator_pb2.EngineInfo]) -> str | None:
    """`unknown_scope`'s text and what becomes of the override (the answer to a change that was made); None
    when the scope is known or is the fleet."""
    unknown = unknown_scope(scope, engines)
    return None if unknown is None else f"{unknown}: the override is kept and applies only if such an engine connects"


def _pool_list(pools: list[str]) -> str:
    if not pools:
        return "none"
    named = ", ".join(bounded(pool) for pool in pools[:MAX_POOLS_NAMED])
    return named if len(pools) <= MAX_POOLS_NAMED else f"{named} and {len(pools) - MAX_POOLS_NAMED} more"
