"""The synthetic fleet against a real grpc.aio AgentService server on loopback.

The server is a small recording servicer implemented here (not a mock library): it stores every message
and the call metadata per stream, and sends the Decisions it is given once the first TelemetryBatch of a
stream has arrived.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import pytest

from controlplane.api.v1 import agent_pb2, agent_pb2_grpc, common_pb2
from controlplane.core.types import Mode
from controlplane.fleet.client import FleetEngineClient
from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.fleet import FleetPool, SyntheticFleet
from controlplane.fleet.profiles import RTX_PRO_6000_QWEN3_8B, EngineShape
from controlplane.fleet.workload import WorkloadSpec

SHAPE = EngineShape(max_num_seqs=16, max_num_batched_tokens=1024, kv_capacity_tokens=65536, block_size_tokens=16,
                    max_model_len_tokens=4096)
WORKLOAD = WorkloadSpec.parse("geometric:64/uniform:256/closed:12")
TOKEN = "s3cret"


@dataclass
class Stream:
    """What one Connect call carried."""

    metadata: dict[str, str]
    messages: list[agent_pb2.AgentMessage] = field(default_factory=list)
    ended_by_client: bool = False

    @property
    def hello(self) -> agent_pb2.Hello:
        return self.messages[0].hello

    def telemetry(self) -> list[agent_pb2.TelemetryBatch]:
        return [m.telemetry for m in self.messages if m.HasField("telemetry")]

    def acks(self) -> list[agent_pb2.DecisionAck]:
        return [m.ack for m in self.messages if m.HasField("ack")]


class RecordingAgentService(agent_pb2_grpc.AgentServiceServicer):
    """Records every stream; after the first telemetry batch sends `decisions`; can end streams early."""

    def __init__(self, decisions: tuple[common_pb2.Decision, ...] = (), *, end_after_batches: int | None = None):
        self.decisions = decisions
        self.end_after_batches = end_after_batches
        self.streams: list[Stream] = []

    async def Connect(self, request_iterator, context) -> AsyncIterator[agent_pb2.ControllerMessage]:  # noqa: N802
        stream = Stream(metadata={m.key: m.value for m in context.invocation_metadata()})
        self.streams.append(stream)
        num_batches = 0
        async for message in request_iterator:
            stream.messages.append(message)
            if message.HasField("telemetry"):
                num_batches += 1
                if num_batches == 1:
                    for decision in self.decisions:
                        yield agent_pb2.ControllerMessage(decision=decision)
                if self.end_after_batches is not None and num_batches >= self.end_after_batches:
                    return
        stream.ended_by_client = True

    def streams_of(self, engine_id: str) -> list[Stream]:
        return [s for s in self.streams if s.messages and s.hello.engine_id == engine_id]


@dataclass
class Controller:
    servicer: RecordingAgentService
    server: grpc.aio.Server
    address: str


async def start_controller(servicer: RecordingAgentService, *, address: str = "127.0.0.1:0") -> Controller:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(address)
    await server.start()
    return Controller(servicer=servicer, server=server, address=f"127.0.0.1:{port}")


async def eventually(condition: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def make_client(address: str, **kwargs) -> FleetEngineClient:
    options = {"engine_id": "sim-test-0", "batch_interval_s": 0.5, "backoff_initial_s": 0.02,
               "backoff_max_s": 0.1, "tick_s": 0.02, "metadata": (("authorization", f"Bearer {TOKEN}"),)}
    options.update(kwargs)
    engine = FakeEngine(workload=WORKLOAD, shape=SHAPE, seed=9)
    return FleetEngineClient(address, engine=engine, **options)


def eb_decision(*, version: int, k: int, n: int, ttl_s: float = 60.0) -> common_pb2.Decision:
    return common_pb2.Decision(
        version=version, mode=common_pb2.MODE_EB, k=k, n=n, ttl_s=ttl_s, reason="crossover_eb",
        budget=common_pb2.BudgetPolicy(b_max_tokens=1024, b_cap_tokens=256, n_th=2),
    )


@pytest.fixture
async def controller_factory():
    started: list[Controller] = []

    async def factory(servicer: RecordingAgentService, **kwargs) -> Controller:
        controller = await start_controller(servicer, **kwargs)
        started.append(controller)
        return controller

    yield factory
    for controller in started:
        await controller.server.stop(None)


async def run_until(client: FleetEngineClient, condition: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    """Run the client until `condition` holds, then stop it gracefully."""
    task = asyncio.create_task(client.run())
    try:
        await eventually(lambda: condition() or task.done(), timeout_s=timeout_s)
    finally:
        client.stop()
        await asyncio.wait_for(task, timeout=5)


def batches_after_ack(stream: Stream) -> list[agent_pb2.TelemetryBatch]:
    acks = [i for i, m in enumerate(stream.messages) if m.HasField("ack")]
    return [m.telemetry for m in stream.messages[acks[0]:] if m.HasField("telemetry")] if acks else []


async def test_hello_first_consecutive_seqs_consistent_arrays_and_ack(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService((eb_decision(version=7, k=3, n=10),)))
    client = make_client(controller.address)
    streams = controller.servicer.streams
    await run_until(client, lambda: bool(streams) and len(batches_after_ack(streams[0])) >= 3)

    [stream] = controller.servicer.streams
    assert stream.metadata["authorization"] == f"Bearer {TOKEN}"
    assert stream.messages[0].WhichOneof("kind") == "hello"
    hello = stream.hello
    assert hello.engine_id == "sim-test-0"
    assert (hello.pool.model, hello.pool.accelerator) == ("Qwen/Qwen3-8B", "NVIDIA H200")
    assert hello.vllm_version == "sim"
    assert hello.agent_version
    assert (hello.limits.max_num_seqs, hello.limits.max_num_batched_tokens) == (16, 1024)
    assert (hello.limits.kv_capacity_tokens, hello.limits.block_size_tokens) == (65536, 16)
    assert hello.limits.max_model_len_tokens == 4096
    assert not any(m.HasField("hello") for m in stream.messages[1:])

    batches = stream.telemetry()
    assert len(batches) >= 4
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    for batch in batches:
        c, s = batch.completions, batch.steps
        assert len(c.prompt_tokens) == len(c.output_tokens) == len(c.finish_time_s) == len(c.aborted)
        assert len(s.prefill_tokens) == len(s.decode_tokens) == len(s.decode_requests) == len(s.duration_s) > 0
        assert all(d > 0 for d in s.duration_s)
        assert sum(s.duration_s) == pytest.approx(0.5, abs=0.1)  # one batch interval of simulated time
        assert not any(c.aborted)
        assert all(o >= 1 for o in c.output_tokens)
        assert all(f <= batch.sent_at_s for f in c.finish_time_s)
        assert batch.kv_used_tokens <= batch.kv_total_tokens == 65536
        assert batch.scheduler.num_running_prefills + batch.scheduler.num_running_decodes <= 16
        # Censored observations and admissions, as an agent sends them: one admission per completion, no
        # later than its finish; the running histogram counts the running requests, each entry admitted
        # before the batch was sent.
        assert len(c.admitted_time_s) == len(c.output_tokens)
        assert all(a <= f for a, f in zip(c.admitted_time_s, c.finish_time_s, strict=True))
        r = batch.running
        assert len(r.output_tokens) == len(r.num_requests) == len(r.admitted_time_s)
        assert sum(r.num_requests) == batch.scheduler.num_running_prefills + batch.scheduler.num_running_decodes
        assert all(a <= batch.sent_at_s for a in r.admitted_time_s)
    assert sum(len(b.completions.output_tokens) for b in batches) > 0
    assert sum(sum(b.running.num_requests) for b in batches) > 0
    # Requests run across batches: some completions were admitted before the previous batch was sent, and
    # their admissions map there (the stream's one sim-to-wall map; its pace is tested in the unit tests).
    assert any(a < earlier.sent_at_s for earlier, batch in itertools.pairwise(batches)
               for a in batch.completions.admitted_time_s)

    [ack] = stream.acks()
    assert (ack.version, ack.applied, ack.reject_reason) == (7, True, "")
    assert client.engine.settings.mode is Mode.EB
    assert client.engine.settings.version == 7
    assert client.decision_in_force.version == client.latest_decision.version == 7
    # Every batch sent after the ACK ran under exclusive batching: no step mixes prefill and decode.
    for batch in batches_after_ack(stream):
        assert all(p == 0 or d == 0 for p, d in zip(batch.steps.prefill_tokens, batch.steps.decode_tokens,
                                                    strict=True))
    counters = client.counters
    assert counters.num_batches_sent == len(batches)
    assert (counters.num_decisions_received, counters.num_decisions_applied, counters.num_reconnects) == (1, 1, 0)
    assert stream.ended_by_client


async def test_max_batches_ends_the_stream_after_exactly_that_many(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService())
    client = make_client(controller.address, max_batches=5)
    await asyncio.wait_for(client.run(), timeout=10)
    [stream] = controller.servicer.streams
    assert [b.seq for b in stream.telemetry()] == [1, 2, 3, 4, 5]
    assert stream.ended_by_client
    assert client.finished and not client.connected


async def test_a_decision_with_k_greater_than_n_is_acked_as_not_applied(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService((eb_decision(version=3, k=12, n=8),)))
    client = make_client(controller.address)
    await run_until(client, lambda: bool(controller.servicer.streams and controller.servicer.streams[0].acks()))

    [ack] = controller.servicer.streams[0].acks()
    assert (ack.version, ack.applied, ack.reject_reason) == (3, False, "k_greater_than_n")
    assert client.engine.settings.mode is Mode.PASSTHROUGH
    assert client.decision_in_force is None
    assert client.latest_decision.version == 3
    assert client.counters.num_decisions_rejected == 1


async def test_reconnects_after_the_controller_restarts_and_restarts_seq(controller_factory) -> None:
    first = await controller_factory(RecordingAgentService((eb_decision(version=1, k=2, n=8),)))
    client = make_client(first.address, speed=20.0)  # paced: 0.5 simulated s per batch = 25 ms
    task = asyncio.create_task(client.run())
    try:
        await eventually(lambda: len(first.servicer.streams[0].telemetry()) >= 3 if first.servicer.streams else False)
        await first.server.stop(None)
        await eventually(lambda: client.counters.num_stream_failures >= 1)
        second = await controller_factory(RecordingAgentService(), address=first.address)
        await eventually(lambda: bool(second.servicer.streams) and len(second.servicer.streams[0].telemetry()) >= 2)
    finally:
        client.stop()
        await asyncio.wait_for(task, timeout=5)
    stream = second.servicer.streams[0]
    assert stream.messages[0].HasField("hello")
    assert [b.seq for b in stream.telemetry()][:2] == [1, 2]
    assert client.counters.num_reconnects >= 1
    # The decision survived the short outage (its TTL is 60 s).
    assert client.engine.settings.version == 1


async def test_the_decision_expires_after_its_ttl_without_a_controller(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService((eb_decision(version=4, k=2, n=8, ttl_s=0.3),),
                                                                end_after_batches=2))
    client = make_client(controller.address)
    task = asyncio.create_task(client.run())
    try:
        await eventually(lambda: client.counters.num_decisions_applied == 1)
        await controller.server.stop(None)
        await eventually(lambda: client.counters.num_decisions_expired == 1)
    finally:
        client.stop()
        await asyncio.wait_for(task, timeout=5)
    assert client.decision_in_force is None
    assert client.engine.settings.mode is Mode.PASSTHROUGH
    assert client.engine.settings.version == 0


async def test_fleet_runs_engines_concurrently_over_pools(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService((eb_decision(version=2, k=2, n=8),)))
    pools = (FleetPool(shape=SHAPE), FleetPool(accelerator="NVIDIA RTX PRO 6000", cost_model=RTX_PRO_6000_QWEN3_8B,
                                               shape=SHAPE))
    fleet = SyntheticFleet(controller.address, num_engines=4, workload=WORKLOAD, pools=pools, seed=1,
                           speed=50.0, batch_interval_s=0.5, metadata=(("authorization", f"Bearer {TOKEN}"),))
    await fleet.start()
    try:
        await eventually(lambda: fleet.stats().num_decisions_applied == 4 and fleet.stats().num_batches_sent >= 12)
    finally:
        await fleet.stop()

    stats = fleet.stats()
    assert stats.num_engines == 4
    assert stats.num_connected == 0
    assert stats.num_reconnects == 0
    ids = [row.engine_id for row in stats.engines]
    assert ids == ["sim-0-0000", "sim-1-0001", "sim-0-0002", "sim-1-0003"]
    for row in stats.engines:
        [stream] = controller.servicer.streams_of(row.engine_id)
        assert stream.metadata["authorization"] == f"Bearer {TOKEN}"
        assert stream.hello.pool.accelerator == row.accelerator
        seqs = [b.seq for b in stream.telemetry()]
        assert seqs == list(range(1, len(seqs) + 1))
        assert row.counters.num_batches_sent == len(seqs)
        assert [a.version for a in stream.acks()] == [2]
        assert row.decision_version == row.settings.version == 2
        assert stream.ended_by_client
    assert {row.accelerator for row in stats.engines} == {"NVIDIA H200", "NVIDIA RTX PRO 6000"}
    # Different engines draw different requests.
    steps = {tuple(controller.servicer.streams_of(i)[0].telemetry()[0].steps.prefill_tokens) for i in ids}
    assert len(steps) == 4


async def test_fleet_with_max_batches_finishes_by_itself(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService())
    fleet = SyntheticFleet(controller.address, num_engines=3, workload="fixed:32/fixed:128/closed:4",
                           pools=(FleetPool(shape=SHAPE),), max_batches=2, engine_id_prefix="lg")
    await fleet.start()
    assert await fleet.wait(timeout_s=10)
    await fleet.stop()
    assert fleet.stats().num_batches_sent == 6
    assert sorted(s.hello.engine_id for s in controller.servicer.streams) == ["lg-0-0000", "lg-0-0001", "lg-0-0002"]


async def test_paced_fleet_tracks_wall_time_and_stops_gracefully(controller_factory) -> None:
    controller = await controller_factory(RecordingAgentService())
    fleet = SyntheticFleet(controller.address, num_engines=2, workload=WORKLOAD, pools=(FleetPool(shape=SHAPE),),
                           speed=20.0, batch_interval_s=1.0)
    async with fleet:
        await eventually(lambda: fleet.stats().num_connected == 2)
        await asyncio.sleep(0.6)
        assert fleet.running
    stats = fleet.stats()
    assert not fleet.running
    for row in stats.engines:
        # ~0.6 s of wall time at 20× is ~12 simulated seconds; allow for start-up and a slow machine.
        assert 4.0 <= row.sim_time_s <= 20.0
        assert row.counters.num_batches_sent >= 4
    assert all(stream.ended_by_client for stream in controller.servicer.streams)
