"""The agent's latency stamps on a real vLLM CPU engine agree with vLLM's own request metrics: the pool's TTFT and
TPOT medians the controller measures from the agent's stamps (GetDecision.outcomes, sketches of 1% relative
error) are within 10% (or 20 ms) of the medians of vLLM's `RequestOutput.metrics` for the same requests."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import operator_pb2, operator_pb2_grpc
from tests.e2e.conftest import start_engine
from tests.integration.controller_harness import make_config, running_controller

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

NUM_REQUESTS = 120


def _agrees(measured_s: float, reference_s: float) -> bool:
    return abs(measured_s - reference_s) <= max(0.10 * reference_s, 0.020)


async def test_the_agents_ttft_and_tpot_agree_with_vllms_request_metrics(tiny_model: Path, tmp_path: Path,
                                                                         redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        engine = await start_engine(tiny_model, tmp_path / "latency", "--address", ctl.address, "--engine-id",
                                    "latency", "--log-stats", "--max-num-seqs", "8", "--num-requests",
                                    str(NUM_REQUESTS), "--prompt-tokens", "100,400", "--output-tokens", "8,40",
                                    "--batch-interval-s", "0.2")
        await engine.wait_ready()
        engine.go()
        result = await engine.finish()
        assert result["all_exact"] and result["num_with_stats"] == NUM_REQUESTS
        outcomes = None
        for _ in range(100):  # the last buckets close and settle
            outcomes = (await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="latency"))).outcomes
            if outcomes.ttft.num_requests >= NUM_REQUESTS:
                break
            await asyncio.sleep(0.1)
    assert outcomes is not None and outcomes.ttft.num_requests == NUM_REQUESTS, outcomes
    print(f"TTFT p50 agent {outcomes.ttft.p50_s:.4f} s, vLLM {result['ttft_median_s']:.4f} s; TPOT p50 agent "
          f"{outcomes.tpot.p50_s:.5f} s, vLLM {result['tpot_median_s']:.5f} s")
    assert outcomes.queue.num_requests == NUM_REQUESTS
    assert _agrees(outcomes.ttft.p50_s, result["ttft_median_s"]), (outcomes.ttft, result["ttft_median_s"])
    assert _agrees(outcomes.tpot.p50_s, result["tpot_median_s"]), (outcomes.tpot, result["tpot_median_s"])
