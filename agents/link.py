"""The agent's link to the controller: a background thread holding one AgentService.Connect stream.

It sends Hello, then a TelemetryBatch every batch interval (an empty one is the idle heartbeat: an idle
engine runs no scheduler code, so the link never depends on engine steps). Each Decision received is
handed to the `on_decision` callback in this thread (the runtime validates it and holds it for the next
step boundary under a short lock) and ACKed at once with the callback's verdict, so an idle engine
still answers. Nothing here ever blocks the scheduler thread.

Reconnects: a failed stream is retried after a delay that doubles from `backoff_initial_s` up to
`backoff_max_s` (default 0.1 s → 1 s), each wait drawn uniformly in [delay/2, delay] (jitter, so a fleet
does not reconnect in lockstep after a controller restart). The cap keeps the agent back on the controller's
decision within about a second of the controller being reachable again; a refused connection costs the
controller nothing.

Logging an outage (`OutageLog`): an outage begins when a stream fails or ends and lasts until a decision is
received again. Its first failure is one WARNING (the cause and the real wait), and so is the first failure
of each other cause during it (an instance refused by fencing, say); the other attempts are DEBUG, with a
WARNING reminder at most every `outage_reminder_s` (60 s) saying for how long the outage has lasted and how
many attempts failed; the recovery is one INFO line. So a controller down for an hour costs about 60 lines,
not one per reconnect attempt (about one a second).

Fencing (Hello.instance_id / instance_started_at_s): the controller closes a stream superseded by a newer
one of the same engine id with ABORTED, and refuses a stream of an older instance with ALREADY_EXISTS. Both
are logged as such; the link keeps reconnecting with the normal backoff (the controller decides who holds
the id).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from agents.config import AgentConfig
from agents.recorder import TelemetryRecorder
from controlplane.api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from controlplane.protocol import reads_packed_steps, steps_message

logger = logging.getLogger(__name__)

# At most one reminder WARNING per this many seconds of an outage.
OUTAGE_REMINDER_S = 60.0


class OutageLog:
    """What the link logs about failed streams: one WARNING when an outage begins and one per new cause
    during it, a WARNING reminder at most every `reminder_s` while it lasts (its duration and the attempts
    failed), DEBUG for the other attempts, one INFO at recovery. Not thread-safe: the link thread alone
    calls it. Times come from `clock` (monotonic seconds)."""

    def __init__(self, engine_id: str, address: str, *, reminder_s: float = OUTAGE_REMINDER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._engine_id = engine_id
        self._address = address
        self._reminder_s = reminder_s
        self._clock = clock
        self.started_s: float | None = None  # when the outage began; None while the link works
        self.num_attempts = 0  # attempts failed since it began
        self._causes: set[object] = set()
        self._reminded_s = 0.0

    def failed(self, cause: object, message: str, wait_s: float, *, error: Exception | None = None) -> None:
        """An attempt failed with `cause` (a gRPC status code, None for a stream the controller ended,
        "error" for an exception, which `error` is: its traceback goes with the WARNING), described by
        `message`; the next one is in `wait_s` seconds."""
        now_s = self._clock()
        if self.started_s is None:
            self.started_s, self.num_attempts, self._causes = now_s, 0, set()
        self.num_attempts += 1
        if cause not in self._causes:
            self._causes.add(cause)
            self._reminded_s = now_s
            logger.warning("%s; reconnecting in %.2f s", message, wait_s, exc_info=error)
        elif now_s - self._reminded_s >= self._reminder_s:
            self._reminded_s = now_s
            logger.warning("engine %s still has no controller stream from %s after %.0f s and %d failed attempts "
                           "(the last: %s); reconnecting in %.2f s", self._engine_id, self._address,
                           now_s - self.started_s, self.num_attempts, message, wait_s)
        else:
            logger.debug("%s; reconnecting in %.2f s", message, wait_s)

    def recovered(self) -> None:
        """A decision was received: the outage, if any, is over (one INFO line)."""
        if self.started_s is None:
            return
        logger.info("engine %s is back on the controller at %s after %.1f s and %d failed attempts",
                    self._engine_id, self._address, self._clock() - self.started_s, self.num_attempts)
        self.started_s = None


class ControllerLink:
    """Background stream to the controller; start() once, stop() at engine shutdown."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        hello: agent_pb2.Hello,
        recorder: TelemetryRecorder,
        on_decision: Callable[[common_pb2.Decision, float], tuple[bool, str]],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 1.0,
        outage_reminder_s: float = OUTAGE_REMINDER_S,
    ) -> None:
        if not 0.0 < backoff_initial_s <= backoff_max_s:
            raise ValueError(f"need 0 < backoff_initial_s ≤ backoff_max_s, got {backoff_initial_s}, {backoff_max_s}")
        self._config = config
        self._hello = hello
        self._recorder = recorder
        self._on_decision = on_decision
        self.last_heard_s = float("-inf")
        self._clock = clock
        self._wall_clock = wall_clock
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._outage = OutageLog(config.engine_id, config.controller_address, reminder_s=outage_reminder_s,
                                 clock=clock)
        self._acks: queue.SimpleQueue[agent_pb2.DecisionAck] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controlplane-link", daemon=True)
        self._call: grpc.Future | None = None
        self._packed_steps = False  # the stream's controller reads Steps.packed_columns (its initial metadata)
        self.connected = False
        self.num_reconnects = 0
        self.num_batches_sent = 0
        self.num_decisions_received = 0
        self.cpu_time_s = 0.0  # CPU time of the request-generating thread (batches, ACKs), refreshed per batch

    def start(self) -> None:
        """Start the link thread. Called from the host's thread: grpc imports some of its modules on the first
        channel (each creating a logger), so a first channel is made and closed here. Made in the link thread,
        they would change `sys.modules` and logging's logger table while the host may iterate them
        (pytest's log capture does, at every test phase: "dictionary changed size during iteration"). Never
        raises: a channel that cannot be made (an unreadable CA file) fails again, logged, in the thread."""
        try:
            self._channel().close()
        except Exception:  # the link must never take the engine down
            logger.debug("first controller channel could not be made; the link thread retries", exc_info=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout_s)

    def send_ack(self, version: int, *, applied: bool, reason: str = "") -> None:
        """Queue an ACK (never blocks)."""
        self._acks.put(agent_pb2.DecisionAck(version=version, applied=applied, reject_reason=reason))
        self._wake.set()

    def _channel(self) -> grpc.Channel:
        options = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]
        if self._config.tls_ca is None:
            return grpc.insecure_channel(self._config.controller_address, options=options)
        credentials = grpc.ssl_channel_credentials(root_certificates=self._config.tls_ca.read_bytes())
        return grpc.secure_channel(self._config.controller_address, credentials, options=options)

    def _run(self) -> None:
        delay_s = self._backoff_initial_s
        while not self._stop.is_set():
            heard_before = self.last_heard_s
            code: object = None
            details = ""
            error: Exception | None = None
            try:
                self._stream()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code == grpc.StatusCode.CANCELLED and self._stop.is_set():
                    break
                details = exc.details() if hasattr(exc, "details") else ""
            except Exception as exc:  # the link must never take the engine down
                code, details, error = "error", f"{type(exc).__name__}: {exc}", exc
            self.connected = False
            if self.last_heard_s > heard_before:
                delay_s = self._backoff_initial_s  # the stream had worked: start backoff afresh
            wait_s = delay_s * random.uniform(0.5, 1.0)
            self._outage.failed(code, self._stream_end(code, details), wait_s, error=error)
            self._stop.wait(wait_s)
            delay_s = min(self._backoff_max_s, delay_s * 2.0)
            self.num_reconnects += 1

    def _stream_end(self, code: object, details: str) -> str:
        """Why a stream ended, in words (without the wait)."""
        engine_id = self._config.engine_id
        if code == grpc.StatusCode.ABORTED:
            return (f"controller closed the stream of engine {engine_id}: superseded by a newer stream of the same "
                    f"engine id ({details})")
        if code == grpc.StatusCode.ALREADY_EXISTS:
            return (f"controller refused the stream of engine {engine_id}: another agent instance holds this "
                    f"engine id ({details})")
        if code is None:
            return f"controller ended the stream of engine {engine_id}"
        if code == "error":
            return f"controller link error of engine {engine_id} ({details})"
        return f"controller stream failed ({code}: {details})"

    def _stream(self) -> None:
        metadata = (("authorization", f"Bearer {self._config.token}"),) if self._config.token else ()
        with self._channel() as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            self._packed_steps = False  # until this stream's controller says it reads them
            call = stub.Connect(self._requests(), metadata=metadata)
            self._call = call
            try:
                for message in call:
                    if not self._packed_steps:  # its initial metadata came before this message: no wait
                        self._packed_steps = reads_packed_steps(call.initial_metadata())
                    if message.HasField("decision"):
                        if not self.connected:
                            self._outage.recovered()
                        self.connected = True
                        self.num_decisions_received += 1
                        now_s = self._clock()
                        self.last_heard_s = now_s
                        decision = message.decision
                        applied, reason = self._on_decision(decision, now_s)
                        self.send_ack(decision.version, applied=applied, reason=reason)
            finally:
                self._call = None

    def _requests(self) -> Iterator[agent_pb2.AgentMessage]:
        yield agent_pb2.AgentMessage(hello=self._hello)
        seq = 0
        next_batch_s = self._clock() + self._config.batch_interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_batch_s - self._clock()))
            self._wake.clear()
            while True:
                try:
                    ack = self._acks.get_nowait()
                except queue.Empty:
                    break
                yield agent_pb2.AgentMessage(ack=ack)
            if self._stop.is_set():
                return
            if self._clock() >= next_batch_s:
                seq += 1
                started_cpu_s = time.thread_time()
                batch = self._batch(seq)
                self.cpu_time_s += time.thread_time() - started_cpu_s
                yield agent_pb2.AgentMessage(telemetry=batch)
                self.num_batches_sent += 1
                next_batch_s = self._clock() + self._config.batch_interval_s

    def _batch(self, seq: int) -> agent_pb2.TelemetryBatch:
        s = self._recorder.drain()
        return agent_pb2.TelemetryBatch(
            seq=seq,
            completions=agent_pb2.Completions(prompt_tokens=s.prompt_tokens, output_tokens=s.output_tokens,
                                              finish_time_s=s.finish_time_s, aborted=s.aborted,
                                              admitted_time_s=s.admitted_time_s, arrival_time_s=s.arrival_time_s,
                                              first_token_time_s=s.first_token_time_s),
            steps=steps_message(s.duration_s, s.prefill_tokens, s.decode_tokens, s.decode_requests,
                                packed=self._packed_steps, mode=s.step_mode, budget_tokens=s.step_budget_tokens),
            kv_used_tokens=min(s.kv_used_tokens, s.kv_total_tokens), kv_total_tokens=s.kv_total_tokens,
            scheduler=agent_pb2.SchedulerState(num_running_prefills=s.num_running_prefills,
                                               num_running_decodes=s.num_running_decodes, num_waiting=s.num_waiting,
                                               largest_remaining_prefill_tokens=s.largest_remaining_prefill_tokens),
            counters=agent_pb2.Counters(num_preemptions=s.num_preemptions, num_events_dropped=s.num_events_dropped),
            running=agent_pb2.RunningLengths(output_tokens=s.running_output_tokens,
                                             num_requests=s.running_num_requests,
                                             admitted_time_s=s.running_admitted_time_s),
            sent_at_s=self._wall_clock(),
        )
