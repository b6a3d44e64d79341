"""Outcome telemetry through a real controller (loopback gRPC, a real redis-server): the latencies the agents'
stamps give reach the explain view as quantiles within the sketch's 1% and the Prometheus histograms per
pool; an agent that sends no stamps is served as before."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from testbench.messages import geometric_batch, stamped_batch
from tests.integration.controller_harness import (
    AgentStream,
    calibration_for,
    make_config,
    operator_stub,
    running_controller,
    warm_engine,
)

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
NOW_S = 1.7e9


def _within(measured: float, values: np.ndarray, quantile: float) -> bool:
    exact = np.sort(values)[int(np.floor(quantile * (values.size - 1)))]
    return abs(measured - exact) <= 0.0101 * exact


async def test_stamped_latencies_reach_the_explain_view_and_the_histograms(redis_url: str) -> None:
    rng = np.random.default_rng(3)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stamped = [await AgentStream(channel, f"stamped-{i}", POOL).open() for i in range(3)]
        plain = await AgentStream(channel, "plain", POOL).open()
        ttft_sent, tpot_sent = [], []
        for seq in range(1, 5):
            for agent in stamped:
                batch, ttft, tpot = stamped_batch(seq, rng, num=150)
                ttft_sent.append(ttft)
                tpot_sent.append(tpot)
                await agent.send_batch(batch)
            await plain.send_batch(geometric_batch(seq, rng, num=150))
        await plain.next_decision(timeout_s=20.0)  # an agent without stamps is decided as before
        ttft_all, tpot_all = np.concatenate(ttft_sent), np.concatenate(tpot_sent)

        view = None
        for _ in range(100):  # the buckets close and settle within about two seconds
            view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="plain"))
            if view.outcomes.ttft.num_requests == ttft_all.size:
                break
            await asyncio.sleep(0.1)
        assert view is not None and view.outcomes.ttft.num_requests == ttft_all.size, view.outcomes
        assert view.outcomes.tpot.num_requests == tpot_all.size
        assert view.outcomes.queue.num_requests == 0  # no admission stamps were sent
        for name, values in (("ttft", ttft_all), ("tpot", tpot_all)):
            quantiles = getattr(view.outcomes, name)
            for q, measured in ((0.5, quantiles.p50_s), (0.9, quantiles.p90_s), (0.99, quantiles.p99_s)):
                assert _within(measured, values, q), (name, q, measured)
            assert abs(quantiles.mean_s - values.mean()) <= 1e-9 * values.mean()

        text = ctl.app.metrics.exposition().decode()
        pool_label = f'pool="{POOL.model}|{POOL.accelerator}"'
        count_line = next(line for line in text.splitlines()
                          if line.startswith("cp_pool_ttft_seconds_count") and pool_label in line)
        assert float(count_line.rsplit(" ", 1)[1]) == ttft_all.size
        le_1s = next(line for line in text.splitlines()
                     if line.startswith("cp_pool_ttft_seconds_bucket") and pool_label in line and 'le="1.0"' in line)
        below_1s = float(le_1s.rsplit(" ", 1)[1])
        assert abs(below_1s - np.count_nonzero(ttft_all <= 1.0)) <= np.count_nonzero(np.abs(ttft_all - 1) < 0.011)
        for agent in (*stamped, plain):
            await agent.close()


async def test_impossible_stamps_are_dropped_and_counted_not_fatal(redis_url: str) -> None:
    rng = np.random.default_rng(4)
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await AgentStream(channel, "odd-stamps", POOL).open()
        batch, _, _ = stamped_batch(1, rng, num=400)
        c = batch.completions
        c.first_token_time_s[0] = float("inf")
        c.arrival_time_s[1] = c.first_token_time_s[1] + 10.0  # first token before arrival
        c.arrival_time_s[2] = c.first_token_time_s[2] - 7200.0  # two hours to first token
        await agent.send_batch(batch)
        short = geometric_batch(2, rng, num=5)
        short.completions.arrival_time_s.extend([NOW_S] * 4)  # one per completion, or nothing
        await agent.send_batch(short)
        await agent.finished()
        assert agent.error is not None and agent.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "telemetry.completions.arrival_time_s" in agent.error.details()
        engines = (await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest())).engines
        assert engines[0].num_rejected_events >= 3


async def test_an_objective_is_audited_durable_and_moves_delta_within_seconds(redis_url: str) -> None:
    config = make_config(redis_url)
    pool_scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)
    objective = operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=0.5)
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(POOL)))
        agent, decision = await warm_engine(channel, "slow-ttft", POOL, seed=5)
        assert decision.delta_source == "default"
        rng = np.random.default_rng(6)
        for seq in range(9, 13):  # TTFT p99 ≈ 2.9 s, far above the target
            await agent.send_batch(stamped_batch(seq, rng, num=200)[0])
        for _ in range(100):
            view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="slow-ttft"))
            if view.outcomes.ttft.num_requests >= 800:
                break
            await asyncio.sleep(0.1)
        assert view.outcomes.ttft.num_requests >= 800 and not view.outcomes.HasField("objective")

        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await stub.SetObjective(operator_pb2.SetObjectiveRequest(
                scope=pool_scope, objective=operator_pb2.LatencyObjective(ttft_quantile=0.99)))
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ttft_target_s" in invalid.value.details()

        started = asyncio.get_running_loop().time()
        record = await stub.SetObjective(operator_pb2.SetObjectiveRequest(scope=pool_scope, objective=objective,
                                                                          reason="chat TTFT"))
        assert record.kind == operator_pb2.OVERRIDE_KIND_OBJECTIVE and record.objective == objective
        while asyncio.get_running_loop().time() - started < 10.0:
            view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="slow-ttft"))
            if view.latest.delta_source == "objective" and view.latest.delta_s_per_token != 0:
                break
            await asyncio.sleep(0.1)
        assert view.latest.delta_source == "objective" and view.latest.delta_s_per_token != 0, view.latest
        assert view.outcomes.objective_state == operator_pb2.OBJECTIVE_STATE_ADJUSTING
        assert "TTFT p99" in view.outcomes.objective_detail and view.outcomes.objective == objective
        # The direction is the model's: towards the mode it predicts lower at this load, and it says so.
        towards = "mb" if view.latest.delta_s_per_token > 0 else "eb"
        assert f"adjusting δ towards {towards} (" in view.outcomes.objective_detail, view.outcomes.objective_detail
        assert "predicted" in view.outcomes.objective_detail
        audit = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
        assert any(e.kind == "objective" and e.action == "set" and e.reason == "chat TTFT" for e in audit)
        await agent.close()

    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        kept = [r for r in (await stub.ListOverrides(operator_pb2.ListOverridesRequest())).overrides
                if r.kind == operator_pb2.OVERRIDE_KIND_OBJECTIVE]
        assert [r.objective for r in kept] == [objective]  # durable across a restart
        cleared = await stub.ClearOverride(operator_pb2.ClearOverrideRequest(
            scope=pool_scope, kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, reason="done"))
        assert cleared.cleared


async def test_an_engine_objective_holds_that_engine_to_its_own_latencies_and_wins_over_its_pools(
        redis_url: str) -> None:
    # Two engines of one pool: "slow" reports TTFTs around 2 s, "fast" around 50 ms. A pool objective of TTFT
    # p99 ≤ 30 s is met (δ stays 0); an engine objective of TTFT p99 ≤ 0.5 s on "slow" moves its δ alone, from
    # its own requests, and clearing it hands "slow" back to the pool's objective.
    config = make_config(redis_url)
    pool_scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)
    slow_scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="slow")
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(POOL)))
        slow, _ = await warm_engine(channel, "slow", POOL, seed=7)
        fast = await AgentStream(channel, "fast", POOL).open()  # its first decision stands on the pool's data
        await fast.next_decision()
        await stub.SetObjective(operator_pb2.SetObjectiveRequest(
            scope=pool_scope, objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=30.0)))
        record = await stub.SetObjective(operator_pb2.SetObjectiveRequest(
            scope=slow_scope, objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=0.5),
            reason="an interactive tenant"))
        assert record.scope.engine_id == "slow" and not record.warnings
        rng = np.random.default_rng(9)
        views: dict[str, operator_pb2.DecisionView] = {}
        started = asyncio.get_running_loop().time()
        seq = 20
        while asyncio.get_running_loop().time() - started < 20.0:
            seq += 1
            await slow.send_batch(stamped_batch(seq, rng, num=100, median_ttft_s=2.0)[0])
            await fast.send_batch(stamped_batch(seq, rng, num=100, median_ttft_s=0.05)[0])
            for engine_id in ("slow", "fast"):
                views[engine_id] = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
            if views["slow"].latest.delta_s_per_token > 0 and views["fast"].outcomes.objective_state == \
                    operator_pb2.OBJECTIVE_STATE_MEETING:
                break
            await asyncio.sleep(0.2)
        slow_view, fast_view = views["slow"], views["fast"]
        assert slow_view.latest.delta_source == "objective" and slow_view.latest.delta_s_per_token > 0, slow_view
        assert slow_view.outcomes.objective.ttft_target_s == 0.5
        assert slow_view.outcomes.objective_state == operator_pb2.OBJECTIVE_STATE_ADJUSTING
        # Its own window: only its requests (the pool's holds both engines'), TTFT p99 far above the fast one's.
        assert slow_view.outcomes.ttft.p50_s > 1.0 and fast_view.outcomes.ttft.p50_s < 1.0
        assert fast_view.outcomes.objective.ttft_target_s == 30.0
        assert fast_view.latest.delta_s_per_token == 0.0
        assert fast_view.outcomes.objective_state == operator_pb2.OBJECTIVE_STATE_MEETING

        await stub.ClearOverride(operator_pb2.ClearOverrideRequest(
            scope=slow_scope, kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, reason="tenant moved"))
        view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="slow"))
        assert view.outcomes.objective.ttft_target_s == 30.0  # the pool's again
        audit = (await stub.ListAudit(operator_pb2.ListAuditRequest())).entries
        assert any(e.kind == "objective" and e.target == "engine:slow" and e.reason == "an interactive tenant"
                   for e in audit)
        for agent in (slow, fast):
            await agent.close()
