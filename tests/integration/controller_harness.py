"""Test-side helpers: a controller app on loopback with an in-memory span exporter, and a raw agent
stream client that sends exactly what a test tells it to."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.core.types import PolicyConfig
from controlplane.loop.codec import cost_model_to_calibration
from controlplane.observability.tracing import TracingSettings, create_tracer_provider
from controlplane.service.app import ControllerApp
from controlplane.service.config import ControllerConfig, DecisionLoopConfig, SecurityConfig
from controlplane.sim.profiles import RTX_PRO_6000_QWEN3_8B
from testbench.messages import LIMITS, geometric_batch

RTX_PRO_6000 = cost_model_to_calibration(RTX_PRO_6000_QWEN3_8B, common_pb2.Pool(),
                                         source="RTX PRO 6000 / Qwen3-8B (EB paper reference code)")


def make_config(redis_url: str, **overrides: object) -> ControllerConfig:
    loop = DecisionLoopConfig(recompute_completions=200, interval_s=0.3, ttl_s=30.0)
    policy = PolicyConfig(min_samples=400, cooldown_s=0.0)
    values: dict[str, object] = {"port": 0, "redis_url": redis_url, "loop": loop, "policy": policy,
                                 "store_retry_s": 0.2, "readiness_grace_s": 0.5, "security": SecurityConfig()}
    values.update(overrides)
    return ControllerConfig(**values)


@dataclass
class RunningController:
    app: ControllerApp
    spans: InMemorySpanExporter

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.app.port}"


@contextlib.asynccontextmanager
async def running_controller(config: ControllerConfig) -> AsyncIterator[RunningController]:
    spans = InMemorySpanExporter()
    provider = create_tracer_provider(TracingSettings(), exporter=spans)
    app = ControllerApp(config, tracer_provider=provider)
    await app.start()
    try:
        yield RunningController(app=app, spans=spans)
    finally:
        await app.stop(grace_s=0.5)


def operator_stub(channel: grpc.aio.Channel) -> operator_pb2_grpc.OperatorServiceStub:
    return operator_pb2_grpc.OperatorServiceStub(channel)


@dataclass
class AgentStream:
    """One engine's Connect stream driven by the test."""

    channel: grpc.aio.Channel
    engine_id: str
    pool: common_pb2.Pool
    metadata: Sequence[tuple[str, str]] = ()
    decisions: asyncio.Queue[common_pb2.Decision] = field(default_factory=asyncio.Queue)
    _outgoing: asyncio.Queue[agent_pb2.AgentMessage | None] = field(default_factory=asyncio.Queue)
    _call: grpc.aio.StreamStreamCall | None = None
    _reader: asyncio.Task[None] | None = None
    error: grpc.aio.AioRpcError | None = None

    async def _requests(self) -> AsyncIterator[agent_pb2.AgentMessage]:
        while True:
            message = await self._outgoing.get()
            if message is None:
                return
            yield message

    async def open(self, *, limits: agent_pb2.EngineLimits = LIMITS) -> AgentStream:
        stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self._call = stub.Connect(self._requests(), metadata=tuple(self.metadata))
        await self.send(agent_pb2.AgentMessage(hello=agent_pb2.Hello(
            engine_id=self.engine_id, pool=self.pool, vllm_version="0.32.0", agent_version="test",
            limits=limits)))
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self._call is not None
        try:
            async for message in self._call:
                await self.decisions.put(message.decision)
        except grpc.aio.AioRpcError as exc:
            self.error = exc

    async def send(self, message: agent_pb2.AgentMessage) -> None:
        await self._outgoing.put(message)

    async def send_batch(self, batch: agent_pb2.TelemetryBatch) -> None:
        await self.send(agent_pb2.AgentMessage(telemetry=batch))

    async def ack(self, decision: common_pb2.Decision, *, applied: bool = True, reason: str = "") -> None:
        await self.send(agent_pb2.AgentMessage(ack=agent_pb2.DecisionAck(version=decision.version, applied=applied,
                                                                         reject_reason=reason)))

    async def next_decision(self, *, timeout_s: float = 10.0, where=None) -> common_pb2.Decision:
        """The next pushed decision satisfying `where` (every decision is ACKed as it arrives)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"{self.engine_id}: no matching decision within {timeout_s} s")
            decision = await asyncio.wait_for(self.decisions.get(), remaining)
            await self.ack(decision)
            if where is None or where(decision):
                return decision

    async def close(self) -> None:
        await self._outgoing.put(None)
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._reader, 5.0)
        if self._call is not None:
            self._call.cancel()

    async def finished(self, *, timeout_s: float = 10.0) -> None:
        """Wait until the server ended the stream (error recorded in `error`)."""
        assert self._reader is not None
        await asyncio.wait_for(self._reader, timeout_s)


def calibration_for(pool: common_pb2.Pool) -> operator_pb2.Calibration:
    calibration = operator_pb2.Calibration()
    calibration.CopyFrom(RTX_PRO_6000)
    calibration.pool.CopyFrom(pool)
    return calibration


# Reasons of decisions made before the pool's fit (cold start): the MB default and the cold-start rule's EB.
COLD_START_REASONS = ("insufficient_data", "cold_start_eb")


def is_data_driven(decision: common_pb2.Decision) -> bool:
    """The decision comes from the pool's fit (past the cold start)."""
    return decision.reason not in COLD_START_REASONS


async def warm_engine(channel: grpc.aio.Channel, engine_id: str, pool: common_pb2.Pool, *, seed: int,
                       num_batches: int = 8) -> tuple[AgentStream, common_pb2.Decision]:
    """Open a stream, send geometric completions until a data-driven decision arrives."""
    agent = await AgentStream(channel, engine_id, pool).open()
    first = await agent.next_decision()
    assert first.reason == "insufficient_data" and first.mode == common_pb2.MODE_MB
    rng = np.random.default_rng(seed)
    for seq in range(1, num_batches + 1):
        await agent.send_batch(geometric_batch(seq, rng, num=250))
    decision = await agent.next_decision(where=is_data_driven)
    return agent, decision
