"""The vLLM support verdict end to end: real vLLM schedulers with the agent, a real controller over loopback
gRPC, a real redis-server, and `controlplane ctl list`.

- an engine on the supported vLLM says full, one whose vLLM lacks an internal says stock and names it; the
  controller keeps both verdicts on the engine records, lists them (ListEngines, `ctl list`'s VLLM column,
  `-o json`), counts them in `cp_engines_by_support`, and sends the stock engine no decision (it is decided
  for, never NACKed, never counted as rejected);
- a Hello whose verdict is hostile is refused (INVALID_ARGUMENT, bad_hello) and the engine is not listed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

pytest.importorskip("vllm", reason="the vllm extra is part of the project's set-up (make test installs it)")

from vllm.v1.core.sched.scheduler import Scheduler

from agents.vllm.probe import INTERNALS
from agents.vllm.scheduler import with_agent
from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.cli.main import main as cli_main
from testbench.fuzz_messages import LiveAgent
from tests.integration.controller_harness import LIMITS, make_config, operator_stub, running_controller
from tests.unit.test_agent_scheduler import make_scheduler, model_dir
from tests.unit.test_vllm_probe import _engine_class, engines

__all__ = ["engines", "model_dir"]  # fixtures shared with the unit tests
POOL_KEY = "tiny|cpu"
ACTIVE_CAP = next(internal for internal in INTERNALS if internal.name == "Scheduler.max_num_active_reqs")


def _sample(ctl: Any, name: str, labels: dict[str, str]) -> float | None:
    return ctl.app.metrics.registry.get_sample_value(name, labels)


async def _until(predicate, *, timeout_s: float = 15.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.05)


async def test_the_controller_keeps_lists_and_counts_each_engines_verdict(
        redis_url: str, model_dir: Path, engines: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        monkeypatch.setenv("CP_CONTROLLER_ADDRESS", ctl.address)
        monkeypatch.setenv("CP_POOL_MODEL", "tiny")
        monkeypatch.setenv("CP_POOL_ACCELERATOR", "cpu")
        monkeypatch.setenv("CP_BATCH_INTERVAL_S", "0.1")
        monkeypatch.setenv("CP_ENGINE_ID", "engine-full")
        engines.append(full := make_scheduler(with_agent(Scheduler), model_dir))
        monkeypatch.setenv("CP_ENGINE_ID", "engine-stock")
        engines.append(stock := make_scheduler(_engine_class(ACTIVE_CAP, "missing"), model_dir))
        assert full.cp_agent is not None and stock.cp_agent is None and stock.cp_stock_reporter is not None
        stub = operator_stub(channel)

        async def listed() -> dict[str, operator_pb2.EngineInfo]:
            engines = (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines
            infos = {info.engine_id: info for info in engines}
            both = (len(infos) == 2 and all(info.telemetry_age_s >= 0 for info in infos.values())
                    and infos["engine-full"].acked_version > 0)
            return infos if both else {}

        infos = await _until(listed)
        assert set(infos) == {"engine-full", "engine-stock"}, infos
        full_info, stock_info = infos["engine-full"], infos["engine-stock"]
        assert full_info.support == agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_FULL)
        assert stock_info.support.level == agent_pb2.SUPPORT_LEVEL_STOCK
        assert list(stock_info.support.missing) == ["Scheduler.max_num_active_reqs"]
        assert "max_num_active_reqs is missing" in stock_info.support.detail
        assert full_info.vllm_version == stock_info.vllm_version == "0.32.0"
        # The stock engine is decided for (what it would run) but sent nothing: no ACK, no rejection.
        assert stock_info.decision_version > 0 and stock_info.acked_version == 0
        assert stock.cp_stock_reporter.link.num_decisions_received == 0
        assert stock.cp_stock_reporter.num_ignored == 0
        assert (_sample(ctl, "cp_decision_acks_total", {"result": "rejected"}) or 0.0) == 0.0
        assert (stock.max_num_scheduled_tokens, stock.max_num_active_reqs) == (512, 8)
        for level in ("full", "stock"):
            assert _sample(ctl, "cp_engines_by_support", {"pool": POOL_KEY, "level": level}) == 1.0
        record = ctl.app.controller.fleet.engine("engine-stock")
        assert record.loop.hello.support.level == "stock"  # kept on the engine record

        capsys.readouterr()
        address = ctl.address
        assert await asyncio.to_thread(cli_main, ["ctl", "--address", address, "list"]) == 0
        table = capsys.readouterr().out.splitlines()
        assert "VLLM" in table[0].split()
        rows = {line.split()[0]: line for line in table[1:]}
        assert "0.32.0 full" in rows["engine-full"] and "0.32.0 stock" in rows["engine-stock"]
        assert await asyncio.to_thread(cli_main, ["ctl", "--address", address, "-o", "json", "list"]) == 0
        listed_json = {e["engine_id"]: e for e in json.loads(capsys.readouterr().out)["engines"]}
        assert listed_json["engine-stock"]["support"] == {
            "level": "stock", "missing": ["Scheduler.max_num_active_reqs"], "detail": stock_info.support.detail}
        assert listed_json["engine-full"]["support"]["level"] == "full"

        engines.remove(stock)
        stock.shutdown()  # the stream ends: its series goes

        async def stock_gone() -> bool:
            return _sample(ctl, "cp_engines_by_support", {"pool": POOL_KEY, "level": "stock"}) is None

        assert await _until(stock_gone)
        assert _sample(ctl, "cp_engines_by_support", {"pool": POOL_KEY, "level": "full"}) == 1.0


async def test_a_hostile_verdict_is_refused_at_hello_and_the_engine_is_not_listed(redis_url: str) -> None:
    pool = common_pb2.Pool(model="tiny", accelerator="cpu")
    cases = [
        ("hello.support.missing", agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_STOCK,
                                                         missing=["Scheduler.x"] * 10_000)),
        ("hello.support.missing[0]", agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_STOCK,
                                                            missing=["x" * 1_000_000])),
        ("hello.support.detail", agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_STOCK,
                                                        detail="\x1b[2J\nforged line")),
        ("hello.support.level", agent_pb2.AgentSupport(level=42)),
    ]
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        for index, (field, support) in enumerate(cases, start=1):
            hello = agent_pb2.Hello(engine_id=f"e-{index}", pool=pool, vllm_version="0.33.0", agent_version="x",
                                    limits=LIMITS, support=support)
            agent = await LiveAgent(channel, hello).open()
            assert await agent.finished() == grpc.StatusCode.INVALID_ARGUMENT
            assert agent.details.startswith(field) and len(agent.details) <= 200, agent.details
            assert _sample(ctl, "cp_rejections_total", {"cause": "bad_hello"}) == index
        assert len((await operator_stub(channel).ListEngines(operator_pb2.ListEnginesRequest())).engines) == 0
        assert _sample(ctl, "cp_engines_by_support", {"pool": POOL_KEY, "level": "stock"}) is None
