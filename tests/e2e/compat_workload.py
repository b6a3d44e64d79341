"""Run the vLLM feature-compatibility workload on real engines (CPU build, tiny random model), stock or agent.

Used by tests/e2e/test_agent_compat.py as a separate process (vLLM spawns its EngineCore, so this needs its
own `__main__`). Two engines are built one after the other in this process:

- `main`: priority scheduling, prefix caching, chunked prefill (512-token budget), a small KV cache (48 blocks
  of 128 tokens) so that the preemption feature preempts, and a character-level tokenizer so that structured
  output works without downloads. Features: prefix_caching, chunked_prefill, n_gt_1, logprobs, priority,
  abort, preemption, structured_output.
- `spec`: the same model with ngram speculative decoding (3 draft tokens). Feature: speculation.

With `--agent ADDRESS` each engine carries the agent (engine ids `compat-main` / `compat-spec`, a report with
the step trace per engine) and runs the feature set once per phase (`--phases`), each phase started by a
`go-<engine>-<phase>` file the test writes once the controller's decision for that phase is ACKed; stock
runs one phase, `stock`, without waiting. Results: `result-<engine>-<phase>.json`, per feature the generated
token ids (and logprobs, texts) of every request, all greedy or seeded.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MAIN_FEATURES = ("prefix_caching", "chunked_prefill", "n_gt_1", "logprobs", "priority", "abort", "preemption",
                 "structured_output")
SPEC_FEATURES = ("speculation",)


def _prompt(seed: int, length: int) -> Any:
    from vllm.inputs import TokensPrompt

    # Token ids ≥ 96 (the tokenizer's filler words): valid for the model, never its <eos>.
    return TokensPrompt(prompt_token_ids=[96 + (seed * 7919 + i * 104729) % 900 for i in range(length)])


def _greedy(max_tokens: int, **extra: Any) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0, **extra)


def _tokens(outputs: list[Any]) -> list[list[list[int]]]:
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def prefix_caching(llm: Any, tag: str) -> dict[str, Any]:
    shared = list(_prompt(1, 300)["prompt_token_ids"])
    prompts = [{"prompt_token_ids": shared + list(_prompt(100 + i, 20 + 5 * i)["prompt_token_ids"])} for i in range(6)]
    first = llm.generate(prompts[:1], _greedy(16), use_tqdm=False)
    rest = llm.generate(prompts[1:], _greedy(16), use_tqdm=False)  # the shared prefix is cached by now
    return {"tokens": _tokens(first + rest), "cached_tokens": [o.num_cached_tokens or 0 for o in rest]}


def chunked_prefill(llm: Any, tag: str) -> dict[str, Any]:
    prompts = [_prompt(200 + i, 600 + 90 * i) for i in range(4)]  # > the 512-token step budget
    return {"tokens": _tokens(llm.generate(prompts, _greedy(12), use_tqdm=False))}


def n_gt_1(llm: Any, tag: str) -> dict[str, Any]:
    """n = 3 completions per prompt (one parent request fanned out into three). Deterministic through top_k = 1
    at temperature 1 (vLLM refuses n > 1 with greedy sampling, and the CPU build refuses seeded sampling:
    "CPU Generator does not use offset") up to ties: where the top two logits are equal within bf16 rounding,
    the batch row decides, even between a prompt's own samples on some CPUs. The top-2 logprobs of every
    position let the test tell such a tie from a corrupted sample."""
    from vllm import SamplingParams

    prompts = [_prompt(300 + i, 40 + 10 * i) for i in range(4)]
    params = SamplingParams(n=3, max_tokens=12, ignore_eos=True, temperature=1.0, top_k=1, logprobs=2)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return {"tokens": _tokens(outputs),
            "top_logprobs": [[[{str(t): lp.logprob for t, lp in step.items()} for step in c.logprobs]
                              for c in o.outputs] for o in outputs]}


def logprobs(llm: Any, tag: str) -> dict[str, Any]:
    prompts = [_prompt(400 + i, 30 + 20 * i) for i in range(4)]
    outputs = llm.generate(prompts, _greedy(8, logprobs=3, prompt_logprobs=2), use_tqdm=False)
    return {
        "tokens": _tokens(outputs),
        "logprobs": [[{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
                     for o in outputs],
        "prompt_logprobs": [[{str(t): lp.logprob for t, lp in step.items()} if step else {} for step in
                             o.prompt_logprobs] for o in outputs],
    }


def priority(llm: Any, tag: str) -> dict[str, Any]:
    prompts = [_prompt(500 + i, 50 + 30 * i) for i in range(10)]
    outputs = llm.generate(prompts, _greedy(10), priority=[i % 3 for i in range(10)], use_tqdm=False)
    return {"tokens": _tokens(outputs)}


def abort(llm: Any, tag: str) -> dict[str, Any]:
    """Requests aborted mid-generation; the others must come out as they do stock."""
    engine = llm.llm_engine
    ids = [f"abort-{tag}-{i}" for i in range(8)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, _prompt(600 + i, 60 + 20 * i), _greedy(24))
    to_abort = set(ids[1::2])
    aborted = False
    finished: dict[str, list[int]] = {}
    generated: dict[str, int] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated[output.request_id] = len(output.outputs[0].token_ids)
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
        if not aborted and max(generated.values(), default=0) >= 4:
            engine.abort_request(sorted(to_abort - set(finished)))
            aborted = True
    kept = [finished[i] for i in ids if i not in to_abort]
    return {"tokens": kept, "num_finished_aborted": len([i for i in to_abort if i in finished and
                                                         len(finished[i]) == 24])}


def preemption(llm: Any, tag: str) -> dict[str, Any]:
    prompts = [_prompt(700 + i, 250 + 10 * i) for i in range(14)]  # ≈ 14 × 550 tokens > the 6144-token KV
    return {"tokens": _tokens(llm.generate(prompts, _greedy(300), use_tqdm=False))}


def structured_output(llm: Any, tag: str) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    prompts = [_prompt(800 + i, 30 + 7 * i) for i in range(4)]
    choice = SamplingParams(max_tokens=8, temperature=0.0,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"]))
    regex = SamplingParams(max_tokens=12, temperature=0.0,
                           structured_outputs=StructuredOutputsParams(regex=r"[a-c]{3}-[0-9]{2}"))
    outputs = llm.generate(prompts + prompts, [choice] * 4 + [regex] * 4, use_tqdm=False)
    return {"tokens": _tokens(outputs), "texts": [o.outputs[0].text for o in outputs]}


def speculation(llm: Any, tag: str) -> dict[str, Any]:
    prompts = [_prompt(900 + i, 40 + 60 * i) for i in range(10)]
    return {"tokens": _tokens(llm.generate(prompts, _greedy(40), use_tqdm=False))}


FEATURES = {f.__name__: f for f in (prefix_caching, chunked_prefill, n_gt_1, logprobs, priority, abort, preemption,
                                     structured_output, speculation)}


def _engine(kind: str, args: argparse.Namespace) -> Any:
    from vllm import LLM

    extra: dict[str, Any] = {} if not args.agent else {"scheduler_cls": "agents.vllm.ControlledScheduler"}
    if kind == "main":
        extra.update(scheduling_policy="priority", num_gpu_blocks_override=48, enable_prefix_caching=True)
    else:
        extra["speculative_config"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                       "prompt_lookup_min": 2}
    model_dir = args.model_dir if kind == "main" else args.spec_model_dir
    return LLM(model=str(model_dir), tokenizer=str(args.tokenizer_dir), enforce_eager=True,
               gpu_memory_utilization=0.3, max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=512,
               dtype="bfloat16", seed=0, disable_log_stats=True, **extra)


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {path.name} within {timeout_s} s")
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--spec-model-dir", type=Path, required=True, help="a model whose greedy output repeats "
                        "(n-gram drafts get proposed)")
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--agent", default="", help="controller address: attach the agent")
    parser.add_argument("--engines", default="main,spec")
    parser.add_argument("--phases", default="eb,mb", help="agent phases per engine (stock runs one: stock)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, str(ROOT))
    from tests.e2e.cpu_platform import adjust_cpu_platform

    adjust_cpu_platform(single_process_executor=True)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",") if args.agent else ["stock"]
    for kind in args.engines.split(","):
        if args.agent:
            os.environ.update(CP_CONTROLLER_ADDRESS=args.agent, CP_ENGINE_ID=f"compat-{kind}",
                              CP_POOL_MODEL="tiny-qwen2", CP_BATCH_INTERVAL_S="0.2", CP_AGENT_REPORT_INTERVAL_S="1",
                              CP_AGENT_REPORT=str(out / f"report-{kind}.json"), CP_STEP_TRACE="1")
        llm = _engine(kind, args)
        (out / f"ready-{kind}").write_text("ready")
        for phase in (phases if kind == "main" else phases[::-1]):
            if args.agent:
                _wait_for(out / f"go-{kind}-{phase}", 300)
            names = MAIN_FEATURES if kind == "main" else SPEC_FEATURES
            results = {name: FEATURES[name](llm, f"{kind}-{phase}") for name in names}
            (out / f"result-{kind}-{phase}.json").write_text(json.dumps(results))
        del llm
        gc.collect()
        time.sleep(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
