"""Trust no input: what one agent (or one slow operator client) sends must never break the controller for
the others. A real controller over real gRPC on loopback, a real redis-server.

- sequence numbers at the extremes (1, 2^64−1, 1, 10) are three gap events, and listing keeps working;
- engines disconnected longer than engine_ttl_s are forgotten, with their metric series; past
  max_disconnected_engines, an identity's longest-disconnected engines are forgotten at once;
- an ACK of a version never sent is not stored and is counted;
- values beyond an engine's own Hello limits are dropped and counted and never move its pool's estimate;
  pool names and engine ids that break the contract are refused at Hello with a bounded message; an
  engine whose output lengths are an outlier against its pool is kept out of the pool's statistics;
- every kind of bad stream gets its status code and is counted under its cause;
- a WatchDecisions client that never reads cannot hold up agent streams (its events are dropped, counted);
- GetDecision shows the latest computation even when the instruction did not change;
- readiness is NOT_SERVING from the start while the store has never answered.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.loop.ingest import MAX_BATCH_EVENTS, MAX_RUNNING_BINS
from controlplane.protocol import UINT32_MAX, UINT64_MAX, split_version
from controlplane.service.app import SERVICE_NAMES
from controlplane.service.config import DecisionLoopConfig, SecurityConfig
from controlplane.service.memory import TRIM_QUIET_S
from controlplane.store.embedded import EmbeddedRedis
from testbench.fuzz_messages import CAUSES, LiveAgent, huge_batch
from testbench.net import free_port
from tests.integration.controller_harness import LIMITS, geometric_batch, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")


def _hello(engine_id: str, *, pool: common_pb2.Pool = POOL, instance_id: str = "",
           started_at_s: float = 0.0) -> agent_pb2.Hello:
    return agent_pb2.Hello(engine_id=engine_id, pool=pool, vllm_version="0.32.0", agent_version="test", limits=LIMITS,
                           instance_id=instance_id, instance_started_at_s=started_at_s)


def _sample(ctl, name: str, labels: dict[str, str] | None = None) -> float:
    return ctl.app.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def _series_with(ctl, label: str, value: str) -> list[str]:
    """Names of every metric sample carrying label=value."""
    return [sample.name for family in ctl.app.metrics.registry.collect() for sample in family.samples
            if sample.labels.get(label) == value]


async def _engines(channel: grpc.aio.Channel, *, metadata: tuple[tuple[str, str], ...] = (),
                   **request: object) -> dict[str, operator_pb2.EngineInfo]:
    response = await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest(**request),
                                                        metadata=metadata)
    return {e.engine_id: e for e in response.engines}


async def _until(predicate, *, timeout_s: float = 10.0, every_s: float = 0.05):
    """Poll an async predicate until it returns a truthy value (returned) or time runs out (the last value)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(every_s)


def _config(redis_url: str, **loop: float):
    values = {"recompute_completions": 200, "interval_s": 0.3, "ttl_s": 30.0, **loop}
    return make_config(redis_url, loop=DecisionLoopConfig(**values))


# ---- 2. sequence numbers ----


async def test_sequence_numbers_at_the_extremes_are_three_gap_events(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        other = await LiveAgent(channel, _hello("engine-other")).open()
        agent = await LiveAgent(channel, _hello("engine-seq")).open()
        await agent.decision()
        rng = np.random.default_rng(1)
        for seq in (1, UINT64_MAX, 1, 10):
            await agent.send_batch(geometric_batch(seq, rng, num=5))

        async def ingested():
            engines = await _engines(channel)
            return engines if engines["engine-seq"].num_completions == 20 else None

        engines = await _until(ingested)
        assert engines, "the four batches were not all ingested"
        assert engines["engine-seq"].num_sequence_gaps == 3
        assert _sample(ctl, "cp_telemetry_sequence_gaps_total") == 3
        # Listing, filtering and explaining keep working for everyone.
        assert set(await _engines(channel, pool=POOL)) == {"engine-other", "engine-seq"}
        view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-seq"))
        assert view.engine_id == "engine-seq" and not agent.ended and not other.ended
        await agent.close()
        await other.close()


# ---- 3. eviction ----


async def test_engines_gone_longer_than_engine_ttl_are_forgotten_with_their_metrics(redis_url: str) -> None:
    engine_ttl_s = 1.0
    async with running_controller(_config(redis_url, engine_ttl_s=engine_ttl_s)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        stays = await LiveAgent(channel, _hello("engine-stays")).open()
        gone = await LiveAgent(channel, _hello("engine-gone")).open()
        await stays.decision()
        await gone.decision()
        await gone.send_batch(geometric_batch(1, np.random.default_rng(2), num=10))

        async def all_series():
            names = set(_series_with(ctl, "engine_id", "engine-gone"))
            wanted = {"cp_engine_decision_epoch", "cp_engine_decision_sequence", "cp_engine_acked_sequence",
                      "cp_engine_telemetry_age_seconds"}
            return names if wanted <= names else None

        assert await _until(all_series), _series_with(ctl, "engine_id", "engine-gone")
        await gone.close()
        loop = asyncio.get_running_loop()
        closed_s = loop.time()
        assert not (await _engines(channel))["engine-gone"].connected

        async def evicted():
            return "engine-gone" not in await _engines(channel)

        assert await _until(evicted, timeout_s=engine_ttl_s + 5.0)
        assert loop.time() - closed_s >= engine_ttl_s * 0.9
        assert _series_with(ctl, "engine_id", "engine-gone") == []
        assert "cp_engine_decision_sequence" in _series_with(ctl, "engine_id", "engine-stays")
        assert (await _engines(channel))["engine-stays"].connected
        await stays.close()


async def test_an_identity_past_max_disconnected_engines_loses_its_own_oldest_and_no_one_elses(
        redis_url: str) -> None:
    """A client cycling through engine ids makes the controller hold one record per id for engine_ttl_s;
    max_disconnected_engines bounds that per agent identity: past it, that identity's longest-disconnected
    engine is forgotten at once (counted as reason "capacity"); a reconnected engine leaves the queue, and
    another identity's disconnected engines stay."""
    security = SecurityConfig(agent_tokens={"agent-a-token-0123456789": "team-a",
                                            "agent-b-token-0123456789": "team-b"},
                              operator_tokens={"operator-token-0123456789": "alice"})
    config = make_config(redis_url, security=security,
                         loop=DecisionLoopConfig(recompute_completions=200, interval_s=0.3, ttl_s=30.0,
                                                 engine_ttl_s=300.0, max_disconnected_engines=3))
    team_a = (("authorization", "Bearer agent-a-token-0123456789"),)
    team_b = (("authorization", "Bearer agent-b-token-0123456789"),)
    operator = (("authorization", "Bearer operator-token-0123456789"),)
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:

        async def connect(engine_id: str, metadata) -> LiveAgent:
            agent = await LiveAgent(channel, _hello(engine_id), metadata=metadata).open()
            await agent.decision()
            return agent

        async def cycle(engine_id: str, metadata) -> None:
            """Connect, then leave; return once the controller has seen the stream end."""
            await (await connect(engine_id, metadata)).close()

            async def gone_or_disconnected():
                engine = (await _engines(channel, metadata=operator)).get(engine_id)
                return engine is None or not engine.connected

            assert await _until(gone_or_disconnected)

        await cycle("b-0", team_b)
        for i in range(6):
            await cycle(f"a-{i}", team_a)
        known = await _engines(channel, metadata=operator)
        assert set(known) == {"b-0", "a-3", "a-4", "a-5"}, sorted(known)
        assert not any(e.connected for e in known.values())
        assert _sample(ctl, "cp_engines_evicted_total", {"reason": "capacity"}) == 3
        assert _sample(ctl, "cp_engines_evicted_total", {"reason": "ttl"}) == 0
        assert _series_with(ctl, "engine_id", "a-0") == []

        # a-3 comes back: it is off the queue, so the next two departures push out a-4, not it.
        back = await connect("a-3", team_a)
        await cycle("a-6", team_a)
        await cycle("a-7", team_a)
        known = await _engines(channel, metadata=operator)
        assert set(known) == {"b-0", "a-3", "a-5", "a-6", "a-7"}, sorted(known)
        assert known["a-3"].connected and back.received and not back.ended
        await back.close()

        async def a5_forgotten():
            return set(await _engines(channel, metadata=operator)) == {"b-0", "a-3", "a-6", "a-7"}

        assert await _until(a5_forgotten), sorted(await _engines(channel, metadata=operator))
        assert _sample(ctl, "cp_engines_evicted_total", {"reason": "capacity"}) == 5


class _Cycle:
    """An object that refers to itself: only the cyclic garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_the_end_of_an_eviction_wave_collects_cycles_and_returns_memory(redis_url: str) -> None:
    """Streams that end leave reference cycles (exceptions holding their handlers' frames); the controller spaces
    out the collector's full passes, so once evictions stop for TRIM_QUIET_S it runs one, then trims the heap.
    The collector's automatic passes are off here: only the controller's collection can free the cycle."""
    engine_ttl_s = 0.5
    async with running_controller(_config(redis_url, engine_ttl_s=engine_ttl_s)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        gone = await LiveAgent(channel, _hello("engine-gone")).open()
        await gone.decision()
        gc.collect()
        gc.disable()
        try:
            cycle = weakref.ref(_Cycle())
            assert cycle() is not None
            await gone.close()

            async def evicted():
                return "engine-gone" not in await _engines(channel)

            assert await _until(evicted, timeout_s=engine_ttl_s + 5.0)
            evicted_s = asyncio.get_running_loop().time()

            async def collected():
                return cycle() is None

            assert await _until(collected, timeout_s=TRIM_QUIET_S + 3.0)
            assert asyncio.get_running_loop().time() - evicted_s >= TRIM_QUIET_S - 1.0
        finally:
            gc.enable()


async def test_pools_left_by_evicted_engines_are_forgotten(redis_url: str) -> None:
    """Every Hello may name a new pool: once all of a pool's engines are evicted its series go too, or a
    stream of made-up pool names grows the controller's memory and /metrics without bound."""
    async with running_controller(_config(redis_url, engine_ttl_s=0.5)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        pools = [common_pb2.Pool(model=f"made-up-{i}", accelerator="X") for i in range(20)]
        for i, pool in enumerate(pools):
            agent = await LiveAgent(channel, _hello(f"transient-{i}", pool=pool)).open()
            await agent.decision()
            await agent.send_batch(geometric_batch(1, np.random.default_rng(i), num=5))
            await agent.close()

        async def engines_evicted():
            return not any(e.startswith("transient-") for e in await _engines(channel))

        assert await _until(engines_evicted, timeout_s=10.0)
        await asyncio.sleep(2.0)  # a pool estimate refresh or two after the evictions
        left = {pool.model: names for pool in pools if (names := _series_with(ctl, "pool", f"{pool.model}|X"))}
        assert not left, (f"{len(left)} of {len(pools)} pools whose engines were all evicted still have series, "
                          f"e.g. {next(iter(left.items()))}")


async def test_a_pool_an_engine_moved_away_from_is_forgotten(redis_url: str) -> None:
    """An engine that comes back under another pool leaves its old pool here; when it was the old pool's only
    engine, that pool and its series go at once (and the new pool's once the engine is evicted)."""
    async with running_controller(_config(redis_url, engine_ttl_s=0.5)) as ctl, \
            grpc.aio.insecure_channel(ctl.address) as channel:
        old = common_pb2.Pool(model="moved-from", accelerator="X")
        new = common_pb2.Pool(model="moved-to", accelerator="X")
        for pool in (old, new):
            agent = await LiveAgent(channel, _hello("engine-mover", pool=pool)).open()
            await agent.decision()
            await agent.send_batch(geometric_batch(1, np.random.default_rng(3), num=5))

            async def pool_series(pool=pool):
                return _series_with(ctl, "pool", f"{pool.model}|X")

            assert await _until(pool_series)
            await agent.close()
        assert _series_with(ctl, "pool", "moved-from|X") == []

        async def all_gone():
            return "engine-mover" not in await _engines(channel) and not _series_with(ctl, "pool", "moved-to|X")

        assert await _until(all_gone, timeout_s=10.0), _series_with(ctl, "pool", "moved-to|X")


async def test_connected_engines_counts_each_engine_once_through_a_takeover_into_another_pool(redis_url: str) -> None:
    """cp_connected_engines follows connects, a takeover by a newer stream that moves the engine to another
    pool (one engine, not two, and not zero) and the close."""
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        registry = ctl.app.metrics.registry

        def connected() -> float | None:
            return registry.get_sample_value("cp_connected_engines")

        pool_a, pool_b = (common_pb2.Pool(model=model, accelerator="X") for model in ("a", "b"))
        first = await LiveAgent(channel, _hello("engine-gauge", pool=pool_a, instance_id="i-1",
                                                started_at_s=100.0)).open()
        await first.decision()
        other = await LiveAgent(channel, _hello("engine-other")).open()
        await other.decision()
        assert connected() == 2
        newer = await LiveAgent(channel, _hello("engine-gauge", pool=pool_b, instance_id="i-2",
                                                started_at_s=200.0)).open()
        await newer.decision()
        assert connected() == 2
        await newer.close()
        await other.close()

        async def none_left():
            return connected() == 0

        assert await _until(none_left), connected()
        await first.close()
        assert connected() == 0


# ---- 4. fake ACKs ----


async def test_acks_of_versions_never_sent_are_ignored_and_counted(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await LiveAgent(channel, _hello("engine-ack"), auto_ack=False).open()
        decision = await agent.decision()
        await agent.send(agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(version=decision.version, applied=True)))

        async def acked():
            return (await _engines(channel))["engine-ack"].acked_version == decision.version

        assert await _until(acked)
        unknown_before = _sample(ctl, "cp_decision_acks_total", {"result": "unknown_version"})
        fakes = (UINT64_MAX, decision.version + 1, decision.version - 1, 1)
        for version in fakes:
            await agent.send(agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(version=version, applied=True)))

        async def counted():
            return _sample(ctl, "cp_decision_acks_total", {"result": "unknown_version"}) - unknown_before == len(fakes)

        assert await _until(counted)
        assert (await _engines(channel))["engine-ack"].acked_version == decision.version
        labels = {"engine_id": "engine-ack", "pool": f"{POOL.model}|{POOL.accelerator}"}
        assert _sample(ctl, "cp_engine_acked_sequence", labels) == split_version(decision.version)[1]
        assert _sample(ctl, "cp_engine_decision_sequence", labels) == split_version(decision.version)[1]
        assert _sample(ctl, "cp_engine_decision_epoch", labels) == split_version(decision.version)[0]
        # Every column the decision sets is under its own name (they are written as one slice of a row).
        assert (_sample(ctl, "cp_engine_k", labels), _sample(ctl, "cp_engine_n", labels)) == (decision.k, decision.n)
        assert _sample(ctl, "cp_engine_budget_max_tokens", labels) == decision.budget.b_max_tokens
        assert _sample(ctl, "cp_engine_budget_cap_tokens", labels) == decision.budget.b_cap_tokens
        assert _sample(ctl, "cp_engine_delta_s_per_token", labels) == decision.delta_s_per_token
        view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-ack"))
        assert view.acked_version == decision.version
        assert not agent.ended
        await agent.close()


# ---- 5. pool poisoning ----


async def _warm_pool(channel, engine_ids: list[str], *, batches: int, num: int = 100) -> list[LiveAgent]:
    agents = []
    for i, engine_id in enumerate(engine_ids):
        agent = await LiveAgent(channel, _hello(engine_id)).open()
        await agent.decision()
        rng = np.random.default_rng(10 + i)
        for seq in range(1, batches + 1):
            await agent.send_batch(geometric_batch(seq, rng, num=num))
        agents.append(agent)
    return agents


async def _settled_view(channel, engine_id: str, *, num_samples: int, timeout_s: float = 15.0):
    """The engine's explain view once its latest computation uses exactly num_samples completions."""
    async def settled():
        view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
        return view if view.latest.diagnostics.num_samples == num_samples else None

    view = await _until(settled, timeout_s=timeout_s, every_s=0.1)
    assert view is not None, f"{engine_id}: the pool estimate never settled at {num_samples} samples"
    return view


async def test_values_beyond_an_engines_own_limits_never_move_its_pool(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        good = await _warm_pool(channel, ["good-0", "good-1", "good-2"], batches=3)
        before = await _settled_view(channel, "good-0", num_samples=900)
        assert before.latest.diagnostics.mu_o_tokens > 0 and before.latest.diagnostics.p0 > 0
        poisoner = await LiveAgent(channel, _hello("poisoner")).open()
        await poisoner.decision()
        num = 200
        too_long_outputs = agent_pb2.TelemetryBatch(
            seq=1, completions=agent_pb2.Completions(prompt_tokens=[300] * num, output_tokens=[UINT32_MAX] * num,
                                                     finish_time_s=[1.7e9] * num, aborted=[False] * num))
        too_long_prompts = agent_pb2.TelemetryBatch(
            seq=2, completions=agent_pb2.Completions(prompt_tokens=[LIMITS.max_model_len_tokens + 1] * num,
                                                     output_tokens=[20] * num, finish_time_s=[1.7e9] * num,
                                                     aborted=[False] * num))
        too_large_steps = agent_pb2.TelemetryBatch(
            seq=3, steps=agent_pb2.Steps(prefill_tokens=[LIMITS.max_num_batched_tokens + 1] * num,
                                         decode_tokens=[0] * num, decode_requests=[0] * num, duration_s=[5.0] * num))
        too_many_requests = agent_pb2.TelemetryBatch(
            seq=4, steps=agent_pb2.Steps(prefill_tokens=[0] * num, decode_tokens=[LIMITS.max_num_seqs + 1] * num,
                                         decode_requests=[LIMITS.max_num_seqs + 1] * num, duration_s=[5.0] * num))
        for batch in (too_long_outputs, too_long_prompts, too_large_steps, too_many_requests):
            await poisoner.send_batch(batch)

        async def dropped():
            info = (await _engines(channel))["poisoner"]
            return info if info.num_rejected_events == 4 * num else None

        info = await _until(dropped)
        assert info, (await _engines(channel))["poisoner"]
        assert info.num_completions == 0
        await asyncio.sleep(2.0)  # two statistics buckets close and settle after the poison
        after = await _settled_view(channel, "good-0", num_samples=900)
        assert after.computed_at_s > before.computed_at_s + 1.5
        for term in ("mu_o_tokens", "p0", "eta", "mu_l_tokens", "lhs_s_per_token", "rhs_s_per_token"):
            assert getattr(after.latest.diagnostics, term) == getattr(before.latest.diagnostics, term), term
        for agent in (*good, poisoner):
            assert not agent.ended
            await agent.close()


@pytest.mark.parametrize(("field", "hello"), [
    ("hello.pool.model", _hello("e-1", pool=common_pb2.Pool(model="m" * 102_400, accelerator="X"))),
    ("hello.pool.model", _hello("e-2", pool=common_pb2.Pool(model="Qwen\x00Qwen3-8B", accelerator="X"))),
    ("hello.pool.accelerator", _hello("e-3", pool=common_pb2.Pool(model="Qwen", accelerator="H200\x00"))),
    ("hello.engine_id", _hello("e" * 10_240)),
], ids=["model_100kb", "model_nul", "accelerator_nul", "engine_id_10kb"])
async def test_bad_names_are_refused_at_hello_with_a_bounded_message(redis_url: str, field: str,
                                                                     hello: agent_pb2.Hello) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await LiveAgent(channel, hello).open()
        assert await agent.finished() == grpc.StatusCode.INVALID_ARGUMENT
        assert agent.details.startswith(field) and len(agent.details) <= 200, agent.details
        assert _sample(ctl, "cp_rejections_total", {"cause": "bad_hello"}) == 1
        assert await _engines(channel) == {}


async def test_an_outlier_engine_is_kept_out_of_its_pool(redis_url: str) -> None:
    """Three engines send geometric outputs of mean ~256; a fourth sends 30,000-token outputs in batches of
    100 (an agent's usual batch): it is excluded, and the pool's μ_O seen by the others never moves by more
    than 15% — its first completions included."""
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        good = await _warm_pool(channel, ["good-0", "good-1", "good-2"], batches=4)
        before = (await _settled_view(channel, "good-0", num_samples=1200)).latest.diagnostics.mu_o_tokens
        assert 200 < before < 320
        outlier = await LiveAgent(channel, _hello("outlier")).open()
        await outlier.decision()
        pool_label = {"pool": f"{POOL.model}|{POOL.accelerator}"}
        seen: list[float] = []
        num = 100
        for seq in range(1, 9):
            await outlier.send_batch(agent_pb2.TelemetryBatch(
                seq=seq, completions=agent_pb2.Completions(prompt_tokens=[300] * num, output_tokens=[30_000] * num,
                                                           finish_time_s=[1.7e9] * num, aborted=[False] * num)))
            await asyncio.sleep(0.4)
            view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="good-0"))
            seen.append(view.latest.diagnostics.mu_o_tokens)

        async def excluded():
            return (await _engines(channel))["outlier"].excluded_from_pool

        assert await _until(excluded), "the outlier was never excluded"
        assert _sample(ctl, "cp_pool_excluded_engines", pool_label) == 1
        await asyncio.sleep(2.0)  # buckets close and settle
        view = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="outlier"))
        assert "engine_excluded_from_pool" in view.latest.flags
        final = await operator_stub(channel).GetDecision(operator_pb2.GetDecisionRequest(engine_id="good-0"))
        seen.append(final.latest.diagnostics.mu_o_tokens)
        worst = max(seen, key=lambda mu: abs(mu - before))
        assert abs(worst - before) <= 0.15 * before, (
            f"pool μ_O moved from {before:.0f} to {worst:.0f} tokens while the outlier streamed (seen {seen})")
        for agent in (*good, outlier):
            await agent.close()


# ---- 6. rejections by cause ----


def _batch_bytes(batch: agent_pb2.TelemetryBatch) -> bytes:
    return agent_pb2.AgentMessage(telemetry=batch).SerializeToString()


async def test_every_kind_of_bad_stream_gets_its_status_and_its_cause(redis_url: str) -> None:
    hello = agent_pb2.AgentMessage(hello=_hello("engine-x"))
    unequal = geometric_batch(1, np.random.default_rng(3), num=10)
    del unequal.completions.output_tokens[3:]
    running = agent_pb2.TelemetryBatch(seq=1, running=agent_pb2.RunningLengths(
        output_tokens=[1] * (MAX_RUNNING_BINS + 1), num_requests=[1] * (MAX_RUNNING_BINS + 1)))
    cases = [
        # (cause, code, first message (None: the Hello), the messages after it, a word the status must name)
        ("no_hello", grpc.StatusCode.FAILED_PRECONDITION, _batch_bytes(geometric_batch(1, np.random.default_rng(4),
                                                                                       num=3)), [], "Hello"),
        ("no_hello", grpc.StatusCode.FAILED_PRECONDITION, agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(version=1)),
         [], "Hello"),
        ("bad_hello", grpc.StatusCode.INVALID_ARGUMENT, agent_pb2.AgentMessage(hello=_hello("")), [],
         "hello.engine_id"),
        ("bad_hello", grpc.StatusCode.INVALID_ARGUMENT,
         agent_pb2.AgentMessage(hello=agent_pb2.Hello(engine_id="e", pool=POOL)), [], "hello.limits"),
        ("refused", grpc.StatusCode.ALREADY_EXISTS,
         agent_pb2.AgentMessage(hello=_hello("holder", instance_id="older", started_at_s=1.0)), [], "holder"),
        ("malformed", grpc.StatusCode.INVALID_ARGUMENT, None, [_batch_bytes(unequal)], "telemetry.completions"),
        ("malformed", grpc.StatusCode.INVALID_ARGUMENT, None,
         [_batch_bytes(agent_pb2.TelemetryBatch(seq=1, kv_used_tokens=2, kv_total_tokens=1))], "kv_used_tokens"),
        ("malformed", grpc.StatusCode.INVALID_ARGUMENT, None, [_batch_bytes(agent_pb2.TelemetryBatch(seq=0))],
         "telemetry.seq"),
        ("oversize", grpc.StatusCode.INVALID_ARGUMENT, None, [_batch_bytes(running)], "telemetry.running"),
        ("oversize", grpc.StatusCode.INVALID_ARGUMENT, None,
         [_batch_bytes(huge_batch(seq=1, num_events=MAX_BATCH_EVENTS + 1))], "telemetry.completions"),
        ("second_hello", grpc.StatusCode.INVALID_ARGUMENT, None, [hello.SerializeToString()], "hello"),
        ("unknown_message", grpc.StatusCode.INVALID_ARGUMENT, None, [b""], "message"),
        ("unknown_message", grpc.StatusCode.INVALID_ARGUMENT, None, [b"\xf8\x07\x01"], "message"),  # field 127
        ("undecodable", grpc.StatusCode.INVALID_ARGUMENT, b"\xff\xff\xff", [], "decoded"),
        ("undecodable", grpc.StatusCode.INVALID_ARGUMENT, None, [b"\x12\x05ab"], "decoded"),
    ]
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        holder = await LiveAgent(channel, _hello("holder", instance_id="newer", started_at_s=2.0)).open()
        await holder.decision()
        for index, (cause, code, first, after, word) in enumerate(cases):
            before = {c: _sample(ctl, "cp_rejections_total", {"cause": c}) for c in CAUSES}
            agent = LiveAgent(channel, _hello(f"engine-{index}"))
            await agent.open(first=first)
            if first is None:
                await agent.decision()  # accepted: the next message is the bad one
            for message in after:
                await agent.send(message)
            got = await agent.finished()
            counted = {c: _sample(ctl, "cp_rejections_total", {"cause": c}) - before[c] for c in CAUSES}
            assert (got, cause) == (code, cause), (index, agent.details)
            assert word in agent.details and len(agent.details) <= 300, (index, agent.details)
            assert counted == {c: float(c == cause) for c in CAUSES}, (index, counted)
            await agent.close()
        assert not holder.ended
        await holder.close()


# ---- 7. slow watchers ----


async def test_a_watcher_that_never_reads_cannot_hold_up_agent_streams(redis_url: str) -> None:
    num_engines, num_changes = 100, 160  # 16,000 new decisions, plus keep-alives
    config = _config(redis_url, ttl_s=3.0)
    # The sleeper's channel keeps HTTP/2's initial 64 KB window (no BDP probing, which would let grpc's client
    # buffer megabytes of unread views first): the server's writes to it block after ~100 views.
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel, \
            grpc.aio.insecure_channel(ctl.address, options=[("grpc.http2.bdp_probe", 0)]) as watcher_channel:
        stub = operator_stub(channel)
        sleeper = operator_stub(watcher_channel).WatchDecisions(operator_pb2.WatchDecisionsRequest())
        agents = [await LiveAgent(channel, _hello(f"engine-{i:03d}")).open() for i in range(num_engines)]
        for agent in agents:
            await agent.decision()
        streaming = agents[0]
        stop = asyncio.Event()
        num_sent = 0

        async def stream_telemetry() -> None:
            nonlocal num_sent
            rng = np.random.default_rng(5)
            while not stop.is_set():
                num_sent += 1
                await streaming.send_batch(geometric_batch(num_sent, rng, num=10))
                await asyncio.sleep(0.1)

        telemetry = asyncio.create_task(stream_telemetry())
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        delta = 0.0
        for change in range(num_changes):
            delta = 1e-6 * (change + 1)
            await stub.SetDelta(operator_pb2.SetDeltaRequest(
                scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), delta_s_per_token=delta, reason="storm"))
        for agent in agents:
            await agent.decision(where=lambda d, delta=delta: d.delta_s_per_token == pytest.approx(delta),
                                 timeout_s=10.0)
        ended_s = loop.time()
        stop.set()
        await telemetry
        # At most the watcher queue (10,000) and the ~64 KB the sleeper's channel buffers were delivered.
        dropped = _sample(ctl, "cp_watch_events_dropped_total")
        assert dropped >= num_engines * num_changes - 10_000 - 1_000, dropped
        engines = await _engines(channel)
        assert all(engines[a.engine_id].connected and not a.ended for a in agents)

        async def all_ingested():
            return (await _engines(channel))[streaming.engine_id].num_completions == 10 * num_sent

        assert num_sent >= 5 and await _until(all_ingested), (num_sent, engines[streaming.engine_id])
        # Keep-alives are due every keepalive_s (1 s); what an engine needs is that no gap reaches its decision's
        # TTL (3 s here), past which its agent would fall back to stock vLLM. A watcher holding the loop up stalls
        # the pushes for as long as it does not read (seconds: the agents' decisions time out at 10 s). At a TTL of
        # 1.5 s (keep-alives every 0.5 s) the largest gap was 0.13-0.18 s alone, 1.11 s with the other test worker
        # on the second core and 1.95 s with a third CPU-bound process beside both.
        gap_s = max(a.max_gap_s(since=started_s, until=ended_s) for a in agents)
        assert gap_s < config.loop.ttl_s, gap_s
        sleeper.cancel()
        for agent in agents:
            await agent.close()


# ---- 8. the latest computation ----


async def test_get_decision_shows_the_latest_computation_when_nothing_changed(redis_url: str) -> None:
    async with running_controller(_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await LiveAgent(channel, _hello("engine-latest")).open()
        first = await agent.decision()
        assert first.reason == "insufficient_data"
        stub = operator_stub(channel)
        initial = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="engine-latest"))
        rng = np.random.default_rng(6)
        for seq in range(1, 4):
            await agent.send_batch(geometric_batch(seq, rng, num=50))  # 150 < min_samples: still cold start
        view = await _settled_view(channel, "engine-latest", num_samples=150)
        assert view.decision.version == first.version and view.latest.version == first.version
        assert view.latest.reason == "insufficient_data" and view.latest.diagnostics.mu_o_tokens > 0
        assert view.computed_at_s > initial.computed_at_s and view.computed_at_s > view.decision.decided_at_s
        assert initial.latest.diagnostics.num_samples == 0
        assert [d.version for _, d in agent.received] == [first.version] * len(agent.received)
        await agent.close()


# ---- 9. readiness ----


async def test_not_serving_from_the_start_until_the_store_has_answered(tmp_path: Path) -> None:
    port = free_port()
    config = make_config(f"redis://127.0.0.1:{port}", store_retry_s=0.2, readiness_grace_s=0.5)
    redis = EmbeddedRedis(tmp_path / "redis", tcp_port=port)
    try:
        async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(10):
                for service in ("", *SERVICE_NAMES):
                    status = (await health.Check(health_pb2.HealthCheckRequest(service=service))).status
                    assert status == health_pb2.HealthCheckResponse.NOT_SERVING, service
                await asyncio.sleep(0.1)
            assert _sample(ctl, "cp_ready") == 0
            redis.start()

            async def serving():
                response = await health.Check(health_pb2.HealthCheckRequest(service=""))
                return response.status == health_pb2.HealthCheckResponse.SERVING

            assert await _until(serving, timeout_s=10.0)
            assert _sample(ctl, "cp_ready") == 1
    finally:
        redis.stop()
