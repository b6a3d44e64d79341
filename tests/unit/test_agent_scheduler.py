"""The agent's scheduler hooks on a real vLLM `Scheduler` built from tiny configs (no engine, no model run).

As vLLM's own scheduler tests do, steps are driven by hand: `schedule()`, then `update_from_output()` with a
hand-made `ModelRunnerOutput` (one sampled token per scheduled request, drafts through
`update_draft_token_ids`). The agent is attached with `with_agent(...)` and a controller address on a closed
port (so it runs on its own, as before a first decision); decisions are held through the runtime's enforcer.
Changed vLLM internals are simulated by scheduler subclasses that delete, rename or retype an attribute.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="the vllm extra is part of the project's set-up (make test installs it)")

import torch
from transformers import Qwen2Config
from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from agents.vllm.scheduler import ControlledAsyncScheduler, ControlledSyncScheduler, with_agent
from controlplane.api.v1 import common_pb2

BLOCK = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 config on disk (the scheduler reads the model's config, never its weights)."""
    directory = tmp_path_factory.mktemp("tiny-qwen2-config")
    Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096).save_pretrained(directory)
    return directory


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, unreachable_port: int) -> Path:
    """The agent on, its controller unreachable (a port that refuses); returns the report path."""
    report = tmp_path / "agent_report.json"
    monkeypatch.setenv("CP_CONTROLLER_ADDRESS", f"127.0.0.1:{unreachable_port}")
    monkeypatch.setenv("CP_ENGINE_ID", "unit-engine")
    monkeypatch.setenv("CP_POOL_MODEL", "tiny")
    monkeypatch.setenv("CP_POOL_ACCELERATOR", "cpu")
    monkeypatch.setenv("CP_AGENT_REPORT", str(report))
    monkeypatch.setenv("CP_AGENT_REPORT_INTERVAL_S", "0.1")
    monkeypatch.setenv("CP_STEP_TRACE", "1")
    return report


def make_scheduler(cls: type, model_dir: Path, *, max_num_seqs: int = 8, max_num_batched_tokens: int = 512,
                   max_num_active_seqs: int | None = None, num_blocks: int = 256,
                   num_speculative_tokens: int = 0) -> Any:
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024)
    scheduler_config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                       max_model_len=1024, max_num_active_seqs=max_num_active_seqs,
                                       is_encoder_decoder=False)
    speculative = None
    if num_speculative_tokens:
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=num_speculative_tokens,
                                        prompt_lookup_max=4, prompt_lookup_min=2, target_model_config=model_config,
                                        target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                             cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
                             speculative_config=speculative)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return cls(vllm_config=vllm_config, kv_cache_config=kv, block_size=BLOCK, log_stats=False,
               structured_output_manager=StructuredOutputManager(vllm_config))


@pytest.fixture
def schedulers() -> Iterator[Callable[..., Any]]:
    """make_scheduler, shutting every scheduler down at the end (stops the agent's threads)."""
    made: list[Any] = []

    def make(cls: type, model_dir: Path, **kwargs: Any) -> Any:
        scheduler = make_scheduler(cls, model_dir, **kwargs)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        scheduler.shutdown()


def add_requests(scheduler: Any, num: int, *, prompt_tokens: int = 40, max_tokens: int = 4) -> None:
    for i in range(num):
        prompt = [1 + (i * 7 + j) % 50 for j in range(prompt_tokens)]
        scheduler.add_request(Request(request_id=f"r{i}", prompt_token_ids=prompt, pooling_params=None,
                                      sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True)))


def run_steps(scheduler: Any, *, max_steps: int = 200, drafts: int = 0) -> list[dict[str, int]]:
    """Drive the scheduler until idle: per step the scheduled tokens and the running count after scheduling.

    Every scheduled request that finished its prompt samples token 7; with `drafts`, every decoding request
    then proposes that many draft tokens, all accepted by the next step's sampling (ngram-like)."""
    steps = []
    for _ in range(max_steps):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        steps.append({"tokens": dict(output.num_scheduled_tokens), "running": len(scheduler.running)})
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for req_id in ids:
            request = scheduler.requests[req_id]
            done_prompt = request.num_computed_tokens >= request.num_prompt_tokens
            accepted = len(output.scheduled_spec_decode_tokens.get(req_id, ()))
            sampled.append([7] * (1 + accepted) if done_prompt else [])
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled))
        if drafts:
            live = [r for r in ids if r in scheduler.requests and not scheduler.requests[r].is_prefill_chunk]
            scheduler.update_draft_token_ids(DraftTokenIds(req_ids=live, draft_token_ids=[[7] * drafts for _ in live]))
    assert not scheduler.has_requests(), "the workload did not finish"
    return steps


def errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("agents")]


# ------------------------------------------------------------------------------------- 1. admission cap


def test_stock_until_the_first_decision_keeps_the_engines_own_active_cap(model_dir: Path, agent_env: Path,
                                                                        schedulers: Callable[..., Any]) -> None:
    """--max-num-active-seqs 2 with 8 slots: stock admits 2 at a time, and so does the agent before any decision."""
    stock = schedulers(Scheduler, model_dir, max_num_active_seqs=2)
    agent = schedulers(with_agent(Scheduler), model_dir, max_num_active_seqs=2)
    assert agent.cp_agent is not None
    for scheduler in (stock, agent):
        add_requests(scheduler, 6)
    stock_steps = run_steps(stock)
    agent_steps = run_steps(agent)
    assert max(s["running"] for s in stock_steps) == 2
    assert agent_steps == stock_steps
    # A decision with N above the engine's own cap does not raise it either.
    decision = common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=8, ttl_s=60)
    assert agent.cp_agent.enforcer.apply(decision, now_s=time.monotonic()) == (True, "")  # the runtime's clock
    add_requests(agent, 6)
    assert max(s["running"] for s in run_steps(agent)) == 2


def test_knobs_another_tool_sets_are_left_alone_until_a_decision_and_after_it(
        model_dir: Path, agent_env: Path, schedulers: Callable[..., Any]) -> None:
    """A runtime tool lowers the token budget and the admission cap between steps: stock vLLM keeps its values,
    and so does the agent while no decision steers the knobs. A decision sets them; when it expires they are
    handed back at their start-up values once, and a tool's later change holds again."""
    stock = schedulers(Scheduler, model_dir)
    agent = schedulers(with_agent(Scheduler), model_dir)
    runtime = agent.cp_agent
    assert runtime is not None
    for scheduler in (stock, agent):
        scheduler.max_num_scheduled_tokens, scheduler.max_num_active_reqs = 64, 3
        add_requests(scheduler, 6)
    stock_steps = run_steps(stock)
    agent_steps = run_steps(agent)
    assert max(s["running"] for s in stock_steps) == 3
    assert max(sum(s["tokens"].values()) for s in stock_steps) <= 64
    assert agent_steps == stock_steps
    assert (agent.max_num_scheduled_tokens, agent.max_num_active_reqs) == (64, 3)

    decision = common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=5, ttl_s=60,
                                   budget=common_pb2.BudgetPolicy(b_max_tokens=256, b_cap_tokens=256))
    assert runtime.enforcer.apply(decision, now_s=time.monotonic()) == (True, "")
    add_requests(agent, 6)
    assert max(s["running"] for s in run_steps(agent)) == 5
    assert (agent.max_num_scheduled_tokens, agent.max_num_active_reqs) == (256, 5)

    assert runtime.enforcer.expire(math.inf)
    add_requests(agent, 1)
    run_steps(agent)
    assert (agent.max_num_scheduled_tokens, agent.max_num_active_reqs) == (512, 8)  # start-up values, once
    agent.max_num_active_reqs = 2
    add_requests(agent, 6)
    assert max(s["running"] for s in run_steps(agent)) == 2


# ----------------------------------------------------------------------------------- 2. probe and faults


class _WithoutInflightPrefills(Scheduler):
    """A vLLM whose scheduler no longer has `_inflight_prefills`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self._inflight_prefills


class _RenamedThrottle(Scheduler):
    """A vLLM whose `schedule` argument was renamed (vLLM itself passes it positionally)."""

    def schedule(self, defer_prefills: bool = False) -> Any:  # type: ignore[override]
        return super().schedule(defer_prefills)


class _RetypedCapacityBound(Scheduler):
    """A vLLM whose `prefill_capacity_bound` became a counter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_capacity_bound = 0


@pytest.mark.parametrize(("cls", "named"), [
    (_WithoutInflightPrefills, "scheduler._inflight_prefills is missing"),
    (_RenamedThrottle, "schedule() takes (self, defer_prefills)"),
    (_RetypedCapacityBound, "scheduler.prefill_capacity_bound is a int, expected bool"),
])
def test_a_missing_or_changed_internal_turns_the_agent_off_with_one_error(
        cls: type, named: str, model_dir: Path, agent_env: Path, schedulers: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    scheduler = schedulers(with_agent(cls), model_dir)
    assert scheduler.cp_agent is None
    [record] = errors(caplog)
    assert named in record.getMessage() and "stock vLLM scheduling" in record.getMessage()
    report = json.loads(agent_env.read_text())
    assert report["agent_state"] == "stock" and named in report["disabled_reason"]
    if cls is _RenamedThrottle:  # vLLM itself still works: the engine runs stock, step for step
        stock = schedulers(Scheduler, model_dir)
        for s in (stock, scheduler):
            add_requests(s, 5)
        assert run_steps(scheduler) == run_steps(stock)
        assert len(errors(caplog)) == 1


def test_a_scheduler_built_without_init_has_no_agent_and_schedules_as_stock(
        model_dir: Path, agent_env: Path, schedulers: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's own tests build some schedulers with `object.__new__` and set their attributes by hand; every
    hook must then run stock (no AttributeError for the agent's own state)."""
    for cls in (ControlledSyncScheduler, ControlledAsyncScheduler):
        assert object.__new__(cls).cp_agent is None
    stock, template = schedulers(Scheduler, model_dir), schedulers(Scheduler, model_dir)
    bare = object.__new__(ControlledSyncScheduler)
    bare.__dict__.update(template.__dict__)  # every attribute vLLM's __init__ set, none of the agent's
    for s in (stock, bare):
        add_requests(s, 5, max_tokens=6)
    assert run_steps(bare) == run_steps(stock)
    bare.shutdown()
    assert errors(caplog) == []


class _LenlessSet(set):
    """A set vLLM can still use (add, discard, iterate) but whose len() fails: a changed internal type."""

    def __len__(self) -> int:
        raise TypeError("len() of an in-flight prefill view")


class _InflightRetypedAfterStart(Scheduler):
    """`_inflight_prefills` changes type after the agent's start-up probe (at the 3rd update)."""

    num_updates = 0

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.num_updates += 1
        if self.num_updates == 3:
            self._inflight_prefills = _LenlessSet(self._inflight_prefills)
        return outputs


def test_an_exception_in_a_hook_switches_to_stock_for_good_and_never_reaches_vllm(
        model_dir: Path, agent_env: Path, schedulers: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    scheduler = schedulers(with_agent(_InflightRetypedAfterStart), model_dir, max_num_batched_tokens=512)
    runtime = scheduler.cp_agent
    assert runtime is not None
    budget = common_pb2.BudgetPolicy(b_max_tokens=300, b_cap_tokens=300)
    assert runtime.enforcer.apply(common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=4, ttl_s=600,
                                                      budget=budget), now_s=time.monotonic()) == (True, "")
    add_requests(scheduler, 8, prompt_tokens=100, max_tokens=6)
    first = scheduler.schedule()
    assert scheduler.max_num_scheduled_tokens == 300 and scheduler.max_num_active_reqs == 4
    ids = list(first.num_scheduled_tokens)
    scheduler.update_from_output(first, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in
                                                                                         enumerate(ids)},
                                                          sampled_token_ids=[[7] for _ in ids]))
    steps = run_steps(scheduler)  # the fault hits in the 3rd step's hook; every request still finishes
    assert scheduler.cp_agent is None
    [record] = errors(caplog)
    assert "before_schedule" in record.getMessage() and "TypeError" in record.getMessage()
    assert scheduler.max_num_scheduled_tokens == 512 and scheduler.max_num_active_reqs == 8  # knobs restored
    assert max(s["running"] for s in steps) > 4  # stock admission after the fault
    report = json.loads(agent_env.read_text())
    assert report["agent_state"] == "stock" and "TypeError" in report["disabled_reason"]


# ------------------------------------------------------------------------------ 4. step composition


def _recorded_steps(runtime: Any) -> list[tuple[int, int, int]]:
    s = runtime.recorder.drain()
    return list(zip(s.prefill_tokens, s.decode_tokens, s.decode_requests, strict=True))


def test_speculative_decode_steps_are_recorded_as_decodes(model_dir: Path, agent_env: Path,
                                                          schedulers: Callable[..., Any]) -> None:
    """8 requests × (1 + 3 draft tokens) per decode step reach the recorder as (prefill 0, decode 32, 8 requests)."""
    scheduler = schedulers(with_agent(Scheduler), model_dir, num_speculative_tokens=3, max_num_batched_tokens=1024)
    add_requests(scheduler, 8, prompt_tokens=40, max_tokens=13)
    steps = run_steps(scheduler, drafts=3)
    recorded = _recorded_steps(scheduler.cp_agent)
    assert len(recorded) == len([s for s in steps if s["tokens"]])  # empty steps are not recorded
    # The prefill samples one token, then 3 steps of 1 + 3 accepted drafts make the 13 tokens.
    assert recorded == [(8 * 40, 0, 0)] + [(0, 32, 8)] * 3
    trace = scheduler.cp_agent.report()["steps"]
    for entry in trace:  # the hook's cheap split equals the exact per-request classification
        assert (entry["recorded_prefill_tokens"], entry["recorded_decode_tokens"],
                entry["recorded_decode_requests"]) == (entry["prefill_tokens"], entry["decode_tokens"],
                                                       entry["num_decode_reqs"])


def test_chunked_prefills_and_preemptions_are_split_exactly(model_dir: Path, agent_env: Path,
                                                            schedulers: Callable[..., Any]) -> None:
    """Long prompts chunked by a small budget, and a KV cache small enough to preempt: every step's recorded
    split equals the exact classification, including the final one-token chunks and resumed requests."""
    scheduler = schedulers(with_agent(Scheduler), model_dir, max_num_batched_tokens=256, num_blocks=40)
    add_requests(scheduler, 12, prompt_tokens=150, max_tokens=150)
    run_steps(scheduler, max_steps=2000)
    trace = scheduler.cp_agent.report()["steps"]
    assert any(e["resumed"] for e in trace) and any(e["preempted"] for e in trace)
    assert any(e["prefill_tokens"] and e["decode_tokens"] for e in trace)  # mixed steps (stock)
    for entry in trace:
        assert (entry["recorded_prefill_tokens"], entry["recorded_decode_tokens"],
                entry["recorded_decode_requests"]) == (entry["prefill_tokens"], entry["decode_tokens"],
                                                       entry["num_decode_reqs"]), entry


# ---------------------------------------------------------------------- 8. running-length histogram


def test_running_lengths_are_sampled_from_the_scheduler_thread(model_dir: Path, agent_env: Path,
                                                               schedulers: Callable[..., Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """At most once per batch interval the hook hands the running requests' output lengths to the recorder."""
    monkeypatch.setenv("CP_BATCH_INTERVAL_S", "0.01")
    scheduler = schedulers(with_agent(Scheduler), model_dir)
    runtime = scheduler.cp_agent
    add_requests(scheduler, 3, max_tokens=50)
    add_requests_long = Request(request_id="long", prompt_token_ids=list(range(1, 30)), pooling_params=None,
                                sampling_params=SamplingParams(max_tokens=50, ignore_eos=True))
    for step in range(6):  # a prefill step, then decodes: 6 output tokens each before the 7th step
        if step == 3:
            scheduler.add_request(add_requests_long)  # joins later: 3 output tokens before the 7th step
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids]))
    runtime.recorder.drain()
    time.sleep(0.02)  # more than one batch interval
    scheduler.schedule()
    sampled = runtime.recorder.drain()
    assert (sampled.running_output_tokens, sampled.running_num_requests) == ([3, 6], [1, 3])
    # each entry's earliest admission: "long" was first scheduled three steps after the others
    late, early = sampled.running_admitted_time_s
    assert runtime.started_at_s <= early < late <= time.time()
    assert runtime.recorder.drain().running_output_tokens == []  # handed over once


def test_each_completion_carries_when_it_was_first_scheduled_and_the_stamps_are_dropped(
        model_dir: Path, agent_env: Path, schedulers: Callable[..., Any]) -> None:
    scheduler = schedulers(with_agent(Scheduler), model_dir, max_num_seqs=2)
    runtime = scheduler.cp_agent
    started_s = time.time()
    add_requests(scheduler, 4, max_tokens=3)  # two slots: r2 and r3 are admitted once r0 and r1 finish
    run_steps(scheduler)
    drained = runtime.recorder.drain()
    assert len(drained.admitted_time_s) == 4
    for admitted_s, finish_s in zip(drained.admitted_time_s, drained.finish_time_s, strict=True):
        assert started_s <= admitted_s <= finish_s
    first, second = drained.admitted_time_s[:2], drained.admitted_time_s[2:]  # in the order they finished
    assert max(first) < min(second)
    assert runtime._admitted_s == {}  # nothing kept for requests that left


# ------------------------------------------------------------------------------ 3. report at exit

_EXIT_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from vllm.v1.core.sched.scheduler import Scheduler
from agents.vllm.scheduler import with_agent
from tests.unit.test_agent_scheduler import add_requests, make_scheduler, run_steps
scheduler = make_scheduler(with_agent(Scheduler), Path({model_dir!r}))
add_requests(scheduler, 3)
run_steps(scheduler)
print("steps", scheduler.cp_agent.num_steps)
# no shutdown(): the interpreter exits with the agent still attached
"""


def test_the_report_is_written_at_interpreter_exit(model_dir: Path, agent_env: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CP_AGENT_REPORT_INTERVAL_S", "3600")  # the timer never fires in this run
    root = str(Path(__file__).resolve().parents[2])
    script = _EXIT_SCRIPT.format(root=root, model_dir=str(model_dir))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    num_steps = int(done.stdout.split("steps", 1)[1].split()[0])
    report = json.loads(agent_env.read_text())
    assert num_steps > 0 and report["num_steps"] == num_steps and report["agent_state"] == "on"
