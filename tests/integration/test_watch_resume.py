"""`ctl watch` across a controller restart: the stream ends UNAVAILABLE, ctl reconnects by itself and resumes
from the last decision it showed (WatchDecisions since_s), so the decision made while it was away is shown,
once. A real `controlplane serve` on a real redis-server, restarted on the same port."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc

from controlplane.api.v1 import common_pb2
from testbench.net import free_port
from testbench.serve_process import ServeProcess
from tests.deploy.processes import http_text, wait_for
from tests.integration.controller_harness import AgentStream

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")


async def _one_decision(address: str, engine_id: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        agent = await AgentStream(channel, engine_id, POOL).open()
        decision = await agent.next_decision(timeout_s=60.0)  # a loaded machine: the test is about resuming
        await agent.close()
        return decision.version


def test_ctl_watch_resumes_after_a_controller_restart(tmp_path: Path, redis_url: str) -> None:
    port, metrics_port = free_port(), free_port()
    serve_args = ("--redis-url", redis_url, "--metrics-port", str(metrics_port))
    controller = ServeProcess.start(tmp_path / "data", log_path=tmp_path / "serve.log", args=serve_args, port=port)
    env = {**os.environ, "CP_ADDRESS": f"127.0.0.1:{port}"}
    watch = subprocess.Popen([sys.executable, "-m", "controlplane", "ctl", "watch", "-o", "json", "--max-events", "2",
                              "--engine-id", "engine-w"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        # ctl has subscribed (its snapshot, empty, prints nothing): the controller counts its watch.
        wait_for(lambda: True if "cp_decision_watchers 1.0" in http_text(
            f"http://127.0.0.1:{metrics_port}/metrics") else None, timeout_s=60, what="ctl watch's subscription")
        first = asyncio.run(_one_decision(controller.address, "engine-w"))
        controller.stop()
        controller = ServeProcess.start(tmp_path / "data", log_path=tmp_path / "serve.log", args=serve_args,
                                        port=port)
        second = asyncio.run(_one_decision(controller.address, "engine-w"))
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
        controller.stop()
    assert watch.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["event"], e["decision_version"]) for e in events] == [("pushed", first), ("pushed", second)]
    assert second > first
    assert "resuming from" in err
