"""The agent as an operator installs it: from the built wheel, attached to a real vLLM CPU engine.

The wheel is built from a copy of the sources (`tests/wheel_build.py`, as the release workflow builds it) and
installed without dependencies into a directory of its own; a vLLM OpenAI server (`tests/e2e/openai_server.py`:
the tiny random-weight model, `--scheduler-cls agents.vllm.ControlledScheduler`) runs outside the checkout with
that directory first on its path, so the scheduler class and everything it imports come from the wheel, and
vLLM, torch and gRPC from this environment. It must attach to a real controller with the probe's full verdict,
take and acknowledge its decisions, and serve completions.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

import controlplane
from controlplane.api.v1 import agent_pb2, operator_pb2, operator_pb2_grpc
from testbench.serve_process import ServeProcess
from tests.deploy.processes import wait_for
from tests.e2e.openai_server import complete, openai_server
from tests.wheel_build import REPO, build_wheel

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = "tiny-qwen2"
ENGINE_ID = "wheel-engine"


def _install(wheel: Path, target: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                             "--no-input", "--no-deps", "--target", str(target), str(wheel)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr


def test_the_agent_from_the_wheel_attaches_a_vllm_engine_and_takes_its_decisions(tiny_model: Path,
                                                                                   tmp_path: Path) -> None:
    site, outside = tmp_path / "site", tmp_path / "run"
    outside.mkdir()
    _install(build_wheel(tmp_path / "wheel"), site)
    env = {"PYTHONPATH": str(site)}
    located = subprocess.run(
        [sys.executable, "-c", "import agents.vllm, controlplane; print(agents.vllm.__file__); "
         "print(controlplane.__file__)"], cwd=outside, env=os.environ | env, capture_output=True, text=True,
        timeout=120, check=True).stdout.split()
    assert len(located) == 2 and all(Path(path).is_relative_to(site) for path in located), located
    assert not any(Path(path).is_relative_to(REPO) for path in located)

    controller = ServeProcess.start(tmp_path / "data", log_path=tmp_path / "controller.log")
    try:
        with openai_server(tiny_model, tmp_path / "server.log", served_model_name=MODEL, cwd=outside,
                           env=env | {"CP_CONTROLLER_ADDRESS": controller.address, "CP_ENGINE_ID": ENGINE_ID}
                           ) as base_url, grpc.insecure_channel(controller.address) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)

            def attached() -> operator_pb2.EngineInfo | None:
                engines = stub.ListEngines(operator_pb2.ListEnginesRequest(), timeout=5.0).engines
                found = [e for e in engines if e.engine_id == ENGINE_ID and e.connected and e.acked_version >= 1]
                return found[0] if found else None

            info = wait_for(attached, timeout_s=60, what="the engine attached with a decision acknowledged")
            assert info.agent_version == controlplane.__version__ and info.pool.model == MODEL
            assert info.support.level == agent_pb2.SUPPORT_LEVEL_FULL, info.support
            answers = [complete(base_url, MODEL, [1 + (3 * i + j) % 500 for j in range(24)], max_tokens=8)
                       for i in range(3)]
            assert [a["usage"]["completion_tokens"] for a in answers] == [8, 8, 8]

            def reported() -> operator_pb2.EngineInfo | None:
                (engine,) = [e for e in stub.ListEngines(operator_pb2.ListEnginesRequest(), timeout=5.0).engines
                             if e.engine_id == ENGINE_ID]
                return engine if engine.num_completions >= 3 else None

            assert wait_for(reported, timeout_s=30, what="the completions reported").num_rejected_events == 0
    finally:
        controller.stop()
