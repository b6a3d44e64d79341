"""OperatorService over real loopback gRPC against a real redis-server: the overrides in force, the audit
(overrides and calibrations, with the operator's identity), the decision history, explicit scopes, NOT_FOUND
for a missing override, pin warnings against engine limits, and bounded error messages."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.service.config import SecurityConfig
from tests.integration.controller_harness import (
    RTX_PRO_6000,
    AgentStream,
    geometric_batch,
    is_data_driven,
    make_config,
    operator_stub,
    running_controller,
)

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
OTHER_POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
POOL_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)
ALICE = "alice-operator-token-0123456789"
BOB = "bob-operator-token-0123456789ab"


def engine_scope(engine_id: str) -> operator_pb2.Scope:
    return operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=engine_id)


def calibration_for(pool: common_pb2.Pool, *, source: str = "test") -> operator_pb2.Calibration:
    calibration = operator_pb2.Calibration()
    calibration.CopyFrom(RTX_PRO_6000)
    calibration.pool.CopyFrom(pool)
    calibration.source = source
    return calibration


def auth(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def secured_config(redis_url: str):
    return make_config(redis_url, security=SecurityConfig(operator_tokens={ALICE: "alice", BOB: "bob"}))


async def expect_error(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    return raised.value.details()


async def test_list_overrides_shows_what_is_in_force(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        assert list((await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides) == []
        await stub.PinMode(operator_pb2.PinModeRequest(scope=engine_scope("e1"), mode=operator_pb2.PINNED_MODE_EB,
                                                       k=8, n=32))
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=POOL_SCOPE, delta_s_per_token=2e-5, reason="ttft"))
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=FLEET, delta_s_per_token=-1e-5))
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=engine_scope("e1"), delta_s_per_token=1e-5,
                                                         expires_in_s=0.6))
        listed = (await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides
        # Per kind (delta, then pin), most specific scope last.
        assert [(r.kind, r.scope.kind) for r in listed] == [
            (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.SCOPE_KIND_FLEET),
            (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.SCOPE_KIND_POOL),
            (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.SCOPE_KIND_ENGINE),
            (operator_pb2.OVERRIDE_KIND_PIN, operator_pb2.SCOPE_KIND_ENGINE),
        ]
        assert listed[1].delta_s_per_token == 2e-5 and listed[1].reason == "ttft"
        assert listed[3].k == 8 and listed[3].n == 32 and listed[3].set_by == "anonymous"
        await asyncio.sleep(0.8)  # the engine δ expires
        await stub.ClearOverride(operator_pb2.ClearOverrideRequest(scope=FLEET, kind=operator_pb2.OVERRIDE_KIND_DELTA))
        listed = (await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides
        assert [(r.kind, r.scope.kind) for r in listed] == [
            (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.SCOPE_KIND_POOL),
            (operator_pb2.OVERRIDE_KIND_PIN, operator_pb2.SCOPE_KIND_ENGINE),
        ]


async def test_clearing_a_missing_override_is_not_found(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        clear = operator_pb2.ClearOverrideRequest(scope=POOL_SCOPE, kind=operator_pb2.OVERRIDE_KIND_DELTA)
        details = await expect_error(stub.ClearOverride(clear), grpc.StatusCode.NOT_FOUND)
        assert "no delta override in force at scope 'pool:Qwen/Qwen3-8B|RTX PRO 6000'" in details
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=POOL_SCOPE, delta_s_per_token=1e-5))
        # A pin at the same scope is still missing.
        pin_clear = operator_pb2.ClearOverrideRequest(scope=POOL_SCOPE, kind=operator_pb2.OVERRIDE_KIND_PIN)
        await expect_error(stub.ClearOverride(pin_clear), grpc.StatusCode.NOT_FOUND)
        cleared = await stub.ClearOverride(clear)
        assert cleared.cleared
        await expect_error(stub.ClearOverride(clear), grpc.StatusCode.NOT_FOUND)
        audit = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
        # Refused clears leave no audit entry: one set, one clear.
        assert [(e.action, e.kind) for e in audit] == [("clear", "delta"), ("set", "delta")]


@pytest.mark.parametrize("scope", [None, operator_pb2.Scope(), operator_pb2.Scope(engine_id="e1")])
async def test_an_unspecified_scope_is_refused(redis_url: str, scope: operator_pb2.Scope | None) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        kw = {"scope": scope} if scope is not None else {}
        for call in (stub.SetDelta(operator_pb2.SetDeltaRequest(delta_s_per_token=1e-5, **kw)),
                     stub.PinMode(operator_pb2.PinModeRequest(mode=operator_pb2.PINNED_MODE_EB, **kw)),
                     stub.ClearOverride(operator_pb2.ClearOverrideRequest(kind=operator_pb2.OVERRIDE_KIND_PIN,
                                                                          **kw))):
            details = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT)
            assert "give an explicit scope" in details and "not taken to mean the fleet" in details
        assert list((await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides) == []


async def test_pin_bounds_and_warnings_against_engine_limits(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        small = agent_pb2.EngineLimits(max_num_seqs=64, max_num_batched_tokens=16384, kv_capacity_tokens=400_000,
                                       block_size_tokens=16, max_model_len_tokens=32768)
        agent = await AgentStream(channel, "e1", POOL).open(limits=small)
        await agent.next_decision()
        other = await AgentStream(channel, "e2", OTHER_POOL).open()  # max_num_seqs 1024
        await other.next_decision()

        for request, wanted in (
            (operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, n=(1 << 20) + 1),
             "n=1048577 is above the limit of a pin"),
            (operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=(1 << 20) + 1),
             "k=1048577 is above the limit of a pin"),
            (operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=65, n=64),
             "k=65 must not exceed n=64"),
        ):
            assert wanted in await expect_error(stub.PinMode(request), grpc.StatusCode.INVALID_ARGUMENT)

        record = await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB,
                                                                n=100_000))
        assert list(record.warnings) == [
            "n=100000 exceeds max_num_seqs=64 of engine 'e1': the pin's n is ignored there (flag pin_invalid)",
            "n=100000 exceeds max_num_seqs=1024 of engine 'e2': the pin's n is ignored there (flag pin_invalid)",
        ]
        # What the warning says is what the decision does.
        decision = await agent.next_decision(where=lambda d: d.reason == "operator_pin")
        assert "pin_invalid" in decision.flags and decision.n <= 64
        record = await stub.PinMode(operator_pb2.PinModeRequest(scope=POOL_SCOPE, mode=operator_pb2.PINNED_MODE_EB,
                                                                k=100, n=0))
        assert list(record.warnings) == ["k=100 exceeds max_num_seqs=64 of engine 'e1': k is clamped to the "
                                         "engine's N there (at most 64)"]
        decision = await agent.next_decision(where=lambda d: d.reason == "operator_pin" and d.mode == common_pb2.MODE_EB
                                             and "pin_invalid" not in d.flags)
        assert decision.k <= decision.n <= 64
        record = await stub.PinMode(operator_pb2.PinModeRequest(scope=engine_scope("e2"),
                                                                mode=operator_pb2.PINNED_MODE_EB, k=16, n=512))
        assert list(record.warnings) == []
        record = await stub.PinMode(operator_pb2.PinModeRequest(scope=engine_scope("gone"),
                                                                mode=operator_pb2.PINNED_MODE_EB, n=512))
        assert list(record.warnings) == [
            "engine 'gone' is not an engine the controller knows (connected or remembered; known pools: "
            "'Qwen/Qwen3-8B|NVIDIA H200', 'Qwen/Qwen3-8B|RTX PRO 6000'): the override is kept and applies only if "
            "such an engine connects",
            "no engine in scope 'engine:gone' is connected to this controller: k and n were not checked against "
            "engine limits"]
        await agent.close()
        await other.close()


async def test_changes_on_a_scope_no_engine_reported_warn_with_the_known_pools(redis_url: str) -> None:
    typo = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL,
                              pool=common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX-PRO-6000"))
    unknown_pool = ("pool 'Qwen/Qwen3-8B|RTX-PRO-6000' has no engine the controller knows (connected or "
                    "remembered; known pools: {pools}): the override is kept and applies only if such an engine "
                    "connects")
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        record = await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=typo, delta_s_per_token=1e-5))
        assert list(record.warnings) == [unknown_pool.format(pools="none")]
        agent = await AgentStream(channel, "e1", POOL).open()
        await agent.next_decision()
        known = "'Qwen/Qwen3-8B|RTX PRO 6000'"
        for change in (stub.SetDelta(operator_pb2.SetDeltaRequest(scope=typo, delta_s_per_token=2e-5)),
                       stub.PinMode(operator_pb2.PinModeRequest(scope=typo, mode=operator_pb2.PINNED_MODE_EB)),
                       stub.ClearOverride(operator_pb2.ClearOverrideRequest(scope=typo,
                                                                            kind=operator_pb2.OVERRIDE_KIND_DELTA))):
            assert list((await change).warnings) == [unknown_pool.format(pools=known)]
        record = await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=engine_scope("e9"), delta_s_per_token=1e-5))
        assert list(record.warnings) == [
            f"engine 'e9' is not an engine the controller knows (connected or remembered; known pools: {known}): "
            f"the override is kept and applies only if such an engine connects"]
        # Known scopes and the fleet: no warning, for each change.
        for scope in (POOL_SCOPE, engine_scope("e1"), FLEET):
            assert list((await stub.SetDelta(operator_pb2.SetDeltaRequest(
                scope=scope, delta_s_per_token=1e-5))).warnings) == []
            assert list((await stub.ClearOverride(operator_pb2.ClearOverrideRequest(
                scope=scope, kind=operator_pb2.OVERRIDE_KIND_DELTA))).warnings) == []
        assert list((await stub.PinMode(operator_pb2.PinModeRequest(
            scope=POOL_SCOPE, mode=operator_pb2.PINNED_MODE_MB))).warnings) == []
        # An engine another replica holds (in the shared registry) is known too, and so is its pool.
        assert ctl.app.store is not None
        await ctl.app.store.heartbeat("e-elsewhere", info={"pool": "Qwen/Qwen3-8B|RTX-PRO-6000",
                                                           "controller_id": "replica-b"}, ttl_s=30.0)
        for scope in (typo, engine_scope("e-elsewhere")):
            assert list((await stub.SetDelta(operator_pb2.SetDeltaRequest(
                scope=scope, delta_s_per_token=1e-5))).warnings) == []
        await agent.close()


async def test_calibrations_are_audited_with_the_operator_identity(redis_url: str) -> None:
    async with running_controller(secured_config(redis_url)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        first = await stub.PutCalibration(operator_pb2.PutCalibrationRequest(
            calibration=calibration_for(POOL, source="pd_calibration_a.json")), metadata=auth(ALICE))
        assert first.set_by == "alice" and first.set_at_s > 0
        second = calibration_for(POOL, source="pd_calibration_b.json")
        second.alpha_d_s = 0.02
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=second), metadata=auth(BOB))
        stored = await stub.GetCalibration(operator_pb2.GetCalibrationRequest(pool=POOL), metadata=auth(ALICE))
        assert stored.set_by == "bob" and stored.source == "pd_calibration_b.json" and stored.alpha_d_s == 0.02
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=FLEET, delta_s_per_token=1e-5, reason="why not"),
                            metadata=auth(ALICE))
        entries = (await stub.ListAudit(operator_pb2.ListAuditRequest(), metadata=auth(BOB))).entries
        assert [(e.actor, e.action, e.kind, e.target) for e in entries] == [
            ("alice", "set", "delta", "fleet"),
            ("bob", "calibration", "calibration", "Qwen/Qwen3-8B|RTX PRO 6000"),
            ("alice", "calibration", "calibration", "Qwen/Qwen3-8B|RTX PRO 6000"),
        ]
        assert entries[0].reason == "why not"
        assert entries[0].at_s >= entries[1].at_s >= entries[2].at_s > 0
        # old → new of the calibrations, as JSON with proto field names.
        assert entries[2].old_json == ""
        assert json.loads(entries[2].new_json)["source"] == "pd_calibration_a.json"
        assert json.loads(entries[1].old_json)["set_by"] == "alice"
        assert json.loads(entries[1].new_json)["alpha_d_s"] == 0.02
        unknown = operator_pb2.GetCalibrationRequest(pool=OTHER_POOL)
        await expect_error(stub.GetCalibration(unknown, metadata=auth(ALICE)), grpc.StatusCode.NOT_FOUND)


async def test_audit_is_newest_first_with_limits(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        for i in range(105):
            await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=FLEET, delta_s_per_token=i * 1e-6,
                                                             reason=f"step {i}"))
        default = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
        assert len(default) == 100
        assert [e.reason for e in default[:3]] == ["step 104", "step 103", "step 102"]
        newest = json.loads(default[0].new_json)
        assert newest["delta_s_per_token"] == pytest.approx(104e-6)
        assert json.loads(default[0].old_json)["delta_s_per_token"] == pytest.approx(103e-6)
        few = (await stub.ListAudit(operator_pb2.ListAuditRequest(limit=7))).entries
        assert [e.id for e in few] == [e.id for e in default[:7]]
        everything = (await stub.ListAudit(operator_pb2.ListAuditRequest(limit=1000))).entries
        assert len(everything) == 105
        details = await expect_error(stub.ListAudit(operator_pb2.ListAuditRequest(limit=10_001)),
                                     grpc.StatusCode.INVALID_ARGUMENT)
        assert "limit must be ≤ 10000" in details


async def test_history_lists_decisions_newest_first_by_engine_and_pool(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(POOL)))
        agents = {}
        for engine_id, pool in (("e1", POOL), ("e2", OTHER_POOL)):
            agents[engine_id] = await AgentStream(channel, engine_id, pool).open()
            await agents[engine_id].next_decision()
        rng = np.random.default_rng(7)
        for seq in range(1, 9):
            await agents["e1"].send_batch(geometric_batch(seq, rng, num=250))
        await agents["e1"].next_decision(where=is_data_driven)
        await stub.PinMode(operator_pb2.PinModeRequest(scope=engine_scope("e2"), mode=operator_pb2.PINNED_MODE_EB,
                                                       k=4, n=16))
        await agents["e2"].next_decision(where=lambda d: d.reason == "operator_pin")
        entries = []
        for _ in range(50):  # decisions are written behind the push
            entries = (await stub.ListHistory(operator_pb2.ListHistoryRequest())).entries
            if {e.engine_id for e in entries} == {"e1", "e2"} and any(e.decision.reason == "operator_pin"
                                                                      for e in entries):
                break
            await asyncio.sleep(0.1)
        assert {e.engine_id for e in entries} == {"e1", "e2"}
        # Newest written first (stream ids); per engine that is newest decided first.
        ids = [tuple(int(part) for part in e.id.split("-")) for e in entries]
        assert ids == sorted(ids, reverse=True)
        for engine_id in ("e1", "e2"):
            times = [e.decided_at_s for e in entries if e.engine_id == engine_id]
            assert times == sorted(times, reverse=True) and times[-1] > 0
        for entry in entries:
            assert entry.decided_at_s == entry.decision.decided_at_s and entry.id
            assert entry.pool == (POOL if entry.engine_id == "e1" else OTHER_POOL)
        versions = [e.decision.version for e in entries if e.engine_id == "e1"]
        assert versions == sorted(versions, reverse=True) and len(versions) >= 2
        only_e2 = (await stub.ListHistory(operator_pb2.ListHistoryRequest(engine_id="e2"))).entries
        assert only_e2 and {e.engine_id for e in only_e2} == {"e2"}
        assert only_e2[0].decision.reason == "operator_pin"
        by_pool = (await stub.ListHistory(operator_pb2.ListHistoryRequest(pool=POOL))).entries
        assert [e.id for e in by_pool] == [e.id for e in entries if e.engine_id == "e1"]
        one = (await stub.ListHistory(operator_pb2.ListHistoryRequest(limit=1, pool=POOL))).entries
        assert [e.id for e in one] == [by_pool[0].id]
        for agent in agents.values():
            await agent.close()


async def test_error_messages_echo_a_bounded_prefix(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        huge = "x" * 100_000
        details = await expect_error(stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=huge)),
                                     grpc.StatusCode.NOT_FOUND)
        assert len(details) < 200 and "(100000 chars)" in details
        bad_pool = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL,
                                      pool=common_pb2.Pool(model="m" * 50_000, accelerator="a"))
        details = await expect_error(stub.SetDelta(operator_pb2.SetDeltaRequest(scope=bad_pool,
                                                                                delta_s_per_token=1e-5)),
                                     grpc.StatusCode.INVALID_ARGUMENT)
        assert len(details) < 300 and "scope.pool" in details
        details = await expect_error(stub.PinMode(operator_pb2.PinModeRequest(
            scope=engine_scope("bad id/" + "y" * 10_000), mode=operator_pb2.PINNED_MODE_EB)),
            grpc.StatusCode.INVALID_ARGUMENT)
        assert len(details) < 300 and "is not an engine id" in details
        details = await expect_error(stub.SetDelta(operator_pb2.SetDeltaRequest(
            scope=FLEET, delta_s_per_token=1e-5, reason="r" * 5000)), grpc.StatusCode.INVALID_ARGUMENT)
        assert "reason is longer than 1024 characters (5000)" in details


async def _decisions_of(stub, request: operator_pb2.WatchDecisionsRequest, count: int,
                        timeout_s: float = 10.0) -> list[operator_pb2.DecisionView]:
    stream = stub.WatchDecisions(request)
    views: list[operator_pb2.DecisionView] = []

    async def take() -> None:
        async for view in stream:
            views.append(view)
            if len(views) == count:
                return

    try:
        await asyncio.wait_for(take(), timeout_s)
    finally:
        stream.cancel()
    return views


async def test_a_watch_resumes_from_a_time_with_the_decisions_made_since(redis_url: str) -> None:
    """A watcher that was away (a disconnect, a controller restart) resumes with since_s: it first gets the
    decisions the history holds decided after that time, oldest first, then the live ones, each version once.
    (The history holds each engine's versions as written: the writer coalesces versions superseded before
    their write.)"""
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        agent = await AgentStream(channel, "engine-resume", POOL).open()
        first = await agent.next_decision()
        await asyncio.sleep(1.0)  # written before the next one
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=engine_scope("engine-resume"), delta_s_per_token=1e-5,
                                                         reason="a second version"))
        second = await agent.next_decision(where=lambda d: d.version > first.version)
        await asyncio.sleep(1.0)  # the history is written after the push
        history = await stub.ListHistory(operator_pb2.ListHistoryRequest(engine_id="engine-resume", limit=10))
        written = sorted(e.decision.version for e in history.entries)
        assert written == [first.version, second.version]
        views = await _decisions_of(stub, operator_pb2.WatchDecisionsRequest(engine_id="engine-resume",
                                                                             since_s=first.decided_at_s - 1.0), 2)
        assert [v.decision.version for v in views] == [first.version, second.version]
        only_second = await _decisions_of(stub, operator_pb2.WatchDecisionsRequest(
            engine_id="engine-resume", since_s=first.decided_at_s), 1)
        assert [v.decision.version for v in only_second] == [second.version]
        # Live after the replay, and never the replayed version again.
        stream = stub.WatchDecisions(operator_pb2.WatchDecisionsRequest(engine_id="engine-resume",
                                                                        since_s=first.decided_at_s - 1.0))
        seen = [(await anext(aiter(stream))).decision.version for _ in range(2)]
        await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=engine_scope("engine-resume"), delta_s_per_token=2e-5,
                                                         reason="a third version"))
        third = await asyncio.wait_for(anext(aiter(stream)), 10.0)
        stream.cancel()
        assert seen == [first.version, second.version] and third.decision.version > second.version
        await agent.close()


async def test_a_watch_that_cannot_resume_says_so(redis_url: str, monkeypatch) -> None:
    from controlplane.service import operator_servicer

    monkeypatch.setattr(operator_servicer, "MAX_LIST_LIMIT", 1)  # the history read reaches back one decision
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        agents = [await AgentStream(channel, f"engine-r{i}", POOL).open() for i in range(2)]
        for agent in agents:
            await agent.next_decision()
        await asyncio.sleep(1.0)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _decisions_of(stub, operator_pb2.WatchDecisionsRequest(since_s=1.0), 1)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "cannot resume" in info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await _decisions_of(stub, operator_pb2.WatchDecisionsRequest(since_s=float("nan")), 1)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for agent in agents:
            await agent.close()
