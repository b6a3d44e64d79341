"""Whether an override's scope covers an engine the fleet knows (`controlplane.service.scopes`): the fleet always
does, a pool or engine only when an engine reported it; the warning names the known pools, at most ten."""

from __future__ import annotations

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.service.scopes import MAX_POOLS_NAMED, known_pools, unknown_scope, unknown_scope_warning


def engine(engine_id: str, accelerator: str, *, model: str = "m") -> operator_pb2.EngineInfo:
    return operator_pb2.EngineInfo(engine_id=engine_id, pool=common_pb2.Pool(model=model, accelerator=accelerator))


def pool_scope(accelerator: str, *, model: str = "m") -> operator_pb2.Scope:
    return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL,
                              pool=common_pb2.Pool(model=model, accelerator=accelerator))


ENGINES = [engine("e1", "gpu-b"), engine("e2", "gpu-a"), engine("e3", "gpu-a")]


def test_known_scopes_and_the_fleet_give_no_warning() -> None:
    for scope in (pool_scope("gpu-a"), pool_scope("gpu-b"),
                  operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="e3"),
                  operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)):
        assert unknown_scope(scope, ENGINES) is None and unknown_scope_warning(scope, ENGINES) is None
    assert unknown_scope(operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), []) is None


def test_an_unknown_pool_or_engine_names_the_known_pools() -> None:
    assert known_pools(ENGINES) == ["m|gpu-a", "m|gpu-b"]
    assert unknown_scope(pool_scope("GPU-A"), ENGINES) == (
        "pool 'm|GPU-A' has no engine the controller knows (connected or remembered; known pools: 'm|gpu-a', "
        "'m|gpu-b')")
    assert unknown_scope(pool_scope("gpu-a", model="other"), ENGINES).startswith("pool 'other|gpu-a' has no engine")
    scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="e4")
    assert unknown_scope_warning(scope, ENGINES) == (
        "engine 'e4' is not an engine the controller knows (connected or remembered; known pools: 'm|gpu-a', "
        "'m|gpu-b'): the override is kept and applies only if such an engine connects")
    assert unknown_scope(scope, []).endswith("(connected or remembered; known pools: none)")


def test_at_most_ten_pools_are_named() -> None:
    many = [engine(f"e{i}", f"gpu-{i:02d}") for i in range(MAX_POOLS_NAMED + 3)]
    text = unknown_scope(pool_scope("gpu-xx"), many)
    assert text.split("known pools: ")[1].count("'m|gpu-") == MAX_POOLS_NAMED
    assert text.endswith("'m|gpu-09' and 3 more)")
