"""The agent hook's own cost per engine step, in-process, on synthetic scheduler state.

Run: `.venv/bin/python benchmarks/agent_hook_micro.py` (`--smoke`: 200 steps per measurement, the same code
paths in a few seconds). The real `AgentRuntime` hooks (before_schedule,
after_schedule, after_update) run against a stand-in scheduler holding B running requests and a step
output with B scheduled requests, for B in 16, 64, 128, 256 and each mode, with the controller link
stopped. It isolates the hook from what shares the CPU with it inside a real engine (the worker
processes and the frontend on this 2-core machine), which benchmarks/agent_modes.py measures instead.
Prints the median µs per step, the fitted µs per scheduled request, and the goal 5 µs + 0.1 µs/request.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.config import AgentConfig
from agents.vllm.runtime import AgentRuntime
from controlplane.api.v1 import common_pb2

STEPS = 20_000
SMOKE_STEPS = 200


class _Request:
    __slots__ = ("is_prefill_chunk", "next_decode_eligible_step", "num_computed_tokens", "num_output_tokens",
                 "num_prompt_tokens", "request_id")

    def __init__(self, request_id: str = "prefill") -> None:
        self.request_id = request_id
        self.is_prefill_chunk = False
        self.next_decode_eligible_step = 0
        self.num_prompt_tokens = 300
        self.num_computed_tokens = 400
        self.num_output_tokens = 100


class _BlockPool:
    num_gpu_blocks = 8192

    def get_num_free_blocks(self) -> int:
        return 4000


def _scheduler(batch: int) -> types.SimpleNamespace:
    model_config = types.SimpleNamespace(max_model_len=1024, served_model_name="m", model="m")
    return types.SimpleNamespace(
        max_num_scheduled_tokens=4096, max_num_running_reqs=512, block_size=128,
        kv_cache_manager=types.SimpleNamespace(block_pool=_BlockPool()),
        vllm_config=types.SimpleNamespace(model_config=model_config),
        running=[_Request() for _ in range(batch)], waiting=collections.deque(range(50)),
        _inflight_prefills={_Request()}, current_step=0, max_num_active_reqs=512, prefill_capacity_bound=False,
        requests={})


def _measure(runtime: AgentRuntime, scheduler: types.SimpleNamespace, output: types.SimpleNamespace,
             steps: int = STEPS) -> float:
    samples = []
    for _ in range(steps):
        started = time.perf_counter()
        runtime.before_schedule(scheduler)
        runtime.after_schedule(scheduler, output)
        runtime.after_update(output)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_STEPS} steps per measurement: fast")
    steps = SMOKE_STEPS if parser.parse_args().smoke else STEPS
    config = AgentConfig(controller_address="127.0.0.1:9", engine_id="micro", pool_model="m", pool_accelerator="cpu",
                         batch_interval_s=3600)
    modes = {"passthrough": common_pb2.MODE_PASSTHROUGH, "mb": common_pb2.MODE_MB, "eb": common_pb2.MODE_EB}
    batches = (16, 64, 128, 256)
    print(f"{'mode':<12}" + "".join(f"{f'B={b} µs':>12}" for b in batches) + f"{'µs/request':>12}{'fixed µs':>10}"
          f"{'goal@256':>10}")
    for name, mode in modes.items():
        medians = []
        for batch in batches:
            scheduler = _scheduler(batch)
            runtime = AgentRuntime(scheduler, config)
            runtime.link.stop(timeout_s=0.5)
            runtime.enforcer.apply(common_pb2.Decision(
                version=1, mode=mode, k=8, n=512, ttl_s=1e9,
                budget=common_pb2.BudgetPolicy(b_max_tokens=4096, b_cap_tokens=2048, n_th=2)), now_s=time.monotonic())
            output = types.SimpleNamespace(num_scheduled_tokens={str(i): 1 for i in range(batch)},
                                           total_num_scheduled_tokens=batch + 500, preempted_req_ids=set(),
                                           scheduled_new_reqs=[],
                                           scheduled_cached_reqs=types.SimpleNamespace(resumed_req_ids=set()))
            medians.append(_measure(runtime, scheduler, output, steps))
        slope, intercept = np.polyfit(batches, medians, 1)
        print(f"{name:<12}" + "".join(f"{m:>12.2f}" for m in medians) + f"{slope:>12.4f}{intercept:>10.2f}"
              f"{5 + 0.1 * 256:>10.1f}")


if __name__ == "__main__":
    main()
