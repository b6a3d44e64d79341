"""A recorded fleet: a seeded telemetry stream for five engines in two pools, with a calibration put, a
workload shift, an outlier engine on probation, a δ override, a pin and its clear, and a reconnect, replayed
second by second through the controller on a fake clock (`replay`) or through the fleet state machine alone,
as the twin runs it (`replay_machine`). Each returns every decision pushed and every
change of an engine's pool membership, in order, as plain rows (the golden sequence the refactors keep).

The stream is generated from fixed seeds, so it is the same on every run; `python -m
tests.integration.fleet_replay REDIS_URL OUT.json` writes the rows (how the golden file was recorded).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass

import numpy as np

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.core.types import EngineLimits, PolicyConfig
from controlplane.loop.codec import calibration_to_cost_model
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import Effects, FleetState
from controlplane.loop.ingest import EngineHello, ValidatedBatch, validate_batch
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer, TracingSettings, create_tracer_provider
from controlplane.service.controller import Controller
from controlplane.store import create_store, pool_key
from tests.integration.controller_harness import LIMITS, calibration_for, make_config

POOL_A = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
POOL_B = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="H200")
ENGINE_LIMITS = EngineLimits(max_num_seqs=LIMITS.max_num_seqs, max_num_batched_tokens=LIMITS.max_num_batched_tokens,
                             kv_capacity_tokens=LIMITS.kv_capacity_tokens,
                             max_model_len_tokens=LIMITS.max_model_len_tokens)
START_S = 10_000.0
DURATION_S = 80
SHIFT_AT_S = 45  # pool A's output lengths: geometric of mean 128 before, 512 after
OUTLIER_JOINS_S = 15  # engine a3 (outputs 6× its pool's) connects
CALIBRATION_AT_S = 10
DELTA_AT_S = 30
PIN_AT_S, PIN_CLEARED_S = 50, 60
A2_LEAVES_S, A2_RETURNS_S = 65, 70
PER_BATCH = 60


@dataclass(frozen=True)
class Engine:
    engine_id: str
    pool: common_pb2.Pool
    output_scale: float  # its outputs' mean relative to the pool's law
    joins_s: int = 0


ENGINES = (Engine("a0", POOL_A, 1.0), Engine("a1", POOL_A, 1.0), Engine("a2", POOL_A, 1.0),
           Engine("a3", POOL_A, 6.0, OUTLIER_JOINS_S), Engine("b0", POOL_B, 1.0))


def hello_of(engine: Engine) -> EngineHello:
    return EngineHello(engine_id=engine.engine_id, model=engine.pool.model, accelerator=engine.pool.accelerator,
                       vllm_version="0.32.0", agent_version="replay", limits=ENGINE_LIMITS, block_size_tokens=16,
                       instance_id=f"{engine.engine_id}-1", instance_started_at_s=START_S)


def batch_of(engine: Engine, seq: int, t: int, rng: np.random.Generator) -> agent_pb2.TelemetryBatch:
    """One second of an engine's telemetry: completions with admissions, steps, scheduler state and the
    running requests' lengths."""
    now_s = START_S + t
    mean = (512.0 if engine.pool is POOL_A and t >= SHIFT_AT_S else 128.0) * engine.output_scale
    outputs = rng.geometric(1.0 / mean, PER_BATCH)
    prompts = rng.integers(256, 768, PER_BATCH)
    admitted = now_s - rng.uniform(0.0, 8.0, PER_BATCH)
    running = np.sort(rng.integers(1, int(2 * mean), 40))
    lengths, counts = np.unique(running, return_counts=True)
    return agent_pb2.TelemetryBatch(
        seq=seq,
        completions=agent_pb2.Completions(prompt_tokens=prompts.tolist(), output_tokens=outputs.tolist(),
                                          finish_time_s=[now_s] * PER_BATCH, aborted=[False] * PER_BATCH,
                                          admitted_time_s=admitted.tolist()),
        steps=agent_pb2.Steps(prefill_tokens=[2048, 0, 1024, 0], decode_tokens=[0, 300, 0, 320],
                              decode_requests=[0, 300, 0, 320], duration_s=[0.1, 0.05, 0.06, 0.052]),
        kv_used_tokens=400_000, kv_total_tokens=LIMITS.kv_capacity_tokens,
        scheduler=agent_pb2.SchedulerState(num_running_prefills=1, num_running_decodes=300 + seq % 7,
                                           num_waiting=20),
        counters=agent_pb2.Counters(num_preemptions=seq // 10),
        running=agent_pb2.RunningLengths(output_tokens=lengths.tolist(), num_requests=counts.tolist(),
                                         admitted_time_s=[now_s - 3.0] * len(lengths)),
        sent_at_s=now_s,
    )


def joining(t: int) -> list[Engine]:
    """The engines that connect at second t: those that join then, and a2 again when it returns."""
    return [engine for engine in ENGINES if engine.joins_s == t or (engine.engine_id == "a2" and t == A2_RETURNS_S)]


class Telemetry:
    """Every engine's seeded telemetry stream, the same in both replays: one validated batch per connected
    engine and second, numbered from 1 again after each connect."""

    def __init__(self) -> None:
        self._seqs = {engine.engine_id: 0 for engine in ENGINES}
        self._rngs = {engine.engine_id: np.random.default_rng(i + 11) for i, engine in enumerate(ENGINES)}

    def connected(self, engine_id: str) -> None:
        self._seqs[engine_id] = 0

    def next_batch(self, engine: Engine, t: int) -> ValidatedBatch:
        self._seqs[engine.engine_id] += 1
        batch = batch_of(engine, self._seqs[engine.engine_id], t, self._rngs[engine.engine_id])
        return validate_batch(batch, ENGINE_LIMITS)


def decision_row(t: int, engine_id: str, d: common_pb2.Decision) -> list:
    g = d.diagnostics
    return ["decision", t, engine_id, d.version, common_pb2.Mode.Name(d.mode), d.k, d.n, d.budget.b_max_tokens,
            d.budget.b_cap_tokens, d.delta_s_per_token, d.delta_source, d.reason, sorted(d.flags), g.p0, g.mu_o_tokens,
            g.mu_l_tokens, g.theta_star, g.n_star, g.lhs_s_per_token, g.rhs_s_per_token, g.n_obs, g.num_samples]


async def replay(redis_url: str, *, prefix: str = "replay") -> list[list]:
    """Run the recorded fleet through a controller on a fresh key prefix; the rows in order."""
    clock = [START_S]
    store = create_store(redis_url, prefix=prefix)
    controller = Controller(make_config(redis_url, loop=DecisionLoopConfig(recompute_completions=200, interval_s=2.0,
                                                                            ttl_s=30.0),
                                        policy=PolicyConfig(min_samples=400, cooldown_s=0.0)),
                            store=store, tracer=DecisionTracer(create_tracer_provider(TracingSettings())),
                            metrics=ControllerMetrics(), clock=lambda: clock[0])
    rows: list[list] = []
    sessions: dict[str, object] = {}
    telemetry = Telemetry()
    excluded = {engine.engine_id: False for engine in ENGINES}

    async def drain(t: int) -> None:
        for engine_id, session in sessions.items():
            while session.mailbox.pending():
                rows.append(decision_row(t, engine_id, await session.mailbox.get()))

    async def connect(engine: Engine, t: int) -> None:
        sessions[engine.engine_id] = await controller.open_stream(hello_of(engine), identity="replay")
        telemetry.connected(engine.engine_id)
        await drain(t)

    try:
        for engine in joining(0):
            await connect(engine, 0)
        for t in range(1, DURATION_S + 1):
            clock[0] = now_s = START_S + t
            await controller.sync_pools(now_s)
            if t == CALIBRATION_AT_S:
                await controller.put_calibration(calibration_for(POOL_A), actor="replay")
            if t == DELTA_AT_S:
                await controller.set_override(operator_pb2.OverrideRecord(
                    scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL_A),
                    kind=operator_pb2.OVERRIDE_KIND_DELTA, delta_s_per_token=2e-5, reason="replay"), actor="replay")
            if t == PIN_AT_S:
                await controller.set_override(operator_pb2.OverrideRecord(
                    scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="a1"),
                    kind=operator_pb2.OVERRIDE_KIND_PIN, mode=operator_pb2.PINNED_MODE_EB, k=16, n=128,
                    reason="replay"), actor="replay")
            if t == PIN_CLEARED_S:
                await controller.clear_override(operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="a1"),
                                                operator_pb2.OVERRIDE_KIND_PIN, actor="replay", reason="replay")
            if t == A2_LEAVES_S:
                controller.close_stream(sessions.pop("a2"))
            for engine in joining(t):
                await connect(engine, t)
            for engine in ENGINES:
                session = sessions.get(engine.engine_id)
                if session is not None:
                    controller.ingest(session, telemetry.next_batch(engine, t))
            controller.tick(now_s)
            await drain(t)
            for info in controller.engine_infos():
                if info.excluded_from_pool != excluded[info.engine_id]:
                    excluded[info.engine_id] = info.excluded_from_pool
                    rows.append(["excluded", t, info.engine_id, info.excluded_from_pool])
    finally:
        await store.close()
    return rows


def replay_machine() -> list[list]:
    """The recorded fleet through the fleet state machine alone, as the twin drives it (no store, no network),
    in the controller's order: each second the pools' due buckets close and their estimates refresh, operator
    actions, connects, batches, then the tick. Epochs count each engine's stream opens from 1, as the store's."""
    config = make_config("redis://unused", loop=DecisionLoopConfig(recompute_completions=200, interval_s=2.0,
                                                                   ttl_s=30.0),
                         policy=PolicyConfig(min_samples=400, cooldown_s=0.0))
    fleet = FleetState(config.loop, config.policy, replica_id=config.controller_id)
    rows: list[list] = []
    streams: dict[str, object] = {}
    epochs = {engine.engine_id: 0 for engine in ENGINES}
    telemetry = Telemetry()
    excluded = {engine.engine_id: False for engine in ENGINES}
    overrides: list[operator_pb2.OverrideRecord] = []

    def record(t: int, effects: Effects | None) -> None:
        for push in effects.pushes if effects is not None else ():
            if push.stream is not None:
                rows.append(decision_row(t, push.engine_id, push.decision))

    def refresh(now_s: float, only: str | None = None) -> None:
        for key in fleet.pool_keys():
            if only is None or key == only:
                fleet.close_bucket(key, now_s)
                if fleet.refresh_due(key, now_s) is not None:
                    fleet.refresh_pool(key, now_s)

    def connect(engine: Engine, t: int, now_s: float) -> None:
        stream = streams[engine.engine_id] = object()
        epochs[engine.engine_id] += 1
        telemetry.connected(engine.engine_id)
        hello = hello_of(engine)
        record(t, fleet.attach(hello, identity="replay", epoch=epochs[engine.engine_id], stream=stream, now_s=now_s))
        if fleet.pool(hello.pool_key).stats.estimate is None:
            fleet.seed_pool(hello.pool_key, None, now_s)
            refresh(now_s, only=hello.pool_key)
        record(t, fleet.first_decision(engine.engine_id, stream, now_s))

    for engine in joining(0):
        connect(engine, 0, START_S)
    for t in range(1, DURATION_S + 1):
        now_s = START_S + t
        refresh(now_s)
        if t == CALIBRATION_AT_S:
            record(t, fleet.set_calibration(pool_key(POOL_A), calibration_to_cost_model(calibration_for(POOL_A)),
                                            now_s))
        if t == DELTA_AT_S:
            overrides.append(operator_pb2.OverrideRecord(
                scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL_A),
                kind=operator_pb2.OVERRIDE_KIND_DELTA, delta_s_per_token=2e-5))
            record(t, fleet.set_overrides(overrides, now_s))
        if t == PIN_AT_S:
            pin = operator_pb2.OverrideRecord(
                scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="a1"),
                kind=operator_pb2.OVERRIDE_KIND_PIN, mode=operator_pb2.PINNED_MODE_EB, k=16, n=128)
            record(t, fleet.set_overrides([*overrides, pin], now_s))
        if t == PIN_CLEARED_S:
            record(t, fleet.set_overrides(overrides, now_s))
        if t == A2_LEAVES_S:
            record(t, fleet.detach("a2", streams.pop("a2"), now_s))
        for engine in joining(t):
            connect(engine, t, now_s)
        for engine in ENGINES:
            stream = streams.get(engine.engine_id)
            if stream is not None:
                record(t, fleet.batch(engine.engine_id, stream, telemetry.next_batch(engine, t), now_s))
        record(t, fleet.tick(now_s))
        for engine_id, held in sorted(fleet.engines()):
            if held.loop.excluded_from_pool != excluded[engine_id]:
                excluded[engine_id] = held.loop.excluded_from_pool
                rows.append(["excluded", t, engine_id, held.loop.excluded_from_pool])
    return rows


if __name__ == "__main__":
    result = asyncio.run(replay(sys.argv[1]))
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(result, out, indent=None, separators=(",", ":"))
        out.write("\n")
    print(f"{len(result)} rows")
