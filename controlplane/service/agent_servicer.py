"""AgentService.Connect: one bidirectional stream per engine (thin: decode, call the controller, encode).

Event-driven: a reader task feeds the controller as messages arrive (a due decision is computed and put
in the stream's mailbox right there); the response side only waits on the mailbox. Nothing polls.

Deadlines: the Hello must arrive within HELLO_TIMEOUT_S of the stream's opening (streams waiting for it are
`cp_streams_awaiting_hello`); a stream that then sends nothing for STREAM_IDLE_TIMEOUT_S (the agent's idle
heartbeat is an empty batch every batch interval, at most 60 s) is closed by the controller's tick.

Support (Hello.support, what the agent's probe of vLLM found): streams are counted by pool and level in
`cp_engines_by_support`. An engine whose verdict is stock runs stock vLLM and applies nothing: the controller
decides for it as for any engine (the decision is stored and shown: what it would run), but the response side
sends it no decision, so none is NACKed or counted as rejected. Its empty batches keep the stream open.

Every rejection ends the stream with a status naming the field and is counted by cause
(`cp_rejections_total{cause}`): hello_timeout, too_many_awaiting_hello (a peer address with
MAX_AWAITING_HELLO_PER_PEER streams already waiting), no_hello, bad_hello, refused (identity/fencing),
malformed, oversize, second_hello, unknown_message, undecodable, idle_timeout. Error messages echo at most a
bounded prefix of bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from controlplane.api.v1 import agent_pb2, agent_pb2_grpc
from controlplane.loop.ingest import TelemetryError, validate_batch, validate_hello
from controlplane.observability.metrics import ControllerMetrics
from controlplane.protocol import STEPS_METADATA
from controlplane.service.auth import AGENT_PREFIX, Authenticator
from controlplane.service.controller import Controller
from controlplane.service.sessions import Session, StreamRefusedError

logger = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 5.0
# Streams of one peer address that may wait for their Hello at once: a fleet restarting behind one NAT opens
# hundreds at a time; a client opening streams and sending nothing is refused past this.
MAX_AWAITING_HELLO_PER_PEER = 1024
# Internals of a stock engine named in its connection's log line at most.
_NAMES_LOGGED = 8


def peer_host(peer: str) -> str:
    """The address part of a gRPC peer ("ipv4:10.0.0.7:52114" → "ipv4:10.0.0.7"; unix sockets as they are)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, controller: Controller, metrics: ControllerMetrics, authenticator: Authenticator) -> None:
        self._controller = controller
        self._metrics = metrics
        self._auth = authenticator
        self._awaiting: dict[str, int] = {}  # per peer address: its streams waiting for their Hello

    async def _reject(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, cause: str,
                      message: str) -> None:
        self._metrics.rejections.labels(cause=cause).inc()
        self._controller.note_stream_churn()  # a flood of refused streams is memory to hand back once it ends
        await context.abort(code, message)

    async def Connect(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[agent_pb2.ControllerMessage]:
        peer = peer_host(context.peer())
        if self._awaiting.get(peer, 0) >= MAX_AWAITING_HELLO_PER_PEER:
            await self._reject(context, grpc.StatusCode.RESOURCE_EXHAUSTED, "too_many_awaiting_hello",
                               f"{MAX_AWAITING_HELLO_PER_PEER} streams from this address are already waiting to "
                               f"send their Hello")
        awaiting = self._metrics.streams_awaiting_hello
        awaiting.inc()
        self._awaiting[peer] = self._awaiting.get(peer, 0) + 1
        try:
            first = await asyncio.wait_for(anext(aiter(request_iterator)), timeout=HELLO_TIMEOUT_S)
        except StopAsyncIteration:
            return
        except TimeoutError:
            await self._reject(context, grpc.StatusCode.DEADLINE_EXCEEDED, "hello_timeout",
                               f"no Hello within {HELLO_TIMEOUT_S:.0f} s of the stream's opening")
        except Exception as exc:
            await self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, "undecodable",
                               f"the first message could not be decoded: {type(exc).__name__}")
        finally:
            awaiting.dec()
            left = self._awaiting[peer] - 1
            if left:
                self._awaiting[peer] = left
            else:
                del self._awaiting[peer]
        if not first.HasField("hello"):
            await self._reject(context, grpc.StatusCode.FAILED_PRECONDITION, "no_hello",
                               "the first message must be a Hello")
        try:
            hello = validate_hello(first.hello)
        except TelemetryError as exc:
            await self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, exc.cause, str(exc))
        identity = self._auth.identity(context, AGENT_PREFIX)
        try:
            session = await self._controller.open_stream(hello, identity=identity)
        except StreamRefusedError as exc:
            await self._reject(context, exc.code, "refused", str(exc))
        failure: list[TelemetryError] = []
        reader = asyncio.create_task(self._read(session, request_iterator, failure))
        support = hello.support
        level = support.level if support is not None else "unreported"
        self._metrics.count_support(hello.pool_key, level, +1)
        logger.info("engine %s connected (pool %s, instance %s, vLLM %s %s)", hello.engine_id, hello.pool_key,
                    hello.instance_id or "-", hello.vllm_version or "-", level)
        # A stock engine applies no decision: its decisions are made, kept and shown like any engine's, but not
        # sent (never NACKed, never counted as rejected).
        stock = support is not None and support.stock
        if stock:
            named = ", ".join(support.missing[:_NAMES_LOGGED]) + (", …" if len(support.missing) > _NAMES_LOGGED else "")
            logger.warning("engine %s runs stock vLLM %s: its agent's probe found %s missing or changed; its "
                           "decisions are not sent", hello.engine_id, hello.vllm_version or "-", named or "internals")
        try:
            await context.send_initial_metadata((STEPS_METADATA,))  # this controller reads packed steps
            while True:
                decision = await session.mailbox.get()
                if decision is None:
                    break
                if not stock:
                    yield agent_pb2.ControllerMessage(decision=decision)
            if failure:
                exc = failure[0]
                self._metrics.batches.labels(result="rejected").inc()
                await self._reject(context, grpc.StatusCode.INVALID_ARGUMENT, exc.cause, str(exc))
            closed = session.mailbox.closed
            if closed is not None and closed[0] is not None:
                await context.abort(closed[0], closed[1])
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            self._controller.close_stream(session)
            self._metrics.count_support(hello.pool_key, level, -1)
            logger.info("engine %s disconnected", hello.engine_id)

    async def _read(self, session: Session, messages: AsyncIterator[agent_pb2.AgentMessage],
                    failure: list[TelemetryError]) -> None:
        limits = session.hello.limits
        try:
            async for message in messages:
                session.last_message_s = self._controller.now_s()
                kind = message.WhichOneof("kind")
                if kind == "telemetry":
                    self._controller.ingest(session, validate_batch(message.telemetry, limits))
                elif kind == "ack":
                    ack = message.ack
                    self._controller.ack(session, version=ack.version, applied=ack.applied,
                                         reason=ack.reject_reason)
                elif kind == "hello":
                    raise TelemetryError("hello", "sent twice on one stream", cause="second_hello")
                else:
                    raise TelemetryError("message", "empty or unknown message kind", cause="unknown_message")
        except TelemetryError as exc:
            failure.append(exc)
        except grpc.aio.AioRpcError:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failure.append(TelemetryError("message", f"could not be decoded: {type(exc).__name__}",
                                          cause="undecodable"))
        finally:
            if session.mailbox.closed is None:
                session.mailbox.close(None, "")
