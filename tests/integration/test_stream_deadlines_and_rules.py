"""Trust no input, round two: deadlines on every agent stream, a takeover rule no stream can game, and operator
answers that say exactly what happened. A real controller over real gRPC on loopback, a real redis-server.

- a stream that sends no Hello is closed at the Hello deadline (DEADLINE_EXCEEDED, counted), and one that goes
  silent after its Hello at the idle deadline;
- a Hello whose instance claims a start in the controller's future is refused, and a stream without an
  instance id never displaces a live stream;
- a KV capacity of 0 and a block size of 0 or 2^32 − 1 are refused at Hello;
- SetDelta with an expiry beyond the limit, PinMode with an undefined mode and reasons holding control
  characters are refused before anything is written (nothing stored, nothing audited);
- a store error reply never reaches the operator with the store's script text.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from redis.exceptions import ResponseError

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.service import agent_servicer, controller
from controlplane.store import StoreUnavailable
from testbench.fuzz_messages import LiveAgent
from tests.integration.controller_harness import LIMITS, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
POOL_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)


def _hello(engine_id: str, *, instance_id: str = "", started_at_s: float = 0.0,
           limits: agent_pb2.EngineLimits = LIMITS) -> agent_pb2.Hello:
    return agent_pb2.Hello(engine_id=engine_id, pool=POOL, vllm_version="0.32.0", agent_version="test", limits=limits,
                           instance_id=instance_id, instance_started_at_s=started_at_s)


def _sample(ctl, name: str, labels: dict[str, str] | None = None) -> float:
    return ctl.app.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def _finished(agent: LiveAgent, timeout_s: float = 10.0) -> grpc.StatusCode | None:
    assert agent._reader is not None
    await asyncio.wait_for(asyncio.shield(agent._reader), timeout_s)
    return agent.code


async def _raw_stream_without_hello(channel: grpc.aio.Channel):
    """A Connect stream that opens and sends nothing."""
    outgoing: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def requests():
        while (payload := await outgoing.get()) is not None:
            yield payload

    call = channel.stream_stream("/controlplane.v1.AgentService/Connect", request_serializer=None,
                                 response_deserializer=None)(requests())
    return call, outgoing


async def _ended_with(call) -> grpc.StatusCode:
    """The status a stream that sends nothing is ended with (the server ends it)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    return info.value.code()


# ---- deadlines ----


async def test_a_stream_that_sends_no_hello_is_closed_at_the_hello_deadline(redis_url: str, monkeypatch) -> None:
    monkeypatch.setattr(agent_servicer, "HELLO_TIMEOUT_S", 0.5)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        calls = [await _raw_stream_without_hello(channel) for _ in range(20)]

        async def waiting() -> float:
            return _sample(ctl, "cp_streams_awaiting_hello")

        started = time.monotonic()
        codes = [await _ended_with(call) for call, _ in calls]
        assert time.monotonic() - started < 5.0
        assert set(codes) == {grpc.StatusCode.DEADLINE_EXCEEDED}
        assert _sample(ctl, "cp_rejections_total", {"cause": "hello_timeout"}) == 20
        assert await waiting() == 0


async def test_one_address_may_hold_only_so_many_streams_waiting_for_their_hello(redis_url: str,
                                                                               monkeypatch) -> None:
    monkeypatch.setattr(agent_servicer, "MAX_AWAITING_HELLO_PER_PEER", 5)
    monkeypatch.setattr(agent_servicer, "HELLO_TIMEOUT_S", 3.0)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        calls = []
        for _ in range(8):
            calls.append(await _raw_stream_without_hello(channel))
            await asyncio.sleep(0.05)
        codes = [await _ended_with(call) for call, _ in calls]
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 3
        assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 5
        assert _sample(ctl, "cp_rejections_total", {"cause": "too_many_awaiting_hello"}) == 3
        # Once they are gone, the address may open streams again.
        agent = await LiveAgent(channel, _hello("engine-after")).open()
        assert (await agent.decision()).version > 0
        await agent.close()


async def test_a_stream_silent_after_its_hello_is_closed_at_the_idle_deadline(redis_url: str, monkeypatch) -> None:
    monkeypatch.setattr(controller, "STREAM_IDLE_TIMEOUT_S", 1.0)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        silent = await LiveAgent(channel, _hello("engine-silent"), auto_ack=False).open()
        talking = await LiveAgent(channel, _hello("engine-talking")).open()
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline and silent.code is None:
            await talking.send(agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(seq=1)))
            await asyncio.sleep(0.2)
        assert await _finished(silent) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no message for" in silent.details
        assert talking.code is None  # the engine that kept sending keeps its stream
        assert _sample(ctl, "cp_rejections_total", {"cause": "idle_timeout"}) == 1
        await talking.close()


# ---- takeover ----


async def test_a_start_time_from_the_future_is_refused(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        holder = await LiveAgent(channel, _hello("engine-t", instance_id="real", started_at_s=time.time() - 10)).open()
        await holder.decision()
        squatter = await LiveAgent(channel, _hello("engine-t", instance_id="squat",
                                                   started_at_s=time.time() + 3600)).open()
        assert await _finished(squatter) == grpc.StatusCode.INVALID_ARGUMENT
        assert "future" in squatter.details
        assert holder.code is None
        again = await LiveAgent(channel, _hello("engine-t", instance_id="real", started_at_s=time.time() - 10)).open()
        assert (await again.decision()).version > 0  # the real agent's reconnect still takes its id
        await again.close()


async def test_a_stream_without_an_instance_id_never_displaces_a_live_one(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        holder = await LiveAgent(channel, _hello("engine-u", instance_id="real", started_at_s=time.time())).open()
        await holder.decision()
        anonymous = await LiveAgent(channel, _hello("engine-u")).open()
        assert await _finished(anonymous) == grpc.StatusCode.ALREADY_EXISTS
        assert "without an instance id" in anonymous.details
        await asyncio.sleep(0.3)
        assert holder.code is None
        await holder.close()


# ---- limits at Hello ----


@pytest.mark.parametrize(("field", "value"), [("kv_capacity_tokens", 0), ("block_size_tokens", 0),
                                              ("block_size_tokens", (1 << 32) - 1)])
async def test_limits_no_engine_can_have_are_refused_at_hello(redis_url: str, field: str, value: int) -> None:
    limits = agent_pb2.EngineLimits()
    limits.CopyFrom(LIMITS)
    setattr(limits, field, value)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await LiveAgent(channel, _hello("engine-l", limits=limits)).open()
        assert await _finished(agent) == grpc.StatusCode.INVALID_ARGUMENT
        assert f"hello.limits.{field}" in agent.details
        assert _sample(ctl, "cp_rejections_total", {"cause": "bad_hello"}) == 1


# ---- operator answers ----


async def _nothing_stored(stub) -> None:
    assert list((await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides) == []
    assert list((await stub.ListAudit(operator_pb2.ListAuditRequest(limit=10))).entries) == []


@pytest.mark.parametrize("expires_in_s", [1e16, 1e12, float("inf"), -1.0])
async def test_a_delta_with_an_expiry_out_of_range_is_refused_and_not_stored(redis_url: str,
                                                                              expires_in_s: float) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=POOL_SCOPE, delta_s_per_token=1e-5,
                                                             expires_in_s=expires_in_s, reason="test"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "expires_in_s" in info.value.details() and "script" not in info.value.details()
        await _nothing_stored(stub)


@pytest.mark.parametrize("mode", [7, -5, (1 << 31) - 1])
async def test_a_pin_with_an_undefined_mode_is_refused_and_not_stored(redis_url: str, mode: int) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.PinMode(operator_pb2.PinModeRequest(scope=POOL_SCOPE, mode=mode, reason="test"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "mode" in info.value.details()
        await _nothing_stored(stub)


@pytest.mark.parametrize("reason", ["line\nforged row", "nul\x00", "\x1b[31mred\x1b[0m", "tab\there"])
async def test_reasons_with_control_characters_are_refused(redis_url: str, reason: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=POOL_SCOPE, delta_s_per_token=1e-5, reason=reason))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "control character" in info.value.details()
        await _nothing_stored(stub)
        accepted = await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=POOL_SCOPE, delta_s_per_token=1e-5,
                                                                    reason="TTFT SLO — ünïcode is fine"))
        assert accepted.reason == "TTFT SLO — ünïcode is fine"


def test_a_store_error_reply_is_reported_without_the_stores_text() -> None:
    reply = ResponseError("Error running script (call to f_0123): @user_script:7: ERR value is out of range")
    message = str(StoreUnavailable("set_override", reply))
    assert "set_override" in message and "ResponseError" in message
    assert "user_script" not in message and "f_0123" not in message
    long = str(StoreUnavailable("ping", OSError("line one\nline two " + "x" * 500)))
    assert "line two" not in long and len(long) < 260
