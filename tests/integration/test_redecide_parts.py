"""A fleet-wide change (an override, a calibration) re-decides every connected engine in parts of REDECIDE_PART,
the event loop's other work running between the parts (`Controller._redecide_all`): the operator's call returns
once every engine carries the change, a cancelled call still re-decides them all, and two changes in flight
leave every engine on the overrides finally held. A real Controller on a real redis-server, in this process."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.ingest import validate_batch
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer, TracingSettings, create_tracer_provider
from controlplane.service import controller as controller_module
from controlplane.service.controller import Controller
from controlplane.store import create_store
from testbench.messages import geometric_batch, validated_hello
from tests.integration.controller_harness import make_config
from tests.integration.store_helpers import FLEET, delta_override

ENGINES = 96
PART = 8
POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")


@pytest.fixture
async def fleet(redis_url: str, monkeypatch: pytest.MonkeyPatch):
    """A controller holding ENGINES connected engines of one pool, each with one batch taken in."""
    monkeypatch.setattr(controller_module, "REDECIDE_PART", PART)
    store = create_store(redis_url, prefix="parts")
    controller = Controller(make_config(redis_url), store=store,
                            tracer=DecisionTracer(create_tracer_provider(TracingSettings())),
                            metrics=ControllerMetrics())
    rng = np.random.default_rng(2)
    ids = []
    for i in range(ENGINES):
        hello = validated_hello(f"e{i:03d}", POOL)
        session = await controller.open_stream(hello, identity="anonymous")
        controller.ingest(session, validate_batch(geometric_batch(1, rng, num=20), hello.limits))
        ids.append(hello.engine_id)
    yield controller, ids
    await store.close()


def _deltas(controller: Controller, ids: list[str]) -> set[float]:
    return {controller.fleet.engine(e).loop.current.delta_s_per_token for e in ids}


async def test_a_fleet_change_reaches_every_engine_before_the_call_returns_with_the_loop_running_between_parts(
        fleet) -> None:
    controller, ids = fleet
    versions = {e: controller.fleet.engine(e).loop.current.version for e in ids}
    wakeups = 0
    stop = asyncio.Event()

    async def other_work() -> None:  # what the loop also runs: it must get turns while the change spreads
        nonlocal wakeups
        while not stop.is_set():
            await asyncio.sleep(0)
            wakeups += 1

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    wakeups = 0
    await controller.set_override(delta_override(FLEET, 2e-5), actor="test")
    stop.set()
    await other
    assert _deltas(controller, ids) == {2e-5}
    assert all(controller.fleet.engine(e).loop.current.version > versions[e] for e in ids)
    # One turn of the other task at least between each two parts (one pass would give it none).
    assert wakeups >= ENGINES // PART - 1, wakeups


async def test_a_cancelled_operator_call_still_re_decides_every_engine(fleet) -> None:
    controller, ids = fleet
    call = asyncio.create_task(controller.set_override(delta_override(FLEET, 3e-5), actor="test"))
    for _ in range(1000):  # until the first part is decided, the rest not yet
        await asyncio.sleep(0)
        if 3e-5 in _deltas(controller, ids):
            break
    assert 0.0 in _deltas(controller, ids)
    call.cancel()  # the operator's deadline: the override is stored and held, its spread goes on
    with pytest.raises(asyncio.CancelledError):
        await call
    for _ in range(200):
        if _deltas(controller, ids) == {3e-5}:
            break
        await asyncio.sleep(0.01)
    assert _deltas(controller, ids) == {3e-5}


async def test_two_changes_in_flight_leave_every_engine_on_the_override_finally_held(fleet) -> None:
    controller, ids = fleet
    await asyncio.gather(controller.set_override(delta_override(FLEET, 1e-5), actor="a"),
                         controller.set_override(delta_override(FLEET, 4e-5), actor="b"))
    [held] = [r.delta_s_per_token for r in controller.overrides() if r.kind == operator_pb2.OVERRIDE_KIND_DELTA]
    assert _deltas(controller, ids) == {held}
