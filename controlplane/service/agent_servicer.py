"""AgentService.Connect: one bidirectional stream per engine (thin: decode, call the controller, encode)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from controlplane.api.v1 import agent_pb2, agent_pb2_grpc
from controlplane.observability.metrics import ControllerMetrics
from controlplane.service.controller import Controller
from controlplane.service.ingest import TelemetryError, validate_batch, validate_hello

logger = logging.getLogger(__name__)
_TICK_S = 0.25


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, controller: Controller, metrics: ControllerMetrics) -> None:
        self._controller = controller
        self._metrics = metrics

    async def Connect(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        if not first.HasField("hello"):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a Hello")
        try:
            hello = validate_hello(first.hello)
        except TelemetryError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        engine_id = hello.engine_id
        outbox = self._controller.connect(hello)
        failure: list[TelemetryError] = []
        reader = asyncio.create_task(self._read(engine_id, request_iterator, outbox, failure))
        logger.info("engine %s connected (pool %s)", engine_id, hello.pool_key)
        try:
            await self._controller.decide_engine(engine_id, force_push=True)
            while True:
                try:
                    decision = await asyncio.wait_for(outbox.get(), timeout=_TICK_S)
                except TimeoutError:
                    if self._controller.decision_due(engine_id):
                        await self._controller.decide_engine(engine_id)
                    continue
                if decision is None:  # the reader ended
                    break
                yield agent_pb2.ControllerMessage(decision=decision)
            if failure:
                self._metrics.batches.labels(result="rejected").inc()
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(failure[0]))
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._controller.disconnect(engine_id, outbox)
            logger.info("engine %s disconnected", engine_id)

    async def _read(self, engine_id: str, messages: AsyncIterator[agent_pb2.AgentMessage],
                    outbox: asyncio.Queue, failure: list[TelemetryError]) -> None:
        try:
            async for message in messages:
                kind = message.WhichOneof("kind")
                if kind == "telemetry":
                    batch = validate_batch(message.telemetry)
                    self._controller.ingest(engine_id, batch)
                    if self._controller.decision_due(engine_id):
                        await self._controller.decide_engine(engine_id)
                elif kind == "ack":
                    ack = message.ack
                    self._controller.record_ack(engine_id, version=ack.version, applied=ack.applied)
                    if not ack.applied:
                        logger.warning("engine %s rejected decision %d: %s", engine_id, ack.version,
                                       ack.reject_reason)
                elif kind == "hello":
                    raise TelemetryError("hello", "sent twice on one stream")
        except TelemetryError as exc:
            failure.append(exc)
        except grpc.aio.AioRpcError:
            pass
        finally:
            outbox.put_nowait(None)
