"""The controller over real loopback gRPC against a real redis-server."""

from __future__ import annotations

import asyncio
import json

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.cli.main import main as cli_main
from controlplane.core.types import PolicyConfig
from controlplane.observability.tracing import DECIDE_SPAN, OVERRIDE_SPAN
from controlplane.protocol import split_version
from controlplane.store.embedded import EmbeddedRedis
from controlplane.store.keys import KeySpace
from tests.integration.controller_harness import (
    LIMITS,
    RTX_PRO_6000,
    AgentStream,
    geometric_batch,
    is_data_driven,
    make_config,
    operator_stub,
    running_controller,
)
from tests.integration.controller_harness import (
    calibration_for as _calibration,
)
from tests.integration.controller_harness import (
    warm_engine as _warm_engine,
)

POOL_A = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
POOL_B = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000 B")


KEYS = KeySpace()


async def _stored_decision(client: aioredis.Redis, engine_id: str, *, at_least: int) -> dict[bytes, bytes]:
    """The stored decision hash once the writer has persisted a version ≥ at_least (it writes after the push)."""
    stored: dict[bytes, bytes] = {}
    for _ in range(100):
        stored = await client.hgetall(KEYS.decision(engine_id))
        if stored and int(stored[b"version"]) >= at_least:
            break
        await asyncio.sleep(0.05)
    return stored


async def test_geometric_completions_give_the_plan_decision(redis_url: str, capsys: pytest.CaptureFixture[str],
                                                            tmp_path) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        await operator_stub(channel).PutCalibration(
            operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent, decision = await _warm_engine(channel, "engine-a", POOL_A, seed=1)
        assert decision.mode == common_pb2.MODE_EB and decision.reason == "crossover_eb"
        d = decision.diagnostics
        assert abs(d.p0 * 256 - 1) < 0.05
        calibration = tmp_path / "pd.json"
        calibration.write_text(json.dumps({
            "alpha_p": RTX_PRO_6000.alpha_p_s, "beta_p": RTX_PRO_6000.beta_p_s_per_token,
            "alpha_d": RTX_PRO_6000.alpha_d_s, "beta_d": RTX_PRO_6000.beta_d_s_per_request}))
        capsys.readouterr()
        assert cli_main([
            "plan", "--calibration", str(calibration), "--alpha-mb", repr(RTX_PRO_6000.alpha_mb_s),
            "--mb-coeffs", ",".join(repr(c) for c in RTX_PRO_6000.mb_coeffs_s_per_token),
            "--p0", repr(d.p0), "--eta", repr(d.eta), "--mu-l", repr(d.mu_l_tokens), "--mu-o", repr(d.mu_o_tokens),
            "--kv-capacity-tokens", "1500000", "--max-num-seqs", "1024", "--n-prev", str(d.n_star),
            "--n-obs", repr(d.n_obs), "--json",
        ]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert (decision.k, decision.n) == (plan["k_star_requests"], plan["n_star_requests"])
        assert plan["mode"] == "eb"
        assert plan["lhs_s_per_token"] == pytest.approx(d.lhs_s_per_token)
        assert plan["rhs_s_per_token"] == pytest.approx(d.rhs_s_per_token)
        # The ACK reached the controller; the engine is listed with fresh telemetry.
        for _ in range(50):
            engines = (await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest())).engines
            if engines[0].acked_version >= decision.version and engines[0].num_completions == 2000:
                break
            await asyncio.sleep(0.05)
        assert [e.engine_id for e in engines] == ["engine-a"]
        assert engines[0].connected and 0 <= engines[0].telemetry_age_s < 5
        assert engines[0].num_completions == 2000
        assert engines[0].acked_version >= decision.version
        await agent.close()


async def test_delta_override_is_scoped_audited_and_expires(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        for pool in (POOL_A, POOL_B):
            await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=_calibration(pool)))
        agent_a, decision_a = await _warm_engine(channel, "engine-a", POOL_A, seed=2)
        agent_b, decision_b = await _warm_engine(channel, "engine-b", POOL_B, seed=3)
        assert decision_a.mode == decision_b.mode == common_pb2.MODE_EB

        scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL_A)
        record = await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=scope, delta_s_per_token=0.001,
                                                                  expires_in_s=1.5, reason="protect TTFT"))
        assert record.set_by == "anonymous" and record.expires_at_s > 0
        favoured = await agent_a.next_decision(where=lambda d: d.mode == common_pb2.MODE_MB)
        assert favoured.reason == "crossover_mb" and favoured.delta_source == "pool"
        assert favoured.delta_s_per_token == pytest.approx(0.001)
        assert favoured.version > decision_a.version
        view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-a"))
        assert view.decision.mode == common_pb2.MODE_MB and view.decision.delta_s_per_token == pytest.approx(0.001)
        # The other pool's engine is untouched.
        view_b = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-b"))
        assert view_b.decision.mode == common_pb2.MODE_EB and view_b.decision.delta_source == "default"

        client = aioredis.Redis.from_url(redis_url)
        stored = await _stored_decision(client, "engine-a", at_least=favoured.version)
        assert int(stored[b"version"]) >= favoured.version
        assert await client.exists(KEYS.override("delta", "pool:Qwen/Qwen3-8B|RTX PRO 6000"))
        audit = [e for e in await client.xrange(KEYS.audit) if e[1][b"kind"] == b"delta"]
        assert len(audit) == 1  # calibrations are audited too; this is the δ change
        fields = {k.decode(): v.decode() for k, v in audit[0][1].items()}
        assert fields["actor"] == "anonymous" and fields["reason"] == "protect TTFT" and fields["action"] == "set"
        assert json.loads(fields["new"])["delta_s_per_token"] == pytest.approx(0.001)

        # After expiry the engine returns to the data-driven mode.
        back = await agent_a.next_decision(timeout_s=10, where=lambda d: d.mode == common_pb2.MODE_EB)
        assert back.delta_source == "default"
        await client.aclose()
        await agent_a.close()
        await agent_b.close()


async def test_restart_restores_overrides_and_decisions(redis_url: str) -> None:
    config = make_config(redis_url)
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent, _ = await _warm_engine(channel, "engine-a", POOL_A, seed=4)
        await stub.PinMode(operator_pb2.PinModeRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="engine-a"),
            mode=operator_pb2.PINNED_MODE_EB, k=7, n=300, reason="pinned for a test"))
        pinned = await agent.next_decision(where=lambda d: d.reason == "operator_pin")
        assert (pinned.mode, pinned.k, pinned.n) == (common_pb2.MODE_EB, 7, 300)
        await agent.close()

    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-a"))
        assert view.decision.version == pinned.version and view.decision.reason == "operator_pin"
        calibration = await stub.GetCalibration(operator_pb2.GetCalibrationRequest(pool=POOL_A))
        assert calibration.alpha_p_s == RTX_PRO_6000.alpha_p_s
        agent = await AgentStream(channel, "engine-a", POOL_A).open()
        again = await agent.next_decision()
        # The pin survived the restart and versions keep increasing.
        assert (again.mode, again.k, again.n, again.reason) == (common_pb2.MODE_EB, 7, 300, "operator_pin")
        assert again.version > pinned.version
        await agent.close()


async def test_decision_spans_carry_every_term(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        await operator_stub(channel).PutCalibration(
            operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent, decision = await _warm_engine(channel, "engine-a", POOL_A, seed=5)
        await operator_stub(channel).SetDelta(operator_pb2.SetDeltaRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), delta_s_per_token=-1e-6, reason="tp"))
        await agent.close()
        spans = ctl.spans.get_finished_spans()
        decide = [s for s in spans if s.name == DECIDE_SPAN and s.attributes["cp.version"] == decision.version]
        assert len(decide) == 1
        attributes = decide[0].attributes
        assert format(decide[0].context.trace_id, "032x") == decision.trace_id
        expected = {"cp.engine_id": "engine-a", "cp.pool": "Qwen/Qwen3-8B|RTX PRO 6000", "cp.mode": "eb",
                    "cp.k": decision.k, "cp.n": decision.n, "cp.reason": "crossover_eb", "cp.delta_source": "default"}
        assert {k: attributes[k] for k in expected} == expected
        for name in ("cp.budget.b_max_tokens", "cp.budget.b_cap_tokens", "cp.delta_s_per_token", "cp.p0", "cp.eta",
                     "cp.mu_l_tokens", "cp.mu_o_tokens", "cp.theta0", "cp.delta_theta", "cp.theta_star",
                     "cp.n_star", "cp.k_star", "cp.n_obs", "cp.lhs_s_per_token", "cp.rhs_s_per_token",
                     "cp.samples"):
            assert name in attributes, name
        assert attributes["cp.p0"] == pytest.approx(decision.diagnostics.p0)
        assert attributes["cp.samples"] == decision.diagnostics.num_samples >= 400
        override = [s for s in spans if s.name == OVERRIDE_SPAN]
        assert override and override[0].attributes["cp.override.scope"] == "fleet"
        assert override[0].attributes["cp.override.reason"] == "tp"


async def test_agent_trace_context_parents_the_decision_span(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        await operator_stub(channel).PutCalibration(
            operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent = await AgentStream(channel, "engine-a", POOL_A).open()
        await agent.next_decision()
        rng = np.random.default_rng(6)
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        for seq in range(1, 9):
            batch = geometric_batch(seq, rng, num=250)
            batch.traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"
            await agent.send_batch(batch)
        decision = await agent.next_decision(where=is_data_driven)
        assert decision.trace_id == trace_id
        await agent.close()


async def test_malformed_telemetry_is_rejected_and_other_streams_flow(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        good = await AgentStream(channel, "engine-good", POOL_A).open()
        bad = await AgentStream(channel, "engine-bad", POOL_A).open()
        await good.next_decision()
        await bad.next_decision()
        rng = np.random.default_rng(7)
        broken = geometric_batch(1, rng, num=10)
        del broken.completions.output_tokens[3:]
        await bad.send_batch(broken)
        await bad.finished()
        assert bad.error is not None and bad.error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "telemetry.completions" in bad.error.details()
        assert "output_tokens=3" in bad.error.details()
        # The good stream keeps flowing: its batches are ingested and it still gets decisions.
        for seq in range(1, 4):
            await good.send_batch(geometric_batch(seq, rng, num=150))
        await good.send_batch(geometric_batch(6, rng, num=100))  # seq 4 and 5 lost
        out_of_range = geometric_batch(7, rng, num=2)
        out_of_range.completions.output_tokens[0] = 0
        out_of_range.steps.duration_s[0] = float("nan")
        await good.send_batch(out_of_range)
        for _ in range(100):
            engines = {e.engine_id: e for e in
                       (await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest())).engines}
            if engines["engine-good"].num_completions == 551:
                break
            await asyncio.sleep(0.05)
        assert engines["engine-good"].connected and not engines["engine-bad"].connected
        assert engines["engine-good"].num_completions == 551
        assert engines["engine-good"].num_rejected_events == 2
        assert engines["engine-good"].num_sequence_gaps == 1  # one gap event (seq 4 and 5 lost)
        await operator_stub(channel).PinMode(operator_pb2.PinModeRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="engine-good"),
            mode=operator_pb2.PINNED_MODE_EB))
        pinned = await good.next_decision(where=lambda d: d.reason == "operator_pin")
        assert pinned.mode == common_pb2.MODE_EB
        # The pool estimate takes the completions in when their statistics bucket settles (≤ bucket_s +
        # settle_s later); the explain view shows the latest computation even though the pin did not change.
        for _ in range(150):
            view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-good"))
            if view.latest.diagnostics.num_samples == 551:
                break
            await asyncio.sleep(0.1)
        assert view.latest.diagnostics.num_samples == 551 and view.latest.reason == "operator_pin"
        assert view.computed_at_s >= view.decision.decided_at_s
        await good.close()


async def test_first_message_must_be_hello(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        from controlplane.api.v1 import agent_pb2_grpc

        async def messages():
            yield agent_pb2.AgentMessage(telemetry=agent_pb2.TelemetryBatch(seq=1))

        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(messages())
        with pytest.raises(grpc.aio.AioRpcError) as error:
            async for _ in call:
                pass
        assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_auth_separates_agent_and_operator_tokens(redis_url: str) -> None:
    from controlplane.service.config import SecurityConfig

    security = SecurityConfig(agent_tokens={"agent-secret-0123456789": "fleet-agents"},
                              operator_tokens={"operator-secret-0123456789": "alice"})
    async with running_controller(make_config(redis_url, security=security)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        request = operator_pb2.SetDeltaRequest(scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET),
                                               delta_s_per_token=1e-5, reason="x")
        for metadata, code in (((), grpc.StatusCode.UNAUTHENTICATED),
                               ((("authorization", "Bearer wrong-token-0123456789"),), grpc.StatusCode.UNAUTHENTICATED),
                               ((("authorization", "Bearer agent-secret-0123456789"),),
                                grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.SetDelta(request, metadata=metadata)
            assert error.value.code() == code
        client = aioredis.Redis.from_url(redis_url)
        assert await client.xlen(KEYS.audit) == 0
        assert not await client.keys(KEYS.override_pattern)
        # An agent without a token cannot connect; with its token it can.
        anonymous = await AgentStream(channel, "engine-x", POOL_A).open()
        await anonymous.finished()
        assert anonymous.error is not None and anonymous.error.code() == grpc.StatusCode.UNAUTHENTICATED
        agent = await AgentStream(channel, "engine-y", POOL_A,
                                  metadata=(("authorization", "Bearer agent-secret-0123456789"),)).open()
        assert split_version((await agent.next_decision()).version)[1] == 1
        await agent.close()
        # The operator's identity reaches the audit record.
        record = await stub.SetDelta(request, metadata=(("authorization", "Bearer operator-secret-0123456789"),))
        assert record.set_by == "alice"
        entry = (await client.xrange(KEYS.audit))[0][1]
        assert entry[b"actor"] == b"alice"
        await client.aclose()


async def test_dead_redis_keeps_deciding_refuses_overrides_and_writes_through(redis_server: EmbeddedRedis) -> None:
    async with running_controller(make_config(redis_server.url)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent, decision = await _warm_engine(channel, "engine-a", POOL_A, seed=8)
        health = health_pb2_grpc.HealthStub(channel)
        redis_server.stop()
        # Decisions still flow from memory: a pin cannot be stored, but new telemetry is still decided on.
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.SetDelta(operator_pb2.SetDeltaRequest(
                scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), delta_s_per_token=0.001))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE and "durable" in error.value.details()
        rng = np.random.default_rng(9)
        for seq in range(9, 13):
            batch = geometric_batch(seq, rng, num=250, p0=1 / 64)
            await agent.send_batch(batch)
        shifted = await agent.next_decision(where=lambda d: d.diagnostics.mu_o_tokens < 200)
        assert shifted.version > decision.version
        for _ in range(60):
            status = (await health.Check(health_pb2.HealthCheckRequest(service=""))).status
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert ctl.app.controller.num_pending_writes >= 1
        redis_server.start()
        for _ in range(80):
            status = (await health.Check(health_pb2.HealthCheckRequest(service=""))).status
            if status == health_pb2.HealthCheckResponse.SERVING and ctl.app.controller.num_pending_writes == 0:
                break
            await asyncio.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.SERVING
        client = aioredis.Redis.from_url(redis_server.url)
        stored = await _stored_decision(client, "engine-a", at_least=shifted.version)
        assert int(stored[b"version"]) >= shifted.version
        await client.aclose()
        await agent.close()


async def test_engine_preemptions_cut_the_eb_batch_size(redis_url: str) -> None:
    """The agent's cumulative preemption counter reaches the policy as preemptions since the last decision:
    under a computed EB decision they cut N (flag memory_guard); a counter that goes back (engine restart)
    counts in full."""
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        await operator_stub(channel).PutCalibration(
            operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        agent, decision = await _warm_engine(channel, "engine-a", POOL_A, seed=4)
        assert decision.mode == common_pb2.MODE_EB and decision.n == decision.diagnostics.n_star
        assert "memory_guard" not in decision.flags
        rng = np.random.default_rng(5)
        batch = geometric_batch(100, rng, num=250)
        batch.counters.num_preemptions = 40
        await agent.send_batch(batch)
        cut = await agent.next_decision(where=lambda d: "memory_guard" in d.flags)
        assert cut.n == int(0.85 * decision.n) and cut.k <= cut.n and cut.version > decision.version
        restarted = geometric_batch(101, rng, num=250)
        restarted.counters.num_preemptions = 3  # below 40: a restarted engine, 3 new preemptions
        await agent.send_batch(restarted)
        again = await agent.next_decision(where=lambda d: d.n < cut.n)
        assert again.n == int(0.85 * cut.n) and "memory_guard" in again.flags
        await agent.close()


async def test_a_calibrated_pool_at_high_occupancy_runs_eb_before_its_first_fit(redis_url: str) -> None:
    """Cold start over the wire: with the pool's calibration, an engine reporting many running requests gets EB
    (reason cold_start_eb, k and N of an EB without data) from its first batch, long before min_samples
    completions, and so does one running few under a long queue while its KV cache has room (the occupancy an
    EB batch reaches); one holding few requests stays MB; the fit takes over once the window holds
    min_samples."""
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        await operator_stub(channel).PutCalibration(
            operator_pb2.PutCalibrationRequest(calibration=_calibration(POOL_A)))
        busy, quiet = AgentStream(channel, "engine-busy", POOL_A), AgentStream(channel, "engine-quiet", POOL_A)
        queued = AgentStream(channel, "engine-queued", POOL_A)
        for agent in (busy, quiet, queued):
            await agent.open()
            first = await agent.next_decision()
            assert (first.mode, first.reason) == (common_pb2.MODE_MB, "insufficient_data")  # no occupancy yet
        rng = np.random.default_rng(11)
        await busy.send_batch(geometric_batch(1, rng, num=5, num_running=600))
        await quiet.send_batch(geometric_batch(1, rng, num=5, num_running=16, num_waiting=0))
        await queued.send_batch(geometric_batch(1, rng, num=5, num_running=16, num_waiting=900))  # KV 27% used
        cold = await busy.next_decision(where=lambda d: d.reason == "cold_start_eb")
        assert cold.mode == common_pb2.MODE_EB and cold.n == LIMITS.max_num_seqs
        assert cold.k == int(PolicyConfig().theta_min * LIMITS.max_num_seqs)
        assert cold.diagnostics.theta0 == 0.0 and cold.diagnostics.num_samples < 400
        assert cold.diagnostics.lhs_s_per_token >= cold.diagnostics.rhs_s_per_token > 0.0
        # The workload the verdict stands on travels with it (ctl explain shows it).
        point = cold.diagnostics
        assert point.cold_start_mu_o_tokens >= 1.0 and point.cold_start_mu_l_tokens >= 1.0
        assert 0.0 < point.cold_start_p0 <= 1.0
        view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-quiet"))
        assert (view.latest.mode, view.latest.reason) == (common_pb2.MODE_MB, "insufficient_data")
        assert view.latest.diagnostics.lhs_s_per_token < view.latest.diagnostics.rhs_s_per_token
        ramping = await queued.next_decision(where=lambda d: d.reason == "cold_start_eb")
        assert ramping.diagnostics.n_obs == 16 + 900  # the occupancy the verdict was taken at
        for seq in range(2, 4):
            await busy.send_batch(geometric_batch(seq, rng, num=250, num_running=600))
        fitted = await busy.next_decision(where=is_data_driven)
        assert fitted.mode == common_pb2.MODE_EB and fitted.diagnostics.theta0 > 0.0
        assert fitted.reason in ("crossover_eb", "hysteresis_hold", "cooldown_hold")
        for agent in (busy, quiet, queued):
            await agent.close()
