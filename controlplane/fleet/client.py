"""The AgentService client of one fake engine: stream telemetry, apply decisions, acknowledge them.

`FleetEngineClient` drives a `FakeEngine` and speaks the agent's side of AgentService.Connect over a real
grpc.aio channel: Hello first, then a TelemetryBatch every `batch_interval_s` of simulated engine time
(seq 1, 2, ... per stream), and a DecisionAck for every Decision received, after applying it at the next
engine step boundary.

Time: with `speed` set, the engine is paced against the wall clock (`speed` simulated seconds per wall
second) and keeps running while disconnected, as a real engine would; with `speed=None` it runs as fast as
the event loop allows and pauses while disconnected. Completion finish times are mapped linearly from the
batch's simulated span onto the wall-clock span since the previous batch (never in the future); step
durations stay simulated.

Failure behaviour: any stream failure (controller down or restarted, the stream ended, a write refused)
closes the channel and reconnects after an exponential backoff with jitter; each new stream starts with
Hello and seq 1. Telemetry drained into a batch whose write failed is counted in num_events_dropped.

Fail-static, then fail-safe: the decision in force is kept while disconnected until its ttl_s runs out,
counted from the loss of the stream (the outage ends only when a new stream has carried a batch); then
the engine falls back to stock behaviour (PASSTHROUGH: all slots, start-up budget). While a stream is up
the decision never expires: the controller pushes decisions only when they change. A decision with
ttl_s ≤ 0 never expires. Decisions received but not yet applied when a stream fails are dropped (the
controller resends on the next stream); on a graceful finish pending ones are applied and acknowledged.

It must not block the event loop for long: the engine is advanced in slices of at most one batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import grpc

from controlplane.api.v1 import agent_pb2_grpc, common_pb2
from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.messages import (
    AGENT_VERSION,
    SimToWallHistory,
    ack_message,
    check_engine_id,
    hello_message,
    telemetry_message,
)
from controlplane.protocol import reads_packed_steps

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-8B"
DEFAULT_ACCELERATOR = "NVIDIA H200"
# Errors that end one stream and lead to a reconnect (anything else propagates).
_STREAM_ERRORS = (grpc.RpcError, asyncio.InvalidStateError, OSError)


class StreamEndedError(Exception):
    """The controller closed the stream (EOF) while the client still wanted it."""


@dataclass(frozen=True, slots=True)
class ClientCounters:
    """Cumulative counts of one client (all streams together)."""

    num_batches_sent: int = 0
    num_decisions_received: int = 0
    num_decisions_applied: int = 0
    num_decisions_rejected: int = 0
    num_decisions_expired: int = 0
    num_reconnects: int = 0
    num_stream_failures: int = 0
    num_lag_resets: int = 0


class FleetEngineClient:
    """One fake engine connected to a controller. Run it with `await client.run()`; stop with `stop()`."""

    def __init__(
        self,
        address: str,
        *,
        engine: FakeEngine,
        engine_id: str,
        model: str = DEFAULT_MODEL,
        accelerator: str = DEFAULT_ACCELERATOR,
        agent_version: str = AGENT_VERSION,
        batch_interval_s: float = 1.0,
        speed: float | None = None,
        max_batches: int | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        channel_credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, object]] = (),
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        tick_s: float = 0.05,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """
        Args:
            address: controller target, e.g. "127.0.0.1:50051".
            engine: the fake engine this client owns and drives.
            engine_id: unique id, [A-Za-z0-9._:-]{1,128}.
            model, accelerator: the pool the engine belongs to.
            batch_interval_s: simulated engine seconds per TelemetryBatch.
            speed: simulated seconds per wall second (e.g. 50 for a demo); None = as fast as possible.
            max_batches: stop after sending this many batches in all (None = until stopped).
            metadata: call metadata, e.g. (("authorization", "Bearer <token>"),).
            channel_credentials: TLS credentials (grpc.ssl_channel_credentials(...)); None = plaintext.
            channel_options: extra grpc channel options.
            backoff_initial_s, backoff_max_s: reconnect delay min(max, initial·2^failures), times a
                jitter factor uniform in [0.5, 1.5), capped at backoff_max_s.
            tick_s: wall seconds between pacing slices (paced mode) and between TTL checks.
            seed: seeds the backoff jitter.
            clock: monotonic seconds (pacing, TTL); wall_clock: seconds since the Unix epoch.

        Raises:
            ValueError: on a malformed engine id or a non-positive interval, speed, backoff or tick.
        """
        check_engine_id(engine_id)
        for name, value in (("batch_interval_s", batch_interval_s), ("backoff_initial_s", backoff_initial_s),
                            ("backoff_max_s", backoff_max_s), ("tick_s", tick_s)):
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"{name} must be finite and > 0, got {value}")
        if speed is not None and not (math.isfinite(speed) and speed > 0.0):
            raise ValueError(f"speed must be finite and > 0 (or None), got {speed}")
        if max_batches is not None and max_batches < 1:
            raise ValueError(f"max_batches must be ≥ 1 (or None), got {max_batches}")
        self._address = address
        self._engine = engine
        self._engine_id = engine_id
        self._model = model
        self._accelerator = accelerator
        self._agent_version = agent_version
        self._batch_interval_s = float(batch_interval_s)
        self._speed = speed
        self._max_batches = max_batches
        self._metadata = tuple(metadata)
        self._credentials = channel_credentials
        self._channel_options = tuple(channel_options)
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._tick_s = tick_s
        self._rng = random.Random(seed)
        self._clock = clock
        self._wall_clock = wall_clock

        self._counters = ClientCounters()
        self._stop_requested = False
        self._wake = asyncio.Event()
        self._inbox: deque[common_pb2.Decision] = deque()
        self._latest_decision: common_pb2.Decision | None = None
        self._in_force: common_pb2.Decision | None = None
        self._connected = False
        self._disconnected_at: float | None = None
        self._num_events_lost = 0
        self._seq = 0
        self._packed_steps = False
        self._stream_batches = 0
        # Pacing: engine time sim_origin_s corresponds to clock() == wall_origin_s.
        self._sim_origin_s = 0.0
        self._wall_origin_s = 0.0
        self._next_flush_sim_s = 0.0
        # The simulated-to-wall map of the times a batch carries: one anchor per flush.
        self._to_wall = SimToWallHistory(0.0, 0.0)

    # ------------------------------------------------------------------------------------ observers

    @property
    def engine(self) -> FakeEngine:
        return self._engine

    @property
    def engine_id(self) -> str:
        return self._engine_id

    @property
    def model(self) -> str:
        return self._model

    @property
    def accelerator(self) -> str:
        return self._accelerator

    @property
    def counters(self) -> ClientCounters:
        """A snapshot of the cumulative counters."""
        return self._counters

    @property
    def latest_decision(self) -> common_pb2.Decision | None:
        """The last Decision received (applied or not); None before the first. Do not mutate it."""
        return self._latest_decision

    @property
    def decision_in_force(self) -> common_pb2.Decision | None:
        """The applied Decision the engine runs under; None when stock (never applied, or expired)."""
        return self._in_force

    @property
    def connected(self) -> bool:
        """True between a successful Hello write and the end of that stream."""
        return self._connected

    @property
    def finished(self) -> bool:
        """Stop was requested, or max_batches batches were sent."""
        return self._stop_requested or (
            self._max_batches is not None and self._counters.num_batches_sent >= self._max_batches
        )

    # ------------------------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask `run()` to finish: it half-closes the stream, closes the channel and returns."""
        self._stop_requested = True
        self._wake.set()

    async def run(self) -> None:
        """Stream until `finished`, reconnecting on failures. Safe to cancel (the channel is closed)."""
        self._start_pacing()
        num_failures = 0
        first = True
        while not self.finished:
            if not first:
                self._count(num_reconnects=1)
            first = False
            self._stream_batches = 0
            try:
                await self._stream_once()
            except (*_STREAM_ERRORS, StreamEndedError) as exc:
                self._count(num_stream_failures=1)
                num_failures = 0 if self._stream_batches else num_failures + 1
                delay_s = self._backoff_s(num_failures)
                # One warning per outage; the retries that follow are logged at INFO.
                level = logging.WARNING if self._disconnected_at is None else logging.INFO
                logger.log(level, "engine %s: stream to %s failed (%s); reconnecting in %.2f s",
                           self._engine_id, self._address, _describe(exc), delay_s)
                if self._disconnected_at is None:
                    self._disconnected_at = self._clock()
                await self._wait_disconnected(delay_s)
        logger.info("engine %s: finished after %s batches", self._engine_id, self._counters.num_batches_sent)

    # ------------------------------------------------------------------------------------ streaming

    def _make_channel(self) -> grpc.aio.Channel:
        if self._credentials is not None:
            return grpc.aio.secure_channel(self._address, self._credentials, options=self._channel_options)
        return grpc.aio.insecure_channel(self._address, options=self._channel_options)

    async def _stream_once(self) -> None:
        """One stream: Hello, then telemetry/acks until finished. Raises on any stream failure."""
        channel = self._make_channel()
        call = None
        reader: asyncio.Task[None] | None = None
        try:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.Connect(metadata=self._metadata or None)
            await call.write(hello_message(
                engine_id=self._engine_id, model=self._model, accelerator=self._accelerator,
                shape=self._engine.shape, agent_version=self._agent_version,
            ))
            self._connected = True
            self._packed_steps = False  # until the controller's initial metadata says it reads them
            self._seq = 0
            self._inbox.clear()
            if self._speed is None:
                self._next_flush_sim_s = self._engine.now_s + self._batch_interval_s
            reader = asyncio.create_task(self._read_decisions(call))
            logger.info("engine %s: connected to %s", self._engine_id, self._address)
            while not self.finished:
                if reader.done():
                    reader.result()  # raises the stream's error, or StreamEndedError
                await self._apply_inbox(call)
                await self._advance(call)
            await self._apply_inbox(call)
            await call.done_writing()
            with contextlib.suppress(TimeoutError, StreamEndedError, *_STREAM_ERRORS):
                await asyncio.wait_for(asyncio.shield(reader), timeout=1.0)
        finally:
            self._connected = False
            if self._inbox:
                logger.info("engine %s: %s decisions not applied (stream ended)", self._engine_id, len(self._inbox))
                self._inbox.clear()
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, StreamEndedError, *_STREAM_ERRORS):
                    await reader
            if call is not None:
                call.cancel()
            await channel.close(grace=None)

    async def _read_decisions(self, call: grpc.aio.StreamStreamCall) -> None:
        self._packed_steps = reads_packed_steps(await call.initial_metadata())
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                raise StreamEndedError("the controller closed the stream")
            if message.HasField("decision"):
                self._count(num_decisions_received=1)
                self._latest_decision = message.decision
                self._inbox.append(message.decision)
                self._wake.set()

    async def _apply_inbox(self, call: grpc.aio.StreamStreamCall) -> None:
        """Apply queued decisions now (a step boundary) and acknowledge each."""
        while self._inbox:
            decision = self._inbox.popleft()
            applied, reason = self._engine.apply(decision)
            if applied:
                self._in_force = decision
                self._count(num_decisions_applied=1)
            else:
                self._count(num_decisions_rejected=1)
                logger.info("engine %s: decision %s rejected: %s", self._engine_id, decision.version, reason)
            await call.write(ack_message(version=decision.version, applied=applied, reject_reason=reason))

    async def _advance(self, call: grpc.aio.StreamStreamCall) -> None:
        """Advance the engine one slice and send every batch that came due."""
        engine = self._engine
        if self._speed is None:
            engine.run_until(self._next_flush_sim_s)
            if engine.now_s >= self._next_flush_sim_s or engine.is_idle:
                await self._flush(call)
                self._next_flush_sim_s = max(self._next_flush_sim_s, engine.now_s) + self._batch_interval_s
            await self._sleep(self._tick_s if engine.is_idle else 0.0)
            return
        target_s = self._paced_target_s(self._speed)
        while not self.finished:
            engine.run_until(min(target_s, self._next_flush_sim_s))
            if target_s < self._next_flush_sim_s:
                break
            await self._flush(call)
            self._next_flush_sim_s += self._batch_interval_s
            if self._inbox:
                await self._apply_inbox(call)
        await self._sleep(self._tick_s)

    async def _flush(self, call: grpc.aio.StreamStreamCall) -> None:
        telemetry = self._engine.drain()
        wall_now = self._wall_clock()
        self._to_wall.add(telemetry.now_s, wall_now)
        telemetry = replace(telemetry, num_events_dropped=telemetry.num_events_dropped + self._num_events_lost)
        self._seq += 1
        message = telemetry_message(telemetry, seq=self._seq, to_wall_s=self._to_wall, sent_at_s=wall_now,
                                    packed=self._packed_steps)
        try:
            await call.write(message)
        except BaseException:
            self._num_events_lost += len(telemetry.step_duration_s) + len(telemetry.completion_finish_s)
            raise
        self._stream_batches += 1
        self._disconnected_at = None  # a batch went through: the outage (if any) is over
        self._count(num_batches_sent=1)

    # ------------------------------------------------------------------------------------ time

    def _start_pacing(self) -> None:
        now_s = self._engine.now_s
        self._sim_origin_s = now_s
        self._wall_origin_s = self._clock()
        self._next_flush_sim_s = now_s + self._batch_interval_s
        self._to_wall = SimToWallHistory(now_s, self._wall_clock())

    def _paced_target_s(self, speed: float) -> float:
        """Engine time due now; a backlog beyond a few batches is forgiven (logged, counted)."""
        target_s = self._sim_origin_s + (self._clock() - self._wall_origin_s) * speed
        max_lag_s = max(4.0 * self._batch_interval_s, 10.0 * self._tick_s * speed)
        excess_s = target_s - self._engine.now_s - max_lag_s
        if excess_s > 0.0:
            self._wall_origin_s += excess_s / speed
            target_s -= excess_s
            self._count(num_lag_resets=1)
            logger.warning("engine %s: simulation fell %.1f simulated seconds behind real time; skipped",
                           self._engine_id, excess_s)
        return target_s

    async def _wait_disconnected(self, delay_s: float) -> None:
        """Wait out a reconnect delay: a paced engine keeps running; the decision TTL is enforced."""
        deadline = self._clock() + delay_s
        while not self._stop_requested:
            self._expire_decision()
            if self._speed is not None:
                target_s = self._paced_target_s(self._speed)
                self._engine.run_until(target_s)
                # Batches fall due while disconnected; their data stays buffered in the engine.
                while self._next_flush_sim_s <= target_s:
                    self._next_flush_sim_s += self._batch_interval_s
            remaining_s = deadline - self._clock()
            if remaining_s <= 0.0:
                return
            await self._sleep(min(self._tick_s, remaining_s))

    def _expire_decision(self) -> None:
        decision = self._in_force
        if decision is None or self._disconnected_at is None or decision.ttl_s <= 0.0:
            return
        if self._clock() - self._disconnected_at >= decision.ttl_s:
            self._engine.reset_to_stock()
            self._in_force = None
            self._count(num_decisions_expired=1)
            logger.warning("engine %s: decision %s expired after %.1f s disconnected; stock behaviour",
                           self._engine_id, decision.version, decision.ttl_s)

    def _backoff_s(self, num_failures: int) -> float:
        base_s = min(self._backoff_max_s, self._backoff_initial_s * (2.0 ** min(num_failures, 30)))
        return min(self._backoff_max_s, base_s * (0.5 + self._rng.random()))

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, waking early on a decision or a stop request."""
        if seconds <= 0.0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        self._wake.clear()

    def _count(self, **increments: int) -> None:
        counters = self._counters
        self._counters = replace(counters, **{k: getattr(counters, k) + v for k, v in increments.items()})


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
