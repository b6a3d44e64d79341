"""Guarded rollouts through a real controller (loopback gRPC, a real redis-server): a calibration put into a
running pool of three engines asks for another mode; one canary runs it while the others hold the established
mode; ListRollouts shows it, an operator aborts it with SteerRollout (audited with the controller's own entry of
its start), and the canary is back on the established mode. A second replica on the same Redis shows the
first's rollout in its ListRollouts while it runs, and not after it ended. Two replicas holding engines of one
pool run one rollout of a change both pools' engines ask for (one owns it; the other's engines are held), and the
owner's promotion switches the other replica's engines too."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.codec import calibration_to_cost_model, cost_model_to_calibration
from testbench.messages import geometric_batch
from tests.integration.controller_harness import (
    AgentStream,
    calibration_for,
    is_data_driven,
    make_config,
    operator_stub,
    running_controller,
)

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000 rollouts")
ENGINES = ("r0", "r1", "r2")


def _mb_favouring() -> operator_pb2.Calibration:
    """The pool's profile with a prefill four times slower: EB's prefill-only steps cost more, MB wins."""
    costs = calibration_to_cost_model(calibration_for(POOL))
    return cost_model_to_calibration(replace(costs, beta_p_s_per_token=4 * costs.beta_p_s_per_token), POOL,
                                     source="mb-favouring")


async def _other_replicas(stub, owner: str, *, present: bool) -> list[operator_pb2.RolloutView]:
    """The rollouts another replica lists as `owner`'s, once there are some (present) or none (not present)."""
    for _ in range(100):
        listed = [r for r in (await stub.ListRollouts(operator_pb2.ListRolloutsRequest())).rollouts
                  if r.controller_id == owner]
        if bool(listed) == present:
            return listed
        await asyncio.sleep(0.1)
    raise AssertionError(f"the other replica never listed {'a' if present else 'no'} rollout of {owner}")


async def test_an_operator_aborts_a_rollout_and_the_canary_returns_to_the_established_mode(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel, \
            running_controller(make_config(redis_url, controller_id="replica-b")) as other, \
            grpc.aio.insecure_channel(other.address) as other_channel:
        stub = operator_stub(channel)
        other_stub = operator_stub(other_channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=_mb_favouring()))
        agents = {e: await AgentStream(channel, e, POOL).open() for e in ENGINES}
        rng = np.random.default_rng(30)
        for seq in range(1, 9):
            for agent in agents.values():
                await agent.send_batch(geometric_batch(seq, rng, num=250))
        for agent in agents.values():
            decision = await agent.next_decision(where=is_data_driven)
            assert decision.mode == common_pb2.MODE_MB, decision
        assert not (await stub.ListRollouts(operator_pb2.ListRolloutsRequest())).rollouts

        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(POOL)))
        rollouts = []
        for _ in range(100):
            rollouts = list((await stub.ListRollouts(operator_pb2.ListRolloutsRequest())).rollouts)
            if rollouts:
                break
            await asyncio.sleep(0.1)
        assert len(rollouts) == 1, rollouts
        rollout = rollouts[0]
        assert (rollout.from_mode, rollout.to_mode, rollout.state) == ("mb", "eb", "running")
        [canary] = rollout.canary_engine_ids
        held = [e for e in ENGINES if e != canary]
        views = {e: await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=e)) for e in ENGINES}
        assert views[canary].decision.mode == common_pb2.MODE_EB
        assert all(views[e].decision.mode == common_pb2.MODE_MB and views[e].latest.reason == "rollout_hold"
                   for e in held), {e: (v.decision.mode, v.latest.reason) for e, v in views.items()}
        assert views[canary].outcomes.rollout.startswith("canary mb→eb")
        [shown] = await _other_replicas(other_stub, rollout.controller_id, present=True)
        assert (shown.pool, shown.from_mode, shown.to_mode, shown.state) == (POOL, "mb", "eb", "running")
        assert list(shown.canary_engine_ids) == [canary] and shown.controller_id != "replica-b"

        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.SteerRollout(operator_pb2.SteerRolloutRequest(
                pool=common_pb2.Pool(model="m", accelerator="none"), action=operator_pb2.ROLLOUT_ACTION_ABORT))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        ended = await stub.SteerRollout(operator_pb2.SteerRolloutRequest(
            pool=POOL, action=operator_pb2.ROLLOUT_ACTION_ABORT, reason="not during the launch"))
        assert ended.state == "aborted" and ended.ended_at_s > 0
        back = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=canary))
        assert back.decision.mode == common_pb2.MODE_MB and back.latest.reason == "rollout_hold"
        listed = await stub.ListRollouts(operator_pb2.ListRolloutsRequest())
        assert not listed.rollouts and listed.recent[0].state == "aborted"
        assert await _other_replicas(other_stub, rollout.controller_id, present=False) == []

        audit = []
        for _ in range(50):  # the audit writer appends within about half a second
            audit = [e for e in (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries if e.kind == "rollout"]
            if len(audit) >= 2:
                break
            await asyncio.sleep(0.1)
        assert [(e.action, e.actor) for e in audit] == [("rollout_aborted", "anonymous"),
                                                        ("rollout_started", "controller controller-0")], audit
        assert audit[0].reason == "not during the launch" and audit[0].target == f"pool:{POOL.model}|{POOL.accelerator}"
        for agent in agents.values():
            await agent.close()


async def _all_rollouts(stubs) -> list[operator_pb2.RolloutView]:
    """Every rollout in progress as the replicas list them (each lists its own and the others'), by owner."""
    seen = {}
    for stub in stubs:
        for view in (await stub.ListRollouts(operator_pb2.ListRolloutsRequest())).rollouts:
            seen[(view.controller_id, view.started_at_s)] = view
    return list(seen.values())


async def test_two_replicas_holding_one_pool_run_one_rollout_and_both_take_its_verdict(redis_url: str) -> None:
    async with running_controller(make_config(redis_url, controller_id="replica-a")) as a, \
            grpc.aio.insecure_channel(a.address) as channel_a, \
            running_controller(make_config(redis_url, controller_id="replica-b")) as b, \
            grpc.aio.insecure_channel(b.address) as channel_b:
        stubs = {"replica-a": operator_stub(channel_a), "replica-b": operator_stub(channel_b)}
        await stubs["replica-a"].PutCalibration(operator_pb2.PutCalibrationRequest(calibration=_mb_favouring()))
        engines = {"replica-a": ("a0", "a1", "a2"), "replica-b": ("b0", "b1", "b2")}
        channels = {"replica-a": channel_a, "replica-b": channel_b}
        agents = {e: await AgentStream(channels[r], e, POOL).open() for r, ids in engines.items() for e in ids}
        rng = np.random.default_rng(31)
        for seq in range(1, 9):
            for agent in agents.values():
                await agent.send_batch(geometric_batch(seq, rng, num=250))
        for agent in agents.values():
            assert (await agent.next_decision(where=is_data_driven)).mode == common_pb2.MODE_MB

        # The calibration reaches both replicas; both pools' engines ask for EB; one replica's rollout owns it.
        await stubs["replica-a"].PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(POOL)))
        running = []
        for _ in range(100):
            running = await _all_rollouts(stubs.values())
            if len(running) == 1:
                await asyncio.sleep(1.0)  # a few publication rounds later it is still the only one
                running = await _all_rollouts(stubs.values())
                if len(running) == 1:
                    break
            await asyncio.sleep(0.1)
        assert len(running) == 1, running
        [owned] = running
        owner = owned.controller_id
        other = next(r for r in stubs if r != owner)
        assert set(owned.canary_engine_ids) <= set(engines[owner])
        views = {e: await stubs[other].GetDecision(operator_pb2.GetDecisionRequest(engine_id=e))
                 for e in engines[other]}
        assert all(v.decision.mode == common_pb2.MODE_MB for v in views.values()), views  # held by the owner's

        await stubs[owner].SteerRollout(operator_pb2.SteerRolloutRequest(
            pool=POOL, action=operator_pb2.ROLLOUT_ACTION_PROMOTE, reason="one owner"))
        modes = {}
        for _ in range(100):  # the other replica takes the verdict at its next read of the views
            modes = {e: (await stubs[other].GetDecision(operator_pb2.GetDecisionRequest(engine_id=e))).decision.mode
                     for e in engines[other]}
            if all(mode == common_pb2.MODE_EB for mode in modes.values()):
                break
            await asyncio.sleep(0.1)
        assert all(mode == common_pb2.MODE_EB for mode in modes.values()), modes
        recent = (await stubs[other].ListRollouts(operator_pb2.ListRolloutsRequest())).recent
        assert any(v.controller_id == owner and v.state == "promoted" for v in recent), recent
        # The other replica ran none to a verdict of its own: it started none, or yielded the one it started.
        assert {v.state for v in recent if v.controller_id == other} <= {"yielded"}, recent
        for agent in agents.values():
            await agent.close()
