"""Two adjustments of vLLM's CPU platform for the e2e engines, applied before the engine is built.

- `async_scheduling`: the CPU platform turns async scheduling off; tests of the async path turn it back on.
- `single_process_executor`: the CPU platform replaces the single-process executor with the multiprocess one
  (one worker process, for its OpenMP thread binding) unless V1 multiprocessing is off altogether. Kept
  single-process, the model runs in EngineCore's own process (each data-parallel rank's likewise): one Python
  process fewer to start and to stop (each imports torch and vLLM), about 12 s less per engine here, while
  EngineCore, where the agent runs, keeps its process of its own. The scheduler and the agent above it are the same
  with either executor. The OpenAI server of `openai_server.py` runs this way too. Benchmarks that measure step
  times keep vLLM's default. The model then computes with the threads the worker would have had: vLLM binds the
  worker to every core but one (one thread on 2 cores), so OMP_NUM_THREADS is set to that before torch is imported
  here or in EngineCore's process (which inherits it). Left at two threads, one run of `test_agent_compat.py` saw an
  EB logprob 0.058 from stock's (its tolerance is 0.02, bf16 rounding across batch layouts); with one thread, as
  the worker computes, it passed.
  With it, EngineCore's process is forked from the front end (`VLLM_WORKER_MULTIPROC_METHOD=fork`, vLLM's default
  off the CPU platform, which forces spawn for its worker's thread binding): the process starts with torch and
  vLLM already imported, about 20 s less per engine start here (48 → 26 s for one request, both on a loaded
  machine). The OpenAI servers of `openai_server.py` keep the platform's spawn, so that path stays tested.
"""

from __future__ import annotations

import os


def single_process_threads() -> int:
    """The OpenMP threads of the model under the single-process executor: the worker's binding, every core but one."""
    return max(1, (os.cpu_count() or 2) - 1)


def adjust_cpu_platform(*, async_scheduling: bool = False, single_process_executor: bool = False) -> None:
    """Patch `CpuPlatform.check_and_update_config` to apply the adjustments asked for (nothing when none is)."""
    if not (async_scheduling or single_process_executor):
        return
    if single_process_executor:
        os.environ["OMP_NUM_THREADS"] = str(single_process_threads())
    from vllm.platforms.cpu import CpuPlatform

    original = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        if async_scheduling:
            vllm_config.scheduler_config.async_scheduling = True
        parallel = vllm_config.parallel_config
        if single_process_executor and parallel.world_size == 1:
            parallel.distributed_executor_backend = "uni"
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"  # the platform has just set spawn

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
