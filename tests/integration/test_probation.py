"""Probation with real Redis: the completions a new engine's first block held back enter the pool statistics
with their admissions when the block is judged, so the bucket they enter keeps its admissions (a bucket
without them takes the pool's window off the requests admitted since a shift)."""

from __future__ import annotations

import numpy as np

from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.core.types import PolicyConfig
from controlplane.loop.buckets import FAIR_SHARE_FACTOR, BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.ingest import validate_batch
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer, TracingSettings, create_tracer_provider
from controlplane.service.controller import Controller
from controlplane.store import create_store
from testbench.messages import validated_hello
from tests.integration.controller_harness import calibration_for, geometric_batch, make_config

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
PER_BATCH = 100


def _batch(seq: int, rng: np.random.Generator) -> agent_pb2.TelemetryBatch:
    """A batch whose completions report when each was first scheduled (0-20 s before the batch was sent)."""
    batch = geometric_batch(seq, rng, num=PER_BATCH)
    ages_s = rng.uniform(0.0, 20.0, PER_BATCH)
    batch.completions.admitted_time_s.extend((batch.sent_at_s - ages_s).tolist())
    return batch


async def test_completions_released_from_probation_keep_their_admissions(redis_url: str) -> None:
    clock = [1_000.0]
    store = create_store(redis_url, prefix="probation")
    controller = Controller(make_config(redis_url, loop=DecisionLoopConfig(recompute_completions=200, interval_s=3.0,
                                                                            ttl_s=30.0),
                                        policy=PolicyConfig(min_samples=400, cooldown_s=0.0)),
                            store=store, tracer=DecisionTracer(create_tracer_provider(TracingSettings())),
                            metrics=ControllerMetrics(), clock=lambda: clock[0])
    await controller.put_calibration(calibration_for(POOL))
    # Three engines connected (the fewest a pool judges outliers with); the third sends nothing at first.
    sessions = [await controller.open_stream(validated_hello(f"engine-{i}", POOL), identity="anonymous")
                for i in range(3)]
    rng = np.random.default_rng(5)
    seqs = [0, 0, 0]

    async def second(now_s: float, engines: tuple[int, ...]) -> None:
        clock[0] = now_s
        await controller.sync_pools(now_s)
        for i in engines:
            seqs[i] += 1
            controller.ingest(sessions[i], validate_batch(_batch(seqs[i], rng), sessions[i].hello.limits))
        controller.tick(now_s)

    for t in range(1_001, 1_011):  # 2,000 completions of the first two engines: the pool can judge now
        await second(float(t), (0, 1))
    for t in range(1_011, 1_014):  # the third engine's first block (256) is complete with its third batch
        await second(t + 0.5, (0, 1, 2))
    for t in range(1_014, 1_017):  # bucket 1,013 closes and is published
        await second(t + 0.5, (0, 1))

    key = f"{POOL.model}|{POOL.accelerator}"
    contributions = await store.get_pool_contributions(key, bucket_starts=[1_012, 1_013])
    held = BucketStats.from_bytes(next(iter(contributions[1_012].values())))
    released = BucketStats.from_bytes(next(iter(contributions[1_013].values())))
    await store.close()
    assert held.outputs.count == 2 * PER_BATCH  # the third engine's batches wait on probation...
    # ...and enter with the batch that completed the block, counted as at most the fair share of one engine
    # (FAIR_SHARE_FACTOR × the other engines' PER_BATCH), like any engine's completions in one bucket.
    assert released.outputs.count == 2 * PER_BATCH + min(3 * PER_BATCH, int(FAIR_SHARE_FACTOR * PER_BATCH))
    assert released.admitted_outputs is not None, "the released completions came without their admissions"
    assert released.admitted_outputs.count == released.outputs.count
