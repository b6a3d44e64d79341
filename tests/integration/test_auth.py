"""Authentication and engine-id binding against a real controller over real gRPC.

The RPC matrix is enumerated from the service descriptors, so a new RPC is covered without editing this
file: every RPC of AgentService and OperatorService × {no token, a bad token, the other service's token, a
valid token} must answer UNAUTHENTICATED, UNAUTHENTICATED, PERMISSION_DENIED, and OK (or a domain error for
an RPC without a valid request below), and a refused call must change nothing.

Engine-id binding (fencing, `service/sessions.py`): a live engine id is never taken by another agent
identity (PERMISSION_DENIED; the real engine keeps getting decisions); with the same identity a newer agent
instance takes over (the older stream ends ABORTED), an older one is refused (ALREADY_EXISTS) and the same
instance reconnecting replaces its own stream; CP_AGENT_SCOPES patterns confine an identity's engine ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.service.config import DecisionLoopConfig, SecurityConfig
from controlplane.store.keys import KeySpace
from testbench.fuzz_messages import LiveAgent
from tests.integration.controller_harness import LIMITS, RTX_PRO_6000, make_config, running_controller

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
AGENT_A = "agent-a-token-0123456789"
AGENT_B = "agent-b-token-0123456789"
AGENT_SCOPED = "agent-s-token-0123456789"
OPERATOR = "operator-token-0123456789"
SECURITY = SecurityConfig(agent_tokens={AGENT_A: "team-a", AGENT_B: "team-b", AGENT_SCOPED: "team-s"},
                          operator_tokens={OPERATOR: "alice"},
                          agent_scopes={"team-s": ("s-*", "shared-?")})
SERVICES = (agent_pb2.DESCRIPTOR.services_by_name["AgentService"],
            operator_pb2.DESCRIPTOR.services_by_name["OperatorService"])
RPCS = [method for service in SERVICES for method in service.methods]
# A keep-alive every 0.5 s: "keeps getting decisions" is seen within a second or two.
TTL_S = 1.5


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _config(redis_url: str):
    return make_config(redis_url, security=SECURITY,
                       loop=DecisionLoopConfig(recompute_completions=200, interval_s=0.3, ttl_s=TTL_S))


def _hello(engine_id: str, *, instance_id: str = "", started_at_s: float = 0.0) -> agent_pb2.Hello:
    return agent_pb2.Hello(engine_id=engine_id, pool=POOL, vllm_version="0.32.0", agent_version="test", limits=LIMITS,
                           instance_id=instance_id, instance_started_at_s=started_at_s)


async def _connect(channel: grpc.aio.Channel, token: str, engine_id: str, *, instance_id: str = "",
                   started_at_s: float = 0.0) -> LiveAgent:
    """An agent stream with `token`'s identity whose Hello claims `engine_id` (sent)."""
    return await LiveAgent(channel, _hello(engine_id, instance_id=instance_id, started_at_s=started_at_s),
                           metadata=_bearer(token)).open()


def _rejections(ctl, cause: str) -> float:
    return ctl.app.metrics.registry.get_sample_value("cp_rejections_total", {"cause": cause}) or 0.0


# ---- the RPC matrix ----

_AUTH_ENGINE = "auth-engine"
_CALIBRATION = operator_pb2.Calibration()
_CALIBRATION.CopyFrom(RTX_PRO_6000)
_CALIBRATION.pool.CopyFrom(POOL)
# Requests the valid token must get OK for (the five that change state are audited: see the test). An RPC
# not listed here is called with its default request, and a domain error is accepted from it.
VALID_REQUESTS: dict[str, Message] = {
    "Connect": agent_pb2.AgentMessage(hello=_hello("auth-probe")),
    "SetDelta": operator_pb2.SetDeltaRequest(scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET),
                                             delta_s_per_token=1e-5, reason="auth matrix"),
    "PinMode": operator_pb2.PinModeRequest(
        scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=_AUTH_ENGINE),
        mode=operator_pb2.PINNED_MODE_EB, reason="auth matrix"),
    "ClearOverride": operator_pb2.ClearOverrideRequest(
        scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=_AUTH_ENGINE),
        kind=operator_pb2.OVERRIDE_KIND_PIN, reason="auth matrix"),
    "SetObjective": operator_pb2.SetObjectiveRequest(
        scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), reason="auth matrix",
        objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=2.0)),
    "GetDecision": operator_pb2.GetDecisionRequest(engine_id=_AUTH_ENGINE),
    "PutCalibration": operator_pb2.PutCalibrationRequest(calibration=_CALIBRATION),
    "GetCalibration": operator_pb2.GetCalibrationRequest(pool=POOL),
}
AUDITED = ("SetDelta", "PinMode", "SetObjective", "ClearOverride", "PutCalibration")
NOT_A_DOMAIN_ERROR = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                      grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
_OPEN_STREAM = "open"  # a response stream still open after a while (a live WatchDecisions)


async def _call(channel: grpc.aio.Channel, method: MethodDescriptor, request: Message,
                metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode | str:
    """Call `method` generically; the final status code, or _OPEN_STREAM for a response stream that is still
    open (no error) after a second. A request stream is written only once the server has not refused the
    call outright, so a refusal's status is never lost to grpc's client while it writes."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    response_class = message_factory.GetMessageClass(method.output_type)
    kwargs = {"request_serializer": type(request).SerializeToString, "response_deserializer": response_class.FromString}
    if not method.client_streaming and not method.server_streaming:
        try:
            await channel.unary_unary(path, **kwargs)(request, metadata=metadata, timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK
    if method.client_streaming:
        factory = channel.stream_stream if method.server_streaming else channel.stream_unary
        call = factory(path, **kwargs)(metadata=metadata)
        early = asyncio.ensure_future(call.code())
        done, _ = await asyncio.wait({early}, timeout=1.0)
        if done:
            return early.result()
        await call.write(request)
        await call.done_writing()
        if not method.server_streaming:
            return await asyncio.wait_for(early, 10.0)
    else:
        call = channel.unary_stream(path, **kwargs)(request, metadata=metadata)
    return await _drain(call)


async def _drain(call) -> grpc.StatusCode | str:
    async def read_all() -> AsyncIterator[None]:
        async for _ in call:
            pass
    try:
        await asyncio.wait_for(read_all(), 1.5)
    except TimeoutError:
        call.cancel()
        return _OPEN_STREAM
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return await call.code()


async def test_every_rpc_refuses_missing_bad_and_foreign_tokens(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        engine = await _connect(channel, AGENT_A, _AUTH_ENGINE)
        await engine.decision()
        assert len(RPCS) >= 12 and {m.name for m in RPCS} >= set(VALID_REQUESTS)
        table: list[tuple[str, str, object, str]] = []
        for method in RPCS:
            is_agent = method.containing_service.name == "AgentService"
            valid, foreign = (AGENT_A, OPERATOR) if is_agent else (OPERATOR, AGENT_A)
            request = VALID_REQUESTS.get(method.name) or message_factory.GetMessageClass(method.input_type)()
            for label, metadata in (("none", ()), ("bad", _bearer("not-a-token-0123456789")),
                                    ("foreign", _bearer(foreign)), ("valid", _bearer(valid))):
                got = await _call(channel, method, request, metadata)
                if label in ("none", "bad"):
                    ok = got == grpc.StatusCode.UNAUTHENTICATED
                elif label == "foreign":
                    ok = got == grpc.StatusCode.PERMISSION_DENIED
                elif method.name in VALID_REQUESTS:
                    ok = got in (grpc.StatusCode.OK, _OPEN_STREAM)
                else:
                    ok = got not in NOT_A_DOMAIN_ERROR
                table.append((method.name, label, got, "" if ok else "WRONG"))
        print("\n".join(f"{m:16} {label:8} {got}" for m, label, got, _ in table))
        wrong = [row for row in table if row[3]]
        assert not wrong, "\n".join(f"{m:16} {label:8} {got}" for m, label, got, _ in wrong)

        # Refused calls changed nothing: the audit holds exactly the valid calls that change state.
        audit = await channel.unary_unary(
            "/controlplane.v1.OperatorService/ListAudit",
            request_serializer=operator_pb2.ListAuditRequest.SerializeToString,
            response_deserializer=operator_pb2.ListAuditResponse.FromString,
        )(operator_pb2.ListAuditRequest(limit=100), metadata=_bearer(OPERATOR))
        assert len(audit.entries) == len(AUDITED) and {e.actor for e in audit.entries} == {"alice"}
        # Health checking is open (a load balancer has no token).
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        await engine.close()


# ---- engine-id binding ----


async def _keeps_getting_decisions(agent: LiveAgent, *, count: int = 2) -> None:
    """`count` more decisions reach `agent` (keep-alives every TTL_S/3) and its stream is still open."""
    start = len(agent.received)
    for i in range(count):
        await agent.decision(after=start + i, timeout_s=TTL_S * 2)
    assert not agent.ended, (agent.code, agent.details)


async def _listed(channel: grpc.aio.Channel, engine_id: str) -> operator_pb2.EngineInfo:
    response = await channel.unary_unary(
        "/controlplane.v1.OperatorService/ListEngines",
        request_serializer=operator_pb2.ListEnginesRequest.SerializeToString,
        response_deserializer=operator_pb2.ListEnginesResponse.FromString,
    )(operator_pb2.ListEnginesRequest(), metadata=_bearer(OPERATOR))
    [info] = [e for e in response.engines if e.engine_id == engine_id]
    return info


async def test_another_identity_cannot_take_a_live_engine_id(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        real = await _connect(channel, AGENT_A, "engine-1", instance_id="a-1", started_at_s=100.0)
        await real.decision()
        refused_before = _rejections(ctl, "refused")
        # Newer, same instance id, no instance id: another identity never gets the engine id.
        for instance_id, started_at_s in (("b-1", 200.0), ("a-1", 100.0), ("", 0.0)):
            intruder = await _connect(channel, AGENT_B, "engine-1", instance_id=instance_id, started_at_s=started_at_s)
            assert await intruder.finished() == grpc.StatusCode.PERMISSION_DENIED
            assert "another identity" in intruder.details and not intruder.received
        assert _rejections(ctl, "refused") - refused_before == 3
        await _keeps_getting_decisions(real)
        info = await _listed(channel, "engine-1")
        assert info.connected and info.instance_id == "a-1"
        await real.close()


async def test_another_identity_cannot_claim_a_recently_disconnected_engine_id(redis_url: str) -> None:
    """The binding outlives a reconnect: while the controller still holds the engine's state (engine_ttl_s),
    another identity cannot slip into its id between the agent's disconnect and its reconnect (and so lock
    the real agent out with PERMISSION_DENIED)."""
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        real = await _connect(channel, AGENT_A, "engine-r", instance_id="a-1", started_at_s=100.0)
        await real.decision()
        await real.close()
        squatter = await _connect(channel, AGENT_B, "engine-r", instance_id="b-1", started_at_s=200.0)
        try:
            squatted = await squatter.decision(timeout_s=2.0)
        except TimeoutError:
            squatted = None
        again = await _connect(channel, AGENT_A, "engine-r", instance_id="a-2", started_at_s=300.0)
        try:
            back = await again.decision(timeout_s=2.0)
        except TimeoutError:
            back = None
        await squatter.close()
        await again.close()
        assert squatted is None and squatter.code == grpc.StatusCode.PERMISSION_DENIED, (
            f"team-b took engine-r's id while team-a was reconnecting (decision version "
            f"{squatted.version if squatted else None}); team-a's reconnect then got {again.code}: {again.details}")
        assert back is not None, (again.code, again.details)


async def test_newer_instance_takes_over_and_the_older_stream_is_aborted(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        old = await _connect(channel, AGENT_A, "engine-2", instance_id="i-old", started_at_s=100.0)
        last_old = await old.decision()
        new = await _connect(channel, AGENT_A, "engine-2", instance_id="i-new", started_at_s=200.0)
        first_new = await new.decision()
        assert await old.finished() == grpc.StatusCode.ABORTED
        assert "taken over" in old.details and "i-new" in old.details
        assert first_new.version > last_old.version
        await _keeps_getting_decisions(new)
        assert (await _listed(channel, "engine-2")).instance_id == "i-new"
        await new.close()


async def test_older_instance_is_refused_with_already_exists(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        holder = await _connect(channel, AGENT_A, "engine-3", instance_id="i-2", started_at_s=200.0)
        await holder.decision()
        refused_before = _rejections(ctl, "refused")
        older = await _connect(channel, AGENT_A, "engine-3", instance_id="i-1", started_at_s=199.5)
        assert await older.finished() == grpc.StatusCode.ALREADY_EXISTS
        assert "i-2" in older.details and len(older.details) <= 300
        assert _rejections(ctl, "refused") - refused_before == 1
        await _keeps_getting_decisions(holder)
        assert (await _listed(channel, "engine-3")).instance_id == "i-2"
        await holder.close()


async def test_same_instance_reconnecting_replaces_its_own_stream(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        first = await _connect(channel, AGENT_A, "engine-4", instance_id="i-1", started_at_s=100.0)
        before = await first.decision()
        # The same instance (a reconnect after a half-open connection), even with an older start time stamp.
        second = await _connect(channel, AGENT_A, "engine-4", instance_id="i-1", started_at_s=100.0)
        after = await second.decision()
        assert await first.finished() == grpc.StatusCode.ABORTED
        assert after.version > before.version
        await _keeps_getting_decisions(second)
        info = await _listed(channel, "engine-4")
        assert info.connected and info.instance_id == "i-1"
        await second.close()


async def test_agent_scopes_confine_an_identity_to_its_engine_ids(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        refused_before = _rejections(ctl, "refused")
        for engine_id in ("x-1", "s", "shared-10", "S-1"):
            outside = await _connect(channel, AGENT_SCOPED, engine_id)
            assert await outside.finished() == grpc.StatusCode.PERMISSION_DENIED, engine_id
            assert "team-s" in outside.details and engine_id in outside.details
        assert _rejections(ctl, "refused") - refused_before == 4
        inside = []
        for engine_id in ("s-1", "shared-1"):
            agent = await _connect(channel, AGENT_SCOPED, engine_id)
            await agent.decision()
            inside.append(agent)
        # An identity without patterns may serve any engine id not held by another identity.
        free = await _connect(channel, AGENT_A, "s-2")
        await free.decision()
        for agent in (*inside, free):
            await agent.close()


async def test_refused_streams_leave_no_trace_in_the_store(redis_url: str) -> None:
    """A stream refused for its identity or scope reserves no version epoch and writes no decision."""
    import redis.asyncio as aioredis

    keys = KeySpace()
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        outside = await _connect(channel, AGENT_SCOPED, "x-9")
        assert await outside.finished() == grpc.StatusCode.PERMISSION_DENIED
        client = aioredis.Redis.from_url(redis_url)
        try:
            assert not await client.exists(keys.decision("x-9"))
            assert not [k for k in await client.keys("*") if b"x-9" in k]
        finally:
            await client.aclose()
