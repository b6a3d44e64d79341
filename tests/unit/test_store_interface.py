"""`RedisStore` implements the `Store` protocol the service layer depends on: every method, with the same
parameters (names, kinds, defaults) and the same sync/async nature."""

from __future__ import annotations

import inspect

import pytest

from controlplane.store import RedisStore, Store

METHODS = sorted(name for name, value in vars(Store).items()
                 if callable(value) and not name.startswith("_"))


def test_the_protocol_lists_what_the_service_layer_calls() -> None:
    assert {"put_decisions", "reserve_epochs", "set_override", "clear_override", "put_pool_contribution",
            "get_pool_contributions", "watch_overrides", "ping"} <= set(METHODS)


@pytest.mark.parametrize("name", METHODS)
def test_redis_store_implements_each_method_with_the_same_signature(name: str) -> None:
    declared, implemented = getattr(Store, name), getattr(RedisStore, name, None)
    assert implemented is not None, f"RedisStore has no {name}"
    want, got = inspect.signature(declared), inspect.signature(implemented)
    assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == \
        [(p.name, p.kind, p.default) for p in want.parameters.values()], f"{name}: {got} != {want}"
    assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), name
    assert inspect.isasyncgenfunction(implemented) or not name.startswith("watch_"), name
