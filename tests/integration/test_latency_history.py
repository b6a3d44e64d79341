"""The controllers record each pool's latency view every latency_history_interval_s and answer it with
ListLatencyHistory, against two real controller replicas on one real Redis fed by engines that stamp their
requests: one sample per slot however many replicas sample the pool, the quantiles of what was sent (within the
sketch's 1%), read back in range and after a restart; bad requests are refused by name; and `ctl report` draws
the recorded samples on its latency timelines."""

from __future__ import annotations

import asyncio
import sys
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.config import DecisionLoopConfig
from controlplane.store import create_store, pool_key
from testbench.messages import stamped_batch
from tests.integration.controller_harness import AgentStream, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
INTERVAL_S = 1.0


def _config(redis_url: str, controller_id: str):
    loop = DecisionLoopConfig(recompute_completions=200, interval_s=0.3, ttl_s=30.0,
                              latency_history_interval_s=INTERVAL_S)
    return make_config(redis_url, controller_id=controller_id, loop=loop)


def _exact(values: np.ndarray, quantile: float) -> float:
    return float(np.sort(values)[int(np.floor(quantile * (values.size - 1)))])


async def _history(stub, **fields: object) -> list[operator_pb2.LatencySample]:
    reply = await stub.ListLatencyHistory(operator_pb2.ListLatencyHistoryRequest(pool=POOL, **fields))
    return list(reply.samples)


async def _sample_of(stub, num_requests: int) -> operator_pb2.LatencySample:
    """The first recorded sample whose window holds num_requests TTFTs (waits for it)."""
    for _ in range(150):
        found = [s for s in await _history(stub) if s.outcomes.ttft.num_requests == num_requests]
        if found:
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no sample with {num_requests} TTFTs: {await _history(stub)}")


class RecordedDom(HTMLParser):
    """The latency markers of the report's TTFT chart: (source, at_s, p99_s)."""

    def __init__(self) -> None:
        super().__init__()
        self.markers: list[tuple[str, float, float]] = []
        self._ttft = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        v = {k: value or "" for k, value in attrs}
        if tag == "svg":
            self._ttft = "latency" in v.get("class", "").split() and v.get("data-kind") == "ttft"
        elif self._ttft and tag == "circle" and "sample" in v.get("class", "").split():
            self.markers.append((v["data-source"], float(v["data-at-s"]), float(v["data-p99-s"])))


async def test_each_pools_latencies_are_recorded_once_per_slot_and_read_back(redis_url: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    sent: list[np.ndarray] = []
    async with running_controller(_config(redis_url, "replica-a")) as ctl_a, \
            running_controller(_config(redis_url, "replica-b")) as ctl_b, \
            grpc.aio.insecure_channel(ctl_a.address) as channel_a, \
            grpc.aio.insecure_channel(ctl_b.address) as channel_b:
        stub_a, stub_b = operator_stub(channel_a), operator_stub(channel_b)
        agents = [await AgentStream(channel_a, "engine-a", POOL).open(),
                  await AgentStream(channel_b, "engine-b", POOL).open()]
        for agent in agents:
            await agent.next_decision()

        async def send_phase(first_seq: int, median_ttft_s: float) -> None:
            for seq in range(first_seq, first_seq + 2):
                for agent in agents:
                    batch, ttft, _ = stamped_batch(seq, rng, num=150, median_ttft_s=median_ttft_s)
                    sent.append(ttft)
                    await agent.send_batch(batch)

        await send_phase(1, median_ttft_s=0.3)
        first = await _sample_of(stub_a, 600)  # both replicas' engines in one window
        await send_phase(3, median_ttft_s=1.5)
        second = await _sample_of(stub_a, 1200)
        for sample, values in ((first, np.concatenate(sent[:4])), (second, np.concatenate(sent))):
            assert sample.outcomes.window_s == 60.0
            for quantile, field in ((0.5, "p50_s"), (0.9, "p90_s"), (0.99, "p99_s")):
                assert getattr(sample.outcomes.ttft, field) == pytest.approx(_exact(values, quantile), rel=0.0101)
        assert second.outcomes.ttft.p99_s > first.outcomes.ttft.p99_s
        for agent in agents:
            await agent.close()

        # One sample per slot, though both replicas sample the pool; each replica reads the same record.
        everything = await _history(stub_a)
        times = [s.at_s for s in everything]
        assert times == sorted(set(times)) and all(t % INTERVAL_S == 0 for t in times), times
        assert len(everything) >= 2 and first.at_s < second.at_s
        # (the replicas go on recording while the pool's window holds latencies: reads stop at the newest read)
        newest_s = everything[-1].at_s
        assert await _history(stub_b, until_s=newest_s) == everything
        # A range, inclusive at both ends, and the newest `limit` of it.
        assert await _history(stub_b, since_s=first.at_s, until_s=second.at_s) == [
            s for s in everything if first.at_s <= s.at_s <= second.at_s]
        assert await _history(stub_b, until_s=newest_s, limit=1) == everything[-1:]
        assert await stub_a.ListLatencyHistory(operator_pb2.ListLatencyHistoryRequest(
            pool=common_pb2.Pool(model="m", accelerator="nobody"))) == operator_pb2.ListLatencyHistoryResponse()

        for request, words in (
                (operator_pb2.ListLatencyHistoryRequest(), "pool: required"),
                (operator_pb2.ListLatencyHistoryRequest(pool=POOL, since_s=5.0, until_s=4.0), "is after until_s"),
                (operator_pb2.ListLatencyHistoryRequest(pool=POOL, since_s=float("nan")), "since_s must be finite"),
                (operator_pb2.ListLatencyHistoryRequest(pool=POOL, until_s=-1.0), "until_s must be finite"),
                (operator_pb2.ListLatencyHistoryRequest(pool=POOL, limit=10_001), "limit must be ≤ 10000")):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub_a.ListLatencyHistory(request)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in caught.value.details()

        # A sample that does not parse (another version's, or damaged) is left out; the others are answered.
        async with create_store(redis_url) as store:
            future_s = int(everything[-1].at_s) + 3600
            assert await store.put_latency_sample(pool_key(POOL), slot_ms=future_s * 1000, payload=b"\xff\xff\xff",
                                                  max_samples=100, ttl_s=60.0)
        assert await _history(stub_a, until_s=future_s + 1.0) == await _history(stub_a, until_s=future_s - 1.0)
        assert everything[-1] in await _history(stub_a, until_s=future_s + 1.0)

        # `ctl report` draws the recorded samples beside those it reads (none read: no engine is left).
        out = tmp_path / "report.html"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controlplane", "ctl", "--address", ctl_b.address, "report", "--out", str(out),
            "--latency-history-s", "600", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        dom = RecordedDom()
        dom.feed(out.read_text(encoding="utf-8"))
        recorded = {at_s: p99_s for source, at_s, p99_s in dom.markers if source == "recorded"}
        assert recorded and max(recorded) >= newest_s
        record = {s.at_s: s.outcomes.ttft.p99_s for s in await _history(stub_b, until_s=max(recorded))
                  if s.outcomes.HasField("ttft")}
    assert recorded == record and first.at_s in recorded and second.at_s in recorded

    # The record outlives the replicas.
    async with running_controller(_config(redis_url, "replica-c")) as ctl_c, \
            grpc.aio.insecure_channel(ctl_c.address) as channel_c:
        kept = await _history(operator_stub(channel_c), until_s=newest_s)
    assert kept == everything
