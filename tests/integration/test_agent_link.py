"""The agent's link thread against a real controller: telemetry in, decisions out, ACKs, reconnects."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from agents.config import AgentConfig
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from controlplane.api.v1 import agent_pb2, agent_pb2_grpc, common_pb2, operator_pb2
from controlplane.protocol import STEPS_METADATA, pack_step_columns
from testbench.net import free_port
from tests.integration.controller_harness import LIMITS, make_config, operator_stub, running_controller

POOL = common_pb2.Pool(model="tiny", accelerator="cpu")


async def _until(predicate, *, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_link_streams_telemetry_acks_and_reconnects(redis_url: str) -> None:
    port = free_port()
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


def _link(port: int, *, engine_id: str = "engine-link", instance_id: str = "", started_at_s: float = 0.0,
          on_decision=None, recorder: TelemetryRecorder | None = None, **options: float) -> ControllerLink:
    """A link with the production backoff defaults, unless `options` (ControllerLink's keywords) say otherwise."""
    config = AgentConfig(controller_address=f"127.0.0.1:{port}", engine_id=engine_id, pool_model="tiny",
                         pool_accelerator="cpu", batch_interval_s=0.1)
    hello = agent_pb2.Hello(engine_id=engine_id, pool=POOL, vllm_version="0.32.0", agent_version="test",
                            limits=LIMITS, instance_id=instance_id, instance_started_at_s=started_at_s)
    return ControllerLink(config, hello=hello, recorder=recorder or TelemetryRecorder(capacity=64),
                          on_decision=on_decision or (lambda decision, now_s: (True, "")), **options)


async def test_link_is_back_on_the_controller_within_2_s_of_a_restart(redis_url: str) -> None:
    """The controller is down for 5 s (the backoff would have grown to several seconds uncapped), then
    restarted on the same port: the agent's stream is back, with a decision, within 2 s."""
    port = free_port()
    config = make_config(redis_url, port=port)
    heard_s: list[float] = []

    def on_decision(decision: common_pb2.Decision, now_s: float) -> tuple[bool, str]:
        heard_s.append(time.monotonic())
        return True, ""

    link = _link(port, on_decision=on_decision)
    try:
        async with running_controller(config):
            link.start()
            await _until(lambda: bool(heard_s))
        await _until(lambda: not link.connected)
        await asyncio.sleep(5.0)
        async with running_controller(config):
            restarted_s = time.monotonic()
            heard_before = len(heard_s)
            await _until(lambda: len(heard_s) > heard_before, timeout_s=10.0)
            resync_s = heard_s[heard_before] - restarted_s
            print(f"resync after a 5 s outage: {resync_s:.2f} s")
            assert resync_s <= 2.0
    finally:
        await asyncio.to_thread(link.stop)


async def test_fencing_outcomes_are_logged_and_the_loser_keeps_retrying(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Two agent instances claim one engine id: the newer takes the stream (the older one is told ABORTED:
    superseded), the older one's reconnects are refused (ALREADY_EXISTS); each logged clearly, once."""
    caplog.set_level(logging.DEBUG, logger="agents.link")
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        older_id, newer_id = uuid.uuid4().hex, uuid.uuid4().hex
        older = _link(ctl.app.port, engine_id="twin-id", instance_id=older_id, started_at_s=time.time() - 60)
        newer = _link(ctl.app.port, engine_id="twin-id", instance_id=newer_id, started_at_s=time.time())
        stub = operator_stub(channel)

        async def holder() -> str:
            engines = (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines
            return engines[0].instance_id if engines and engines[0].connected else ""

        try:
            older.start()
            await _until(lambda: older.connected)
            assert await holder() == older_id
            newer.start()
            await _until(lambda: newer.connected)
            reconnects = older.num_reconnects
            await _until(lambda: older.num_reconnects >= reconnects + 2)  # it keeps trying, with the backoff
            assert await holder() == newer_id
        finally:
            await asyncio.to_thread(older.stop)
            await asyncio.to_thread(newer.stop)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([m for m in warnings if "superseded by a newer stream of the same engine id" in m]) == 1
    assert len([m for m in warnings if "another agent instance holds this engine id" in m]) == 1


class _RecordingAgentService(agent_pb2_grpc.AgentServiceServicer):
    """A stand-in controller on real gRPC: records what the agent sends, answers Hello with one decision;
    reads_packed: it says it reads packed steps (as this project's controller does), else says nothing (as an
    older one)."""

    def __init__(self, *, reads_packed: bool = False) -> None:
        self.hellos: list[agent_pb2.Hello] = []
        self.batches: list[agent_pb2.TelemetryBatch] = []
        self.reads_packed = reads_packed

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        if self.reads_packed:
            await context.send_initial_metadata((STEPS_METADATA,))
        async for message in request_iterator:
            if message.HasField("hello"):
                self.hellos.append(message.hello)
                yield agent_pb2.ControllerMessage(decision=common_pb2.Decision(
                    version=1, mode=common_pb2.MODE_PASSTHROUGH, ttl_s=30.0))
            elif message.HasField("telemetry"):
                self.batches.append(message.telemetry)


async def test_hello_fencing_fields_and_the_running_histogram_are_sent() -> None:
    service = _RecordingAgentService()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    recorder = TelemetryRecorder(capacity=64)
    link = _link(port, instance_id="a" * 32, started_at_s=1.7e9, recorder=recorder)
    try:
        link.start()
        await _until(lambda: bool(service.batches))
        recorder.record_completion(10, 20, 1.7e9 + 3.0, False, 1.7e9 + 1.0)
        recorder.set_running_lengths([3, 40, 512], [5, 1, 2], [1.7e9 + 4.0, 1.7e9 + 2.0, 1.7e9])
        await _until(lambda: any(b.running.output_tokens for b in service.batches))
        [hello] = service.hellos
        assert (hello.instance_id, hello.instance_started_at_s) == ("a" * 32, 1.7e9)
        sent = [b.running for b in service.batches if b.running.output_tokens]
        assert len(sent) == 1
        assert (list(sent[0].output_tokens), list(sent[0].num_requests)) == ([3, 40, 512], [5, 1, 2])
        assert list(sent[0].admitted_time_s) == [1.7e9 + 4.0, 1.7e9 + 2.0, 1.7e9]
        [completions] = [b.completions for b in service.batches if b.completions.output_tokens]
        assert list(completions.admitted_time_s) == [1.7e9 + 1.0]
    finally:
        await asyncio.to_thread(link.stop)
        await server.stop(0)


@pytest.mark.parametrize("reads_packed", [False, True])
async def test_steps_are_packed_only_for_a_controller_that_says_it_reads_them(reads_packed: bool) -> None:
    service = _RecordingAgentService(reads_packed=reads_packed)
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    recorder = TelemetryRecorder(capacity=64)
    link = _link(port, recorder=recorder)
    try:
        link.start()
        await _until(lambda: link.num_decisions_received >= 1)
        await _until(lambda: len(service.batches) >= 2)  # one batch after the decision, whose metadata came first
        recorder.record_step(300, 4, 4, 0.02)
        recorder.record_step(0, 9, 9, 0.01)
        await _until(lambda: any(b.steps.packed_columns or b.steps.duration_s for b in service.batches))
        [steps] = [b.steps for b in service.batches if b.steps.packed_columns or b.steps.duration_s]
        if reads_packed:
            assert steps.packed_columns == pack_step_columns([0.02, 0.01], [300, 0], [4, 9], [4, 9])
            assert not steps.duration_s
        else:
            assert not steps.packed_columns and list(steps.duration_s) == [0.02, 0.01]
            assert list(steps.prefill_tokens) == [300, 0]
    finally:
        await asyncio.to_thread(link.stop)
        await server.stop(0)


async def test_the_controller_takes_the_agents_packed_steps(redis_url: str) -> None:
    async with running_controller(make_config(redis_url, port=free_port())) as ctl:
        recorder = TelemetryRecorder(capacity=64)
        link = _link(ctl.app.port, recorder=recorder)
        registry = ctl.app.metrics.registry
        accepted = {"kind": "step", "result": "accepted"}
        try:
            link.start()
            await _until(lambda: link._packed_steps)
            for _ in range(3):
                recorder.record_step(300, 4, 4, 0.02)
            await _until(lambda: (registry.get_sample_value("cp_telemetry_events_total", accepted) or 0) >= 3)
            assert (registry.get_sample_value("cp_telemetry_events_total", {"kind": "any", "result": "dropped"})
                    or 0) == 0
        finally:
            await asyncio.to_thread(link.stop)


def test_reconnect_waits_are_capped_jittered_and_logged_as_they_are(caplog: pytest.LogCaptureFixture) -> None:
    """Against a closed port: waits grow from 0.1 s and never exceed 1 s; the warning names the real wait."""
    caplog.set_level(logging.DEBUG, logger="agents.link")
    link = _link(free_port())
    started = time.monotonic()
    link.start()
    deadline = started + 10
    while link.num_reconnects < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    link.stop()
    messages = [r.getMessage() for r in caplog.records if "reconnecting in" in r.getMessage()]
    waits = [float(m.rsplit("reconnecting in ", 1)[1].split()[0]) for m in messages]
    assert len(waits) >= 8 and all(0.05 <= w <= 1.0 for w in waits), waits
    assert max(waits) > 0.5 and waits[0] <= 0.1  # it grew, from the initial delay
    assert [r.levelno for r in caplog.records if "reconnecting in" in r.getMessage()][:2] == [
        logging.WARNING, logging.DEBUG]  # one warning per streak, repeats at DEBUG
    config = AgentConfig(controller_address="127.0.0.1:1", engine_id="e", pool_model="m", pool_accelerator="cpu")
    with pytest.raises(ValueError, match="backoff"):
        ControllerLink(config, hello=agent_pb2.Hello(), recorder=TelemetryRecorder(capacity=16),
                       on_decision=lambda d, t: (True, ""), backoff_initial_s=2.0, backoff_max_s=1.0)


def _link_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "agents.link" and r.levelno == level]


async def test_an_outage_is_one_warning_a_reminder_a_period_and_one_info_at_recovery(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """No controller for 3.5 s (reminders every 1 s here, every 60 s by default), then one on the port: one
    WARNING as the outage begins, reminders at most one a period with its length and attempts so far, the
    other attempts at DEBUG, and one INFO once a decision arrives."""
    caplog.set_level(logging.DEBUG, logger="agents.link")
    port = free_port()
    link = _link(port, outage_reminder_s=1.0)
    try:
        link.start()
        await asyncio.sleep(3.5)
        async with running_controller(make_config(redis_url, port=port)):
            await _until(lambda: link.connected)
            attempts = link.num_reconnects
            await asyncio.to_thread(link.stop)  # before the controller stops: no second outage
    finally:
        await asyncio.to_thread(link.stop)
    first, *reminders = _link_records(caplog, logging.WARNING)
    assert first.getMessage().startswith("controller stream failed (StatusCode.UNAVAILABLE: ")
    assert 1 <= len(reminders) <= 3, [r.getMessage() for r in reminders]
    shown = [re.search(r"after (\d+) s and (\d+) failed attempts", r.getMessage()) for r in reminders]
    assert all(shown) and all("engine engine-link still has no controller stream from 127.0.0.1:" in
                              r.getMessage() for r in reminders)
    lengths_s = [int(match.group(1)) for match in shown]
    counts = [int(match.group(2)) for match in shown]
    assert lengths_s == sorted(lengths_s) and lengths_s[0] >= 1 and counts == sorted(set(counts)) and counts[0] >= 2
    times_s = [first.created] + [r.created for r in reminders]
    assert all(later - earlier >= 1.0 for earlier, later in itertools.pairwise(times_s))
    assert len(_link_records(caplog, logging.DEBUG)) == attempts - 1 - len(reminders) >= 2
    [back] = _link_records(caplog, logging.INFO)
    assert re.fullmatch(rf"engine engine-link is back on the controller at 127\.0\.0\.1:{port} after [\d.]+ s and "
                        rf"{attempts} failed attempts", back.getMessage()), back.getMessage()


class _AlternatingRefusals(agent_pb2_grpc.AgentServiceServicer):
    """A stand-in controller that refuses every stream, with UNAVAILABLE and INTERNAL in turn (a proxy in front
    of a controller that is down can answer so)."""

    def __init__(self) -> None:
        self.num_streams = 0

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        self.num_streams += 1
        code = grpc.StatusCode.UNAVAILABLE if self.num_streams % 2 else grpc.StatusCode.INTERNAL
        await context.abort(code, f"refusal {self.num_streams}")
        yield agent_pb2.ControllerMessage()  # pragma: no cover - abort raises


async def test_causes_that_alternate_warn_once_each(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agents.link")
    service = _AlternatingRefusals()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = _link(port, backoff_max_s=0.2)
    try:
        link.start()
        await _until(lambda: link.num_reconnects >= 8)
    finally:
        await asyncio.to_thread(link.stop)
        await server.stop(0)
    warnings = [r.getMessage() for r in _link_records(caplog, logging.WARNING)]
    assert [m.split(": refusal")[0] for m in warnings] == ["controller stream failed (StatusCode.UNAVAILABLE",
                                                           "controller stream failed (StatusCode.INTERNAL"]
    assert len(_link_records(caplog, logging.DEBUG)) >= 6


@pytest.mark.parametrize("reachable", [True, False], ids=["streaming", "refused"])
async def test_the_link_thread_imports_nothing_once_started(redis_url: str, reachable: bool) -> None:
    """grpc imports modules (each creating a logger) on its first channel; on the link thread that changes
    sys.modules and logging's logger table while the host may iterate them (pytest's log capture does at every
    test phase). After start() returns, the thread imports nothing, streaming or reconnecting."""
    async with running_controller(make_config(redis_url)) as ctl:
        address = ctl.address if reachable else f"127.0.0.1:{free_port()}"
        probe = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("link_imports_probe.py")), address, "2.0",
            stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).resolve().parents[2]))
        out, _ = await probe.communicate()
    assert probe.returncode == 0
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["thread_imports"] == []
    assert (result["num_decisions"] > 0) == reachable


def test_start_never_raises_into_the_host_when_the_channel_cannot_be_made(tmp_path: Path) -> None:
    config = AgentConfig(controller_address=f"127.0.0.1:{free_port()}", engine_id="engine-no-ca", pool_model="tiny",
                         pool_accelerator="cpu", tls_ca=tmp_path / "gone.pem")
    link = ControllerLink(config, hello=agent_pb2.Hello(engine_id="engine-no-ca", pool=POOL, limits=LIMITS),
                          recorder=TelemetryRecorder(capacity=64), on_decision=lambda d, now_s: (True, ""))
    link.start()  # the CA file is missing: the first channel fails here, and again (logged) in the thread
    deadline = time.monotonic() + 5.0
    while link.num_reconnects < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    link.stop()
    assert link.num_reconnects >= 2 and not link.connected
