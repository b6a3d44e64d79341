"""Run one vLLM engine with two data-parallel ranks (CPU build, tiny random model), the agent in each rank.

Used by tests/e2e/test_data_parallel.py as a separate process (vLLM starts an EngineCore process per rank, so this
needs its own `__main__`; each rank's model runs in its EngineCore, `tests/e2e/cpu_platform.py`). The engine is
vLLM's async one (`AsyncLLM`, what `vllm serve --data-parallel-size 2` runs; the offline `LLM` refuses data
parallelism), built with `data_parallel_size=2` and the agent's scheduler class: each rank's EngineCore process
builds its own scheduler, so each rank's agent attaches to the controller on its own, as `<CP_ENGINE_ID>-dp<rank>`.
It serves --num-requests requests (vLLM balances them over the ranks), writes a JSON result (every request's output
length and that all were exact), then keeps the engine (and its agents) up until --hold-file exists (at most 120 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def _run(args: argparse.Namespace) -> dict:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    engine_args = AsyncEngineArgs(
        model=str(args.model_dir), skip_tokenizer_init=True, enforce_eager=True, max_model_len=1024,
        max_num_seqs=16, max_num_batched_tokens=1024, dtype="bfloat16", seed=0, disable_log_stats=True,
        data_parallel_size=args.data_parallel_size, scheduler_cls="agents.vllm.ControlledScheduler")
    llm = AsyncLLM.from_engine_args(engine_args)
    try:
        async def one(index: int) -> int:
            prompt = TokensPrompt(prompt_token_ids=[1 + (index * 7919 + i * 104729) % 900 for i in range(64)])
            params = SamplingParams(max_tokens=8 + index % 8, ignore_eos=True, detokenize=False, temperature=0.0)
            final = None
            async for output in llm.generate(prompt, params, request_id=f"r{index}"):
                final = output
            return len(final.outputs[0].token_ids)

        lengths = await asyncio.gather(*(one(i) for i in range(args.num_requests)))
        result = {"num_requests": args.num_requests, "lengths": lengths,
                  "all_exact": lengths == [8 + i % 8 for i in range(args.num_requests)]}
        args.result.write_text(json.dumps(result))
        deadline = time.monotonic() + 120
        while not args.hold_file.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return result
    finally:
        llm.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--hold-file", type=Path, required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--engine-id", default="e2e-dp")
    parser.add_argument("--data-parallel-size", type=int, default=2)
    parser.add_argument("--num-requests", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.update({"CP_CONTROLLER_ADDRESS": args.address, "CP_ENGINE_ID": args.engine_id,
                       "CP_POOL_MODEL": "tiny-qwen2", "CP_BATCH_INTERVAL_S": "0.2"})
    sys.path.insert(0, str(ROOT))
    from tests.e2e.cpu_platform import adjust_cpu_platform

    adjust_cpu_platform(single_process_executor=True)
    asyncio.run(_run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
