"""Pool-statistics buckets another replica wrote in a format this replica cannot read (a newer release in a
rolling upgrade, or a corrupt write), on real Redis: they are left out of the pool's statistics, counted
once each in cp_pool_buckets_unreadable_total, warned about once per replica, and the readable buckets of
the same exchange still enter the estimate."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2
from controlplane.core.cost_sums import CostSums
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.types import PolicyConfig
from controlplane.loop.buckets import BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer, TracingSettings, create_tracer_provider
from controlplane.service.controller import Controller
from controlplane.store import create_store
from testbench.messages import validated_hello
from tests.integration.controller_harness import make_config

MODEL, ACCELERATOR = "Qwen/Qwen3-8B", "H200"
KEY = f"{MODEL}|{ACCELERATOR}"
PREFIX = "formats"


async def test_buckets_of_an_unknown_format_are_counted_once_and_warned_about_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    clock = [2_000.0]
    store = create_store(redis_url, prefix=PREFIX)
    other = create_store(redis_url, prefix=PREFIX)  # the other replicas' writes
    metrics = ControllerMetrics()
    controller = Controller(make_config(redis_url, loop=DecisionLoopConfig(recompute_completions=200, interval_s=3.0,
                                                                            ttl_s=30.0),
                                        policy=PolicyConfig(min_samples=400, cooldown_s=0.0)),
                            store=store, tracer=DecisionTracer(create_tracer_provider(TracingSettings())),
                            metrics=metrics, clock=lambda: clock[0])
    await controller.open_stream(validated_hello("engine-0", common_pb2.Pool(model=MODEL, accelerator=ACCELERATOR)),
                                 identity="anonymous")
    rng = np.random.default_rng(3)
    readable = 0
    unreadable_ids: set[tuple[int, str]] = set()
    try:
        with caplog.at_level(logging.DEBUG, logger="controlplane.service.controller"):
            for second in range(2_001, 2_013):
                bucket = second - 2  # closed and settled on every replica by the next sync
                outputs = rng.geometric(1 / 256, 100)
                good = BucketStats(outputs=LengthHistogram.from_samples(outputs), prompt_count=100,
                                   prompt_sum_tokens=51_200.0, costs=CostSums())
                await other.put_pool_contribution(KEY, bucket_start_s=bucket, replica_id="older",
                                                  payload=good.to_bytes(), ttl_s=120.0)
                readable += 100
                for replica in ("newer-a", "newer-b"):
                    await other.put_pool_contribution(KEY, bucket_start_s=bucket, replica_id=replica,
                                                      payload=b"CPB9" + bytes(64), ttl_s=120.0)
                    unreadable_ids.add((bucket, replica))
                clock[0] = float(second)
                await controller.sync_pools(clock[0])
            clock[0] = 2_014.0
            await controller.sync_pools(clock[0])
    finally:
        await store.close()
        await other.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "ignoring bucket" in r.getMessage()]
    assert sorted(r.getMessage().split("replica ")[1].split(":")[0] for r in warnings) == ["newer-a", "newer-b"]
    assert "not a pool-statistics bucket" in warnings[0].getMessage()
    # each unreadable bucket once, although the exchange re-reads the recent buckets every second
    read = {(bucket, replica) for bucket, replica in unreadable_ids if bucket <= 2_014 - 2}
    assert metrics.registry.get_sample_value("cp_pool_buckets_unreadable_total", {"pool": KEY}) == len(read)
    estimate = controller.fleet.pool(KEY).stats.estimate
    assert estimate is not None and estimate.num_samples == readable
