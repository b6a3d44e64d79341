"""The agent's link thread against a real controller: telemetry in, decisions out, ACKs, reconnects."""

from __future__ import annotations

import asyncio
import socket

import grpc

from agents.config import AgentConfig
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from tests.integration.controller_harness import LIMITS, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="tiny", accelerator="cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _until(predicate, *, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_link_streams_telemetry_acks_and_reconnects(redis_url: str) -> None:
    port = _free_port()
    config = make_config(redis_url, port=port)
    recorder = TelemetryRecorder(capacity=1024)
    received: list[common_pb2.Decision] = []

    def on_decision(decision: common_pb2.Decision, now_s: float) -> tuple[bool, str]:
        received.append(decision)
        return decision.k <= decision.n, "" if decision.k <= decision.n else "k_greater_than_n"

    agent_config = AgentConfig(controller_address=f"127.0.0.1:{port}", engine_id="engine-link", pool_model="tiny",
                               pool_accelerator="cpu", batch_interval_s=0.1)
    hello = agent_pb2.Hello(engine_id="engine-link", pool=POOL, vllm_version="0.32.0", agent_version="test",
                            limits=LIMITS)
    link = ControllerLink(agent_config, hello=hello, recorder=recorder, on_decision=on_decision, backoff_initial_s=0.05,
                          backoff_max_s=0.5)
    try:
        async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
            link.start()
            await _until(lambda: bool(received))
            decision = received[0]
            assert decision.reason == "insufficient_data"
            for i in range(5):
                recorder.record_completion(100 + i, 50 + i, 1.7e9, False)
                recorder.record_step(300, 4, 4, 0.02)
            recorder.record_completion(100, 3, 1.7e9, True)  # aborted: never enters the window
            recorder.set_gauges(1000, LIMITS.kv_capacity_tokens, 0, 4, 2, 0)
            stub = operator_stub(channel)

            async def engine() -> operator_pb2.EngineInfo:
                return (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines[0]

            info = None

            async def poll() -> None:
                nonlocal info
                while True:
                    info = await engine()
                    if info.num_completions == 5 and info.acked_version == decision.version:
                        return
                    await asyncio.sleep(0.05)

            await asyncio.wait_for(poll(), 10)
            assert info.connected and info.telemetry_age_s < 2
            # Idle engine: heartbeats keep the telemetry fresh without any recorded events.
            await asyncio.sleep(0.5)
            assert (await engine()).telemetry_age_s < 0.5
            # The callback's verdict is what the controller records as the ACK.
            assert info.acked_version == decision.version
        # The controller is gone; the link retries until it is back.
        await _until(lambda: not link.connected)
        async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
            await operator_stub(channel).PinMode(operator_pb2.PinModeRequest(
                scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), mode=operator_pb2.PINNED_MODE_EB))
            await _until(lambda: any(d.reason == "operator_pin" for d in received))
            pinned = next(d for d in received if d.reason == "operator_pin")
            assert pinned.mode == common_pb2.MODE_EB and pinned.version > decision.version
            assert link.num_reconnects >= 1
    finally:
        await asyncio.to_thread(link.stop)
