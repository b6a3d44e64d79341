"""`controlplane serve --workers 2` as real processes on one port and one embedded Redis: connections spread
over both workers, every worker answers ListEngines and GetDecision for the whole fleet, an override set
through any worker reaches every engine, a killed worker is restarted and its engines' versions keep
increasing on reconnect, and SIGTERM stops workers and Redis; a supervisor killed with SIGKILL takes its
workers and Redis with it, and a new one starts on the same port and data directory."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from testbench.net import free_ports
from testbench.serve_process import ServeProcess, child_pids, pid_running
from tests.integration.controller_harness import AgentStream, operator_stub

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
NUM_ENGINES = 16
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)


def _worker_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's live children other than the embedded redis-server."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = entry.joinpath("stat").read_text()
            except OSError:
                continue
            comm = stat[stat.find("(") + 1:stat.rfind(")")]
            state, ppid = stat[stat.rfind(")") + 2:].split()[:2]
            if int(ppid) == supervisor_pid and comm != "redis-server" and state not in ("Z", "X"):
                pids.append(int(entry.name))
    return pids


def _listening(serve: ServeProcess) -> int:
    return serve.log_path.read_text(errors="replace").count("listening on")


def _wait(condition, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s} s")
        time.sleep(0.1)


def _own_channel(address: str) -> grpc.aio.Channel:
    """A channel with its own TCP connection (channels otherwise share one per address in a process)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


async def _list_engines(address: str) -> list[operator_pb2.EngineInfo]:
    async with _own_channel(address) as channel:  # a new connection: either worker may answer
        return list((await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest())).engines)


async def _until_listed(address: str, wanted: set[str], *, timeout_s: float = 20.0) -> list[operator_pb2.EngineInfo]:
    deadline = time.monotonic() + timeout_s
    while True:
        engines = await _list_engines(address)
        if {e.engine_id for e in engines if e.connected} >= wanted:
            return engines
        if time.monotonic() > deadline:
            raise AssertionError(f"ListEngines gave {sorted(e.engine_id for e in engines)}, wanted {sorted(wanted)}")
        await asyncio.sleep(0.2)


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


async def test_workers_share_a_port_and_answer_for_the_whole_fleet(tmp_path: Path) -> None:
    port, metrics_port = free_ports(1), free_ports(2)
    serve = ServeProcess.start(tmp_path / "data", log_path=tmp_path / "serve.log", port=port, args=(
        "--workers", "2", "--controller-id", "host", "--metrics-port", str(metrics_port), "--registry-ttl-s", "3"))
    channels: list[grpc.aio.Channel] = []
    workers: list[int] = []
    try:
        _wait(lambda: _listening(serve) == 2, timeout_s=60, what="both workers listening")
        assert len(_worker_pids(serve.pid)) == 2 and len(child_pids(serve.pid, name="redis-server")) == 1

        # One channel (one TCP connection) per engine, as separate agents have: the kernel spreads the
        # connections over the workers.
        channels = [_own_channel(serve.address) for _ in range(NUM_ENGINES)]
        streams = [await AgentStream(channel, f"e{i}", POOL).open() for i, channel in enumerate(channels)]
        first = {s.engine_id: await s.next_decision(timeout_s=30) for s in streams}
        connected = [_metric(metrics_port + i, "cp_connected_engines") for i in range(2)]
        assert sum(connected) == NUM_ENGINES and min(connected) >= 1, connected

        # Any worker lists every engine, held by both, and finds every engine's decision.
        wanted = {s.engine_id for s in streams}
        for _ in range(4):
            engines = await _until_listed(serve.address, wanted)
            assert {e.controller_id for e in engines if e.engine_id in wanted} == {"host-w0", "host-w1"}
            assert all(e.pool == POOL for e in engines)
        async with _own_channel(serve.address) as channel:
            stub = operator_stub(channel)
            for engine_id, decision in first.items():
                view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
                assert view.decision.version >= decision.version
            # An override through one worker reaches the engines of both.
            await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=FLEET, delta_s_per_token=3e-5, reason="both"))
        for s in streams:
            await s.next_decision(timeout_s=20, where=lambda d: d.delta_s_per_token == pytest.approx(3e-5))

        # kill -9 a worker: the supervisor restarts it; its engines reconnect (to either worker) and their
        # versions keep increasing.
        before = {s.engine_id: s for s in streams}
        victim = _worker_pids(serve.pid)[0]
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: _listening(serve) == 3, timeout_s=60, what="the killed worker restarted")
        workers = _worker_pids(serve.pid) + child_pids(serve.pid, name="redis-server")
        assert not pid_running(victim) and len(workers) == 3
        await asyncio.sleep(0.5)
        dropped = [s for s in streams if s._reader is not None and s._reader.done()]
        assert dropped, "the killed worker held no stream"
        for s in dropped:
            last = first[s.engine_id].version
            while not s.decisions.empty():
                last = max(last, s.decisions.get_nowait().version)
            channel = _own_channel(serve.address)
            channels.append(channel)
            again = await AgentStream(channel, s.engine_id, POOL).open()
            decision = await again.next_decision(timeout_s=30)
            assert decision.version > last
            before[s.engine_id] = again
        await _until_listed(serve.address, wanted)
        for s in before.values():
            await s.close()
    finally:
        for channel in channels:
            await channel.close()
        code = serve.stop(timeout_s=60)
    assert code == 0
    assert workers and not any(pid_running(pid) for pid in workers)  # the workers and Redis stopped too


def test_workers_need_a_fixed_port(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="fixed --port"):
        ServeProcess.start(tmp_path / "data", log_path=tmp_path / "serve.log", port=0, args=("--workers", "2"),
                           timeout_s=30)


def test_a_supervisor_killed_with_sigkill_takes_its_workers_and_redis_with_it(tmp_path: Path) -> None:
    port = free_ports(1)
    args = ("--workers", "2", "--controller-id", "host")
    serve = ServeProcess.start(tmp_path / "data", log_path=tmp_path / "serve.log", port=port, args=args)
    again: ServeProcess | None = None
    children: list[int] = []
    try:
        _wait(lambda: _listening(serve) == 2, timeout_s=60, what="both workers listening")
        children = _worker_pids(serve.pid) + child_pids(serve.pid, name="redis-server")
        assert len(children) == 3
        serve.kill()
        _wait(lambda: not any(pid_running(pid) for pid in children), timeout_s=40,
              what=f"the workers and redis-server {children} gone after the supervisor's SIGKILL")
        # Nothing is left holding the port or the data directory: a new supervisor starts on both.
        log = tmp_path / "again.log"
        again = ServeProcess.start(tmp_path / "data", log_path=log, port=port, args=args)
        _wait(lambda: log.read_text(errors="replace").count("listening on") == 2, timeout_s=60,
              what="both new workers listening")
    finally:
        serve.stop()
        for pid in children:  # orphans, when the test fails
            if pid_running(pid):
                os.kill(pid, signal.SIGKILL)
        if again is not None:
            assert again.stop(timeout_s=60) == 0
