"""Chaos on a real engine: the controller killed and restarted, its Redis killed, the controller frozen,
the network cut, one after the other under a saturating load, with an EB decision pinned when each hits.

    vLLM CPU engine (tiny random model) + agent ──▶ TcpProxy ──▶ `controlplane serve` (subprocess) ──▶ embedded Redis
    this test (operator) ─────────────────────────────────────────▶ (directly)

Before each fault the test pins EB with a new N on the engine and waits for the agent's ACK, so the
agent's step trace tells which decision held each step. Faults, in order:

1. `kill -9` of the controller; restarted on the same data directory after TTL + 2 s;
2. SIGSTOP of the controller for 10 s, then SIGCONT;
3. a 10 s network cut at the proxy (bytes held both ways, nothing reset);
4. `kill -9` of the embedded redis-server (the controller's child process).

Asserted: no request fails or is lost and every output has exactly its max_tokens; the engine keeps completing
requests through every fault; during faults 1-3 the agent holds the pinned EB decision (fails static)
and drops to stock scheduling within its TTL, never before TTL minus one keep-alive period; during
fault 4 it never drops the decision (the controller decides from memory); SetDelta works again once the
controller has brought its Redis back. Goal, measured: the agent runs the controller's new decision at most
2 s after the controller is reachable again (after a fault the test pins a new N as soon as the controller
answers, and times the agent's ACK of it); a miss is reported as an expected failure carrying the figures.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from testbench.serve_process import CONTROLPLANE, ServeProcess
from tests.e2e.conftest import EngineRun, start_closed_loop_engine
from tests.e2e.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ENGINE_ID = "chaos"
SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id=ENGINE_ID)
TTL_S = 3.0  # the controller's --ttl-s and the agent's CP_DECISION_TTL_S
KEEPALIVE_S = TTL_S / 3  # the controller re-sends the decision in force every ttl/3
FAULT_S = 10.0
RECOVERY_GOAL_S = 2.0
SLACK_S = 1.0  # a step boundary, and the log line's way to the file, on two shared cores
# Long requests of varied lengths: a hundred in flight across every fault, completions spread over time (one
# length for all would finish them in waves of one EB batch, seconds apart on a slow CPU), hundreds in all.
MAX_TOKENS = (32, 256)
K = 8
PINNED_N = (24, 20, 16, 28, 18)  # pinned before faults 1, 2, 3, 4, and after fault 4
SERVE_ARGS = ("--ttl-s", str(TTL_S), "--decision-interval-s", "0.5", "--readiness-grace-s", "5")
EXPIRY_LINE = "decision expired without a controller"


@dataclass
class Fault:
    """One injected fault: when it started, when the controller was reachable again, when the agent ACKed
    the decision pinned right after (CLOCK_MONOTONIC seconds; 0: never)."""

    name: str
    started_s: float
    reachable_s: float = 0.0
    acked_s: float = 0.0

    @property
    def recovery_s(self) -> float:
        return self.acked_s - self.reachable_s if self.acked_s else float("inf")


class LineTimes:
    """Times (CLOCK_MONOTONIC) at which lines containing `needle` reach a growing file, from a polling thread."""

    def __init__(self, path: Path, needle: str, *, poll_s: float = 0.02) -> None:
        self.times_s: list[float] = []
        self._path, self._needle, self._poll_s = path, needle.encode(), poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="line-times", daemon=True)

    def start(self) -> LineTimes:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def between(self, start_s: float, end_s: float) -> list[float]:
        return [t for t in self.times_s if start_s <= t <= end_s]

    def _run(self) -> None:
        offset, partial = 0, b""
        while not self._stop.wait(self._poll_s):
            try:
                with self._path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            offset += len(data)
            *lines, partial = (partial + data).split(b"\n")
            now_s = time.monotonic()
            self.times_s += [now_s for line in lines if self._needle in line]


async def _reachable(address: str, *, timeout_s: float = 60.0) -> float:
    """The time the controller at `address` first answers an operator call."""
    deadline_s = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        while True:
            try:
                await stub.ListEngines(operator_pb2.ListEnginesRequest(), timeout=1)
                return time.monotonic()
            except grpc.aio.AioRpcError:
                if time.monotonic() > deadline_s:
                    raise
                await asyncio.sleep(0.05)


async def _pin_and_wait_for_ack(address: str, n: int, *, timeout_s: float = 60.0) -> float:
    """Pin EB(K, n) on the engine; return the time the agent has ACKed the decision carrying it, 0.0 if it
    did not within timeout_s."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        await stub.PinMode(operator_pb2.PinModeRequest(scope=SCOPE, mode=operator_pb2.PINNED_MODE_EB, k=K, n=n,
                                                       reason="chaos"), timeout=10)
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            try:
                decision = (await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=ENGINE_ID),
                                                   timeout=2)).decision
                engines = (await stub.ListEngines(operator_pb2.ListEnginesRequest(), timeout=2)).engines
            except grpc.aio.AioRpcError:  # no engine stream yet (a restarted controller)
                await asyncio.sleep(0.05)
                continue
            acked = {e.engine_id: e.acked_version for e in engines}.get(ENGINE_ID, 0)
            if decision.mode == common_pb2.MODE_EB and decision.n == n and acked >= decision.version:
                return time.monotonic()
            await asyncio.sleep(0.05)
    return 0.0


async def _set_delta_until_it_works(address: str, *, timeout_s: float) -> float:
    """SetDelta on the engine every 0.25 s until it succeeds; the time it did, 0.0 if it never did."""
    deadline_s = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        while time.monotonic() < deadline_s:
            try:
                await stub.SetDelta(operator_pb2.SetDeltaRequest(scope=SCOPE, delta_s_per_token=1e-4,
                                                                 reason="after redis kill"), timeout=2)
                return time.monotonic()
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.25)
    return 0.0


def _first_step(steps: list[dict], n: int) -> int:
    """Index of the first EB step run under N = n (len(steps) if none)."""
    return next((i for i, s in enumerate(steps) if s["mode"] == "eb" and s["n_cap"] == n), len(steps))


async def test_faults_under_load_lose_no_request_and_the_agent_fails_static(tiny_model: Path, tmp_path: Path) -> None:
    data_dir, controller_log = tmp_path / "cp", tmp_path / "controller.log"
    controller = await asyncio.to_thread(ServeProcess.start, data_dir, log_path=controller_log, args=SERVE_ARGS)
    proxy = TcpProxy(controller.port).start()
    engine: EngineRun | None = None
    expiries: LineTimes | None = None
    faults: list[Fault] = []
    set_delta_after_redis_kill_s = 0.0
    try:
        pin = await asyncio.create_subprocess_exec(
            str(CONTROLPLANE), "ctl", "--address", controller.address, "pin", "eb", "--scope", f"engine:{ENGINE_ID}",
            "--k", str(K), "--n", str(PINNED_N[0]), "--reason", "chaos", stdout=asyncio.subprocess.PIPE)
        assert await pin.wait() == 0, await pin.stdout.read()
        engine = await start_closed_loop_engine(
            tiny_model, tmp_path / "engine", f"127.0.0.1:{proxy.port}", ENGINE_ID, "--max-tokens",
            ",".join(map(str, MAX_TOKENS)), env={"CP_DECISION_TTL_S": str(TTL_S)})
        expiries = LineTimes(engine.workdir / "engine.log", EXPIRY_LINE).start()
        await engine.wait_ready(timeout_s=300)
        engine.go()
        assert await _pin_and_wait_for_ack(controller.address, PINNED_N[0]), "the agent never ran the first pin"
        await asyncio.sleep(2.0)

        fault = Fault("controller kill -9 and restart", time.monotonic())
        controller.kill()
        await asyncio.sleep(TTL_S + 2.0)
        controller = await asyncio.to_thread(ServeProcess.start, data_dir, log_path=controller_log, args=SERVE_ARGS)
        proxy.set_upstream(controller.port)
        fault.reachable_s = await _reachable(controller.address)
        fault.acked_s = await _pin_and_wait_for_ack(controller.address, PINNED_N[1])
        faults.append(fault)
        await asyncio.sleep(2.0)

        fault = Fault("controller SIGSTOP 10 s", time.monotonic())
        os.kill(controller.pid, signal.SIGSTOP)
        await asyncio.sleep(FAULT_S)
        os.kill(controller.pid, signal.SIGCONT)
        fault.reachable_s = time.monotonic()
        fault.acked_s = await _pin_and_wait_for_ack(controller.address, PINNED_N[2])
        faults.append(fault)
        await asyncio.sleep(2.0)

        fault = Fault("network cut 10 s", time.monotonic())
        proxy.partition()
        await asyncio.sleep(FAULT_S)
        proxy.heal()
        fault.reachable_s = time.monotonic()
        fault.acked_s = await _pin_and_wait_for_ack(controller.address, PINNED_N[3])
        faults.append(fault)
        await asyncio.sleep(2.0)

        fault = Fault("embedded redis-server kill -9", time.monotonic(), reachable_s=time.monotonic())
        redis_pid = controller.redis_pid()
        os.kill(redis_pid, signal.SIGKILL)
        set_delta_after_redis_kill_s = await _set_delta_until_it_works(controller.address, timeout_s=30.0)
        if set_delta_after_redis_kill_s:
            fault.reachable_s = set_delta_after_redis_kill_s
            fault.acked_s = await _pin_and_wait_for_ack(controller.address, PINNED_N[4])
        faults.append(fault)
        await asyncio.sleep(max(0.0, fault.started_s + FAULT_S - time.monotonic()))  # ≥ 10 s, as the others
        redis_kill_window = (fault.started_s, time.monotonic())

        assert engine.process.returncode is None, f"the engine ended during the faults:\n{engine.log_tail()}"
        engine.stop()
        result = await engine.finish(timeout_s=300)
    finally:
        if expiries is not None:
            expiries.stop()
        if engine is not None and engine.process.returncode is None:
            engine.process.kill()
            await engine.process.wait()
        await asyncio.to_thread(controller.stop)  # SIGCONT first: it may be stopped
        proxy.stop()
    report = engine.report()
    figures = json.dumps({f.name: {"drop_to_stock_after_s": _drop_after(expiries, f), "recovery_s": f.recovery_s}
                          for f in faults}, indent=1)
    print(f"faults:\n{figures}\nrequests: {result['num_submitted']} in {result['elapsed_s']:.1f} s; "
          f"agent: {report['num_expired']} expiries, {report['link_reconnects']} reconnects")

    # No request failed or was lost; every output is exactly its request's max_tokens.
    assert result["num_submitted"] >= 200
    assert result["num_finished"] == result["num_submitted"] and not result["unknown_ids"]
    assert result["wrong_lengths"] == {} and result["finish_reasons"] == {"length": result["num_submitted"]}
    # The engine kept serving through every fault.
    finished_s = result["finish_times_s"]
    for f, window in zip(faults, [*((f.started_s, f.reachable_s) for f in faults[:3]), redis_kill_window],
                         strict=True):
        assert any(window[0] <= t <= window[1] for t in finished_s), f"no request finished during {f.name}"
    # Fails static: held the pinned decision, then dropped to stock within its TTL (faults 1-3), once each.
    for f in faults[:3]:
        drop_s = _drop_after(expiries, f)
        assert drop_s is not None, f"the agent never dropped the decision during {f.name}"
        assert TTL_S - KEEPALIVE_S - SLACK_S <= drop_s <= TTL_S + SLACK_S, (f.name, drop_s)
    assert expiries.between(*redis_kill_window) == [], "the agent dropped its decision while only Redis was down"
    assert report["num_expired"] == len(expiries.times_s) == 3, (report["num_expired"], expiries.times_s)
    # The step trace: EB under each pinned N in turn, stock steps in between for faults 1-3 only.
    steps = [s for s in report["steps"] if s["total_tokens"] > 0]
    starts = [_first_step(steps, n) for n in PINNED_N]
    assert starts[:4] == sorted(starts[:4]) and starts[3] < len(steps), starts
    for f, (begin, end) in zip(faults, itertools.pairwise(starts), strict=True):
        stock = [s for s in steps[begin:end] if s["mode"] == "passthrough"]
        assert bool(stock) == (f is not faults[3]), (f.name, len(stock))
    # The controller brings its Redis back: operator writes work again.
    assert set_delta_after_redis_kill_s, "SetDelta still failed 30 s after the embedded redis-server was killed"
    assert all(f.acked_s for f in faults), [f.name for f in faults if not f.acked_s]

    late = {f.name: round(f.recovery_s, 2) for f in faults if f.recovery_s > RECOVERY_GOAL_S}
    if late:
        pytest.xfail(f"the agent ran the controller's decision more than {RECOVERY_GOAL_S} s after the controller "
                     f"was reachable again (seconds): {late}")


def _drop_after(expiries: LineTimes | None, fault: Fault) -> float | None:
    """Seconds from the fault to the agent's first drop to stock scheduling after it, if any before recovery."""
    if expiries is None:
        return None
    end_s = fault.acked_s or time.monotonic()
    times = expiries.between(fault.started_s, end_s)
    return round(times[0] - fault.started_s, 3) if times else None
