"""Run one real vLLM engine (CPU build, tiny random model) through a token-prompt workload.

Used by the e2e tests and the agent benchmark as a separate process (vLLM spawns its EngineCore, so
this needs its own `__main__`). It writes a JSON result: whether every request produced exactly its
max_tokens, the elapsed time and token counts. With --address the agent is attached
(`--scheduler-cls agents.vllm.ControlledScheduler`); without it the engine is stock vLLM.
With --ready-file/--go-file it signals when the engine is built and waits before generating, so a
test can set operator overrides first. With --kv-role the engine is one side of disaggregated prefill/decode
through vLLM's ExampleConnector (prompts' KV saved to and loaded from --kv-storage); --first-token-only asks
for one token per request (what a proxy asks a prefill instance for), --token-ids writes every request's
tokens, and --hold-file keeps the engine (and its agent) up after the result until that file exists. With
--single-process-executor the model runs in EngineCore's process, with one thread (tests/e2e/cpu_platform.py: the
e2e tests' engines, a start-up about 12 s shorter here).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--address", default="")
    parser.add_argument("--engine-id", default="e2e-engine")
    parser.add_argument("--report", type=Path)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--single-process-executor", action="store_true",
                        help="the model in EngineCore's process (tests/e2e/cpu_platform.py)")
    parser.add_argument("--stock", action="store_true", help="no scheduler class at all (baseline)")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--prompt-tokens", default="16,400", help="min,max prompt length")
    parser.add_argument("--output-tokens", default="8,64", help="min,max output length")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--go-file", type=Path)
    parser.add_argument("--batch-interval-s", default="0.2")
    parser.add_argument("--step-trace", action="store_true", help="record every step in the agent report")
    parser.add_argument("--log-stats", action="store_true", help="per-request timings (TTFT, TPOT)")
    parser.add_argument("--num-kv-blocks", type=int, default=0,
                        help="KV cache size in blocks (vLLM's num_gpu_blocks_override; 0: from the memory budget)")
    parser.add_argument("--max-num-active-seqs", type=int, default=0,
                        help="vLLM's own admission cap (--max-num-active-seqs; 0: max_num_seqs)")
    parser.add_argument("--report-interval-s", default="", help="CP_AGENT_REPORT_INTERVAL_S (default: the agent's)")
    parser.add_argument("--kv-role", choices=("kv_producer", "kv_consumer"), help="disaggregated prefill/decode side")
    parser.add_argument("--kv-storage", type=Path, help="the ExampleConnector's shared storage directory")
    parser.add_argument("--first-token-only", action="store_true", help="max_tokens=1 for every request")
    parser.add_argument("--no-chunked-prefill", action="store_true", help="every prompt computed in one step")
    parser.add_argument("--token-ids", action="store_true", help="write every request's token ids")
    parser.add_argument("--hold-file", type=Path, help="after the result, wait (≤ 120 s) for this file to exist")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, str(ROOT))
    if args.address:
        os.environ["CP_CONTROLLER_ADDRESS"] = args.address
        os.environ["CP_ENGINE_ID"] = args.engine_id
        os.environ["CP_POOL_MODEL"] = "tiny-qwen2"
        os.environ["CP_BATCH_INTERVAL_S"] = args.batch_interval_s
        if args.report:
            os.environ["CP_AGENT_REPORT"] = str(args.report)
            if args.step_trace:
                os.environ["CP_STEP_TRACE"] = "1"
            if args.report_interval_s:
                os.environ["CP_AGENT_REPORT_INTERVAL_S"] = args.report_interval_s

    from tests.e2e.cpu_platform import adjust_cpu_platform

    adjust_cpu_platform(async_scheduling=args.async_scheduling, single_process_executor=args.single_process_executor)

    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from tests.e2e.workload_signals import ready_then_wait_for_go, wait_for_file

    extra: dict[str, object] = {} if args.stock else {"scheduler_cls": "agents.vllm.ControlledScheduler"}
    if args.num_kv_blocks:
        extra["num_gpu_blocks_override"] = args.num_kv_blocks
    if args.max_num_active_seqs:
        extra["max_num_active_seqs"] = args.max_num_active_seqs
    if args.no_chunked_prefill:
        extra["enable_chunked_prefill"] = False
    if args.kv_role:
        from vllm.config import KVTransferConfig

        extra["kv_transfer_config"] = KVTransferConfig(
            kv_connector="ExampleConnector", kv_role=args.kv_role,
            kv_connector_extra_config={"shared_storage_path": str(args.kv_storage)})
    llm = LLM(model=str(args.model_dir), skip_tokenizer_init=True, enforce_eager=True, gpu_memory_utilization=0.3,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, dtype="bfloat16", seed=args.seed,
              disable_log_stats=not args.log_stats, **extra)
    rng = np.random.default_rng(args.seed)
    p_lo, p_hi = (int(x) for x in args.prompt_tokens.split(","))
    o_lo, o_hi = (int(x) for x in args.output_tokens.split(","))
    prompt_lengths = rng.integers(p_lo, p_hi + 1, args.num_requests)
    output_lengths = rng.integers(o_lo, o_hi + 1, args.num_requests)
    prompts = [TokensPrompt(prompt_token_ids=rng.integers(1, 1000, int(n)).tolist()) for n in prompt_lengths]
    if args.first_token_only:
        output_lengths = np.ones_like(output_lengths)
    params = [SamplingParams(max_tokens=int(n), ignore_eos=True, detokenize=False, temperature=0.0)
              for n in output_lengths]
    if not ready_then_wait_for_go(args.ready_file, args.go_file, timeout_s=120):
        return 2
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed_s = time.perf_counter() - started
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    result = {
        "num_requests": args.num_requests,
        "all_exact": lengths == [int(n) for n in output_lengths],
        "num_output_tokens": int(sum(lengths)),
        "num_prompt_tokens": int(prompt_lengths.sum()),
        "elapsed_s": elapsed_s,
        "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
        "first_tokens": [list(o.outputs[0].token_ids[:4]) for o in outputs[:20]],
    }
    if args.token_ids:
        result["token_ids"] = [list(o.outputs[0].token_ids) for o in outputs]
        result["prompt_tokens"] = [int(n) for n in prompt_lengths]
    if args.log_stats:
        stats = [o.metrics for o in outputs if o.metrics is not None]
        result["ttft_mean_s"] = float(np.mean([m.first_token_latency for m in stats]))
        tpot = [(m.last_token_ts - m.first_token_ts) / max(1, m.num_generation_tokens - 1) for m in stats]
        result["tpot_mean_s"] = float(np.mean(tpot))
        result["ttft_median_s"] = float(np.median([m.first_token_latency for m in stats]))
        result["tpot_median_s"] = float(np.median([t for t, m in zip(tpot, stats, strict=True)
                                                   if m.num_generation_tokens >= 2]))
        result["num_with_stats"] = len(stats)
    args.result.write_text(json.dumps(result))
    if args.hold_file:
        wait_for_file(args.hold_file, timeout_s=120, poll_s=0.1)
    del llm
    time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
