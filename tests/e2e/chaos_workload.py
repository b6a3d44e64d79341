"""Run one real vLLM engine (CPU build, tiny random model) with the agent under a saturating closed-loop load
until told to stop: the engine side of the chaos e2e test.

Keeps --concurrency requests in flight (more than --max-num-seqs, so requests always wait and the
scheduler is never idle), each with ignore_eos and its own max_tokens drawn uniformly from --max-tokens
(a range, so that completions spread over time instead of arriving in waves of one batch), until
--stop-file appears or --max-requests were submitted; then lets every submitted request finish. Writes a
JSON result: requests submitted and finished, the finish reasons, every output length that was not the
request's own max_tokens, and the
CLOCK_MONOTONIC time at which each request finished (system-wide on Linux, so the test can line the
completions up with the faults it injected). With --ready-file/--go-file it signals when the engine is
built and waits before generating. The agent's environment (CP_*) is the caller's, plus the address. The model
runs in EngineCore's process (tests/e2e/cpu_platform.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--address", required=True, help="the controller (or a proxy in front of it)")
    parser.add_argument("--engine-id", default="chaos")
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--go-file", type=Path, required=True)
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--max-tokens", default="64", help="max_tokens, or a min,max range drawn per request")
    parser.add_argument("--prompt-tokens", default="16,128", help="min,max prompt length")
    parser.add_argument("--max-requests", type=int, default=5000)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--batch-interval-s", default="0.2")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, str(ROOT))
    os.environ.update(CP_CONTROLLER_ADDRESS=args.address, CP_ENGINE_ID=args.engine_id, CP_POOL_MODEL="tiny-qwen2",
                      CP_BATCH_INTERVAL_S=args.batch_interval_s, CP_AGENT_REPORT=str(args.report), CP_STEP_TRACE="1")

    from tests.e2e.cpu_platform import adjust_cpu_platform

    adjust_cpu_platform(single_process_executor=True)

    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    from tests.e2e.workload_signals import ready_then_wait_for_go

    llm = LLM(model=str(args.model_dir), skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.3,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, dtype="bfloat16", seed=args.seed,
              disable_log_stats=True, scheduler_cls="agents.vllm.ControlledScheduler")
    engine = llm.llm_engine
    rng = np.random.default_rng(args.seed)
    p_lo, p_hi = (int(x) for x in args.prompt_tokens.split(","))
    bounds = [int(x) for x in args.max_tokens.split(",")]
    t_lo, t_hi = bounds[0], bounds[-1]
    if not ready_then_wait_for_go(args.ready_file, args.go_file, timeout_s=300):
        return 2

    in_flight: dict[str, int] = {}  # request id → its max_tokens
    wrong_lengths: dict[str, int] = {}
    finish_reasons: collections.Counter[str] = collections.Counter()
    finish_times_s: list[float] = []
    unknown_ids: list[str] = []
    num_submitted = 0
    started_s = time.monotonic()
    stopping = False
    while True:
        stopping = stopping or num_submitted >= args.max_requests or args.stop_file.exists()
        while not stopping and len(in_flight) < args.concurrency:
            request_id = f"r{num_submitted}"
            prompt = TokensPrompt(prompt_token_ids=rng.integers(1, 1000, int(rng.integers(p_lo, p_hi + 1))).tolist())
            max_tokens = int(rng.integers(t_lo, t_hi + 1))
            engine.add_request(request_id, prompt, SamplingParams(
                max_tokens=max_tokens, ignore_eos=True, detokenize=False, temperature=0.0,
                output_kind=RequestOutputKind.FINAL_ONLY))
            in_flight[request_id] = max_tokens
            num_submitted += 1
        if not in_flight:
            break
        for output in engine.step():
            if not output.finished:
                continue
            if output.request_id not in in_flight:
                unknown_ids.append(output.request_id)
                continue
            max_tokens = in_flight.pop(output.request_id)
            completion = output.outputs[0]
            finish_reasons[str(completion.finish_reason)] += 1
            finish_times_s.append(time.monotonic())
            if len(completion.token_ids) != max_tokens:
                wrong_lengths[output.request_id] = len(completion.token_ids)
    result = {
        "num_submitted": num_submitted,
        "num_finished": len(finish_times_s),
        "max_tokens": [t_lo, t_hi],
        "wrong_lengths": wrong_lengths,
        "finish_reasons": dict(finish_reasons),
        "unknown_ids": unknown_ids[:20],
        "started_s": started_s,
        "elapsed_s": time.monotonic() - started_s,
        "finish_times_s": finish_times_s,
    }
    args.result.write_text(json.dumps(result))
    del llm
    time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
